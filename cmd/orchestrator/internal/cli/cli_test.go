package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

func runCLI(t *testing.T, s *orchtest.Server, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(context.Background(), append([]string{"lease"}, args...), operatorEnv(s, &out, &errb))
	return code, out.String(), errb.String()
}

// operatorEnv points the CLI at s with the operator's token.
func operatorEnv(s *orchtest.Server, stdout, stderr io.Writer) Env {
	return Env{Stdout: stdout, Stderr: stderr, Getenv: func(k string) string {
		switch k {
		case "BERTH_ADDR":
			return s.Base
		case "BERTH_OPERATOR_TOKEN":
			return orchtest.OperatorToken
		}
		return ""
	}}
}

func TestLeaseCommands(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "c-cli", "--label", "team=x", "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	var acq struct {
		Lease struct{ ID, State string } `json:"lease"`
		Token string
	}
	if err := json.Unmarshal([]byte(out), &acq); err != nil || acq.Lease.ID == "" || acq.Token == "" || acq.Lease.State != "LEASE_STATE_READY" {
		t.Fatalf("acquire json %q: %v", out, err)
	}
	id := acq.Lease.ID

	code, out, _ = runCLI(t, s, "get", id, "-o", "json") // flags after the id
	var got struct{ ID string }
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.ID != id {
		t.Errorf("get ID -o json: %d %q", code, out)
	}
	if code, _, errs := runCLI(t, s, "get", id, "extra"); code != 2 || !strings.Contains(errs, "exactly one lease id") {
		t.Errorf("get with two ids: %d %q", code, errs)
	}
	code, out, _ = runCLI(t, s, "get", id)
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "READY") || !strings.HasPrefix(out, "ID") {
		t.Errorf("get table: %d %q", code, out)
	}
	code, out, _ = runCLI(t, s, "list", "--selector", "team=x")
	if code != 0 || !strings.Contains(out, id) {
		t.Errorf("list: %d %q", code, out)
	}
	code, out, _ = runCLI(t, s, "list", "--selector", "team=y")
	if code != 0 || strings.Contains(out, id) {
		t.Errorf("list other selector: %d %q", code, out)
	}
	if code, _, errs = runCLI(t, s, "renew", "--ttl", "20m", id); code != 0 {
		t.Errorf("renew: %d %s", code, errs)
	}
	code, out, _ = runCLI(t, s, "release", "-o", "json", id)
	if code != 0 || !strings.Contains(out, "LEASE_STATE_RELEASED") {
		t.Errorf("release: %d %q", code, out)
	}
	code, out, errs = runCLI(t, s, "get", "nonexistent")
	if code != 1 || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, "(not found)") {
		t.Errorf("get nonexistent: code %d stdout %q stderr %q", code, out, errs)
	}
	code, _, errs = runCLI(t, s, "list", "--state", "bogus")
	if code == 0 || !strings.Contains(errs, "--state") {
		t.Errorf("bad state: %d %q", code, errs)
	}
	code, _, errs = runCLI(t, s, "frobnicate")
	if code != 2 || !strings.Contains(errs, "unknown command") {
		t.Errorf("unknown subcommand: %d %q", code, errs)
	}
}

// runTool runs one of the sandbox commands (exec, cp, git) with the lease
// token and stdin.
func runTool(t *testing.T, s *orchtest.Server, tok string, f tool, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := Env{Stdin: strings.NewReader(f.stdin), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		switch k {
		case "BERTH_ADDR":
			return s.Base
		case "BERTH_TOKEN":
			return tok
		}
		return ""
	}}
	code := Run(context.Background(), append([]string{f.name}, args...), env)
	return code, out.String(), errb.String()
}

// tool is a sandbox command and the stdin it reads.
type tool struct{ name, stdin string }

func TestExecCpGit(t *testing.T) {
	s := orchtest.Start(t, nil)
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "tools", "-o", "json")
	var acq struct {
		Lease struct{ ID string } `json:"lease"`
		Token string
	}
	if err := json.Unmarshal([]byte(out), &acq); err != nil {
		t.Fatal(err)
	}
	id, tok := acq.Lease.ID, acq.Token
	exec := tool{"exec", "piped\n"}

	code, out, errs := runTool(t, s, tok, exec, id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if code != 7 || out != "out\n" || errs != "err\n" {
		t.Errorf("exec: code %d out %q err %q", code, out, errs)
	}
	code, out, _ = runTool(t, s, tok, exec, "--stdin", id, "--", "cat")
	if code != 0 || out != "piped\n" {
		t.Errorf("exec --stdin: %d %q", code, out)
	}
	code, _, errs = runTool(t, s, "wrong", exec, id, "--", "true")
	if code != ExitExecFailed || !strings.Contains(errs, "(unauthenticated)") {
		t.Errorf("exec with a wrong token: %d %q", code, errs)
	}

	// Find the sandbox's workspace, then copy a file in and out.
	_, root, _ := runTool(t, s, tok, exec, id, "--", "pwd")
	root = strings.TrimSpace(root)
	local := t.TempDir() + "/in.txt"
	if err := os.WriteFile(local, []byte("hello cp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp := tool{"cp", "from stdin"}
	if code, _, errs := runTool(t, s, tok, cp, "--parents", local, id+":"+root+"/repo/a.txt"); code != 0 {
		t.Fatalf("cp up: %d %s", code, errs)
	}
	if code, _, errs := runTool(t, s, tok, cp, "-", id+":"+root+"/repo/b.txt"); code != 0 {
		t.Fatalf("cp stdin up: %d %s", code, errs)
	}
	code, out, _ = runTool(t, s, tok, cp, id+":"+root+"/repo/b.txt", "-")
	if code != 0 || out != "from stdin" {
		t.Errorf("cp down to stdout: %d %q", code, out)
	}
	back := t.TempDir() + "/back.txt"
	if code, _, errs := runTool(t, s, tok, cp, id+":"+root+"/repo/a.txt", back); code != 0 {
		t.Fatalf("cp down: %d %s", code, errs)
	}
	if b, _ := os.ReadFile(back); string(b) != "hello cp\n" {
		t.Errorf("downloaded %q", b)
	}
	if code, _, _ := runTool(t, s, tok, cp, id+":"+root+"/missing", t.TempDir()+"/x"); code == 0 {
		t.Error("cp of a missing file succeeded")
	}

	// git status and diff through the proxy.
	if code, _, errs := runTool(t, s, tok, exec, "--cwd", root+"/repo", id, "--", "sh", "-c",
		"git init -q -b main && git -c user.name=t -c user.email=t@t add . && git -c user.name=t -c user.email=t@t commit -qm init && echo changed > a.txt"); code != 0 {
		t.Fatalf("git setup: %d %s", code, errs)
	}
	git := tool{name: "git"}
	code, out, errs = runTool(t, s, tok, git, "status", id, root+"/repo")
	if code != 0 || !strings.Contains(out, "branch main") || !strings.Contains(out, "MODIFIED") || !strings.Contains(out, "a.txt") {
		t.Errorf("git status: %d %q %s", code, out, errs)
	}
	code, out, _ = runTool(t, s, tok, git, "diff", id, root+"/repo")
	if code != 0 || !strings.Contains(out, "+changed") {
		t.Errorf("git diff: %d %q", code, out)
	}
}
