package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

// runArgs runs the whole command line with no orchestrator behind it.
func runArgs(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		if k == "BERTH_ADDR" {
			return "http://127.0.0.1:1"
		}
		return ""
	}}
	code := Run(context.Background(), args, env)
	return code, out.String(), errb.String()
}

// --help works at every level, exits 0 and shows examples.
func TestHelpEverywhere(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"lease", "--help"}, {"lease", "acquire", "--help"}, {"lease", "acquire", "-help"}, {"help", "lease", "list"}} {
		code, out, errs := runArgs(args...)
		if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "Usage:") || errs != "" {
			t.Errorf("%v: exit %d, stderr %q, stdout:\n%s", args, code, errs, out)
		}
	}
	if _, out, _ := runArgs("lease", "acquire", "--help"); !strings.Contains(out, "--memory bytes") || !strings.Contains(out, "2Gi") {
		t.Errorf("acquire --help does not document quantities:\n%s", out)
	}
	// Every command has examples and answers --help.
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Parent().Name() == "completion" {
				continue
			}
			path := strings.Fields(sub.CommandPath())[1:]
			if sub.Example == "" {
				t.Errorf("%s has no Example", sub.CommandPath())
			}
			if code, out, _ := runArgs(append(path, "--help")...); code != 0 || !strings.Contains(out, "Examples:\n"+sub.Example) {
				t.Errorf("%s --help: exit %d\n%s", sub.CommandPath(), code, out)
			}
			walk(sub)
		}
	}
	walk(NewRoot(Env{}))
}

// Usage mistakes exit 2 with a one-line reason and a pointer to --help.
func TestUsageExitCodes(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"lease"},
		{"lease", "frobnicate"},
		{"lease", "list", "--frobnicate"},
		{"lease", "list", "-frobnicate"},
		{"lease", "list", "-o", "xml"},
		{"lease", "list", "--state", "bogus"},
		{"lease", "get"},
		{"lease", "acquire", "--memory", "lots"},
		{"lease", "acquire", "--cpus", "-1"},
		{"lease", "acquire", "extra-argument"},
		{"exec"},
		{"exec", "LEASE"},
		{"exec", "A", "B", "--", "true"},
		{"cp", "a"},
		{"cp", "a", "b"},
		{"git", "status"},
		{"exec", "--addr", "https://x", "L", "--", "true"},
	} {
		code, _, errs := runArgs(args...)
		if code != ExitUsage || !strings.Contains(errs, "--help") {
			t.Errorf("%v: exit %d (want 2), stderr %q", args, code, errs)
		}
	}
	// An unreachable orchestrator is an error (1), not a usage mistake.
	if code, _, errs := runArgs("lease", "list"); code != ExitFailure || strings.Contains(errs, "(Unknown)") || strings.Count(errs, "\n") != 1 {
		t.Errorf("unreachable: exit %d, stderr %q", code, errs)
	}
	if code, out, _ := runArgs("version"); code != 0 || strings.TrimSpace(out) == "" {
		t.Errorf("version: %d %q", code, out)
	}
	if code, out, _ := runArgs("--version"); code != 0 || strings.TrimSpace(out) == "" {
		t.Errorf("--version: %d %q", code, out)
	}
}

// Long flags with one dash, as Go's flag package took them, still work.
func TestSingleDashRewrite(t *testing.T) {
	root := NewRoot(Env{})
	for _, c := range []struct{ in, want string }{
		{"lease list -addr X -all -o json", "lease list --addr X --all -o json"},
		{"lease acquire -conversation=c -memory 2Gi -label a=b", "lease acquire --conversation=c --memory 2Gi --label a=b"},
		{"lease release ID -reason -all", "lease release ID --reason -all"},  // a value is left alone
		{"lease release ID --reason -all", "lease release ID --reason -all"}, // also after a -- flag
		{"lease get ID -w -o -addr", "lease get ID -w -o -addr"},             // -o takes -addr as its value
		{"exec -cwd /x -timeout 5s -stdin L -- sh -cwd", "exec --cwd /x --timeout 5s --stdin L -- sh -cwd"},
		{"cp -parents=false a L:/b", "cp --parents=false a L:/b"},
		{"git diff -file f -ref HEAD L", "git diff --file f --ref HEAD L"},
		{"lease list -help", "lease list --help"},
		{"lease list -frobnicate -", "lease list -frobnicate -"},
	} {
		if got := strings.Join(rewriteSingleDash(root, strings.Fields(c.in)), " "); got != c.want {
			t.Errorf("%q: got %q, want %q", c.in, got, c.want)
		}
	}
}

// The old single-dash spelling against a real orchestrator, and exec's
// flags.
func TestSingleDashEndToEnd(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "-conversation", "dash", "-label", "k=v", "-memory", "64Mi", "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	id, tok := acquired(t, out)
	code, out, errs = runTool(t, s, tok, tool{"exec", ""}, "-cwd", "/", "-timeout", "30s", id, "--", "pwd")
	if code != 0 || strings.TrimSpace(out) != "/" {
		t.Errorf("exec -cwd /: %d %q %s", code, out, errs)
	}
	code, out, errs = runCLI(t, s, "list", "-selector", "k=v", "-addr", s.Base)
	if code != 0 || !strings.Contains(out, id) {
		t.Errorf("list -selector -addr: %d %q %s", code, out, errs)
	}
}

// acquired decodes an acquire's -o json answer.
func acquired(t *testing.T, out string) (id, token string) {
	t.Helper()
	var acq struct {
		Lease struct{ ID string } `json:"lease"`
		Token string
	}
	if err := json.Unmarshal([]byte(out), &acq); err != nil || acq.Lease.ID == "" {
		t.Fatalf("acquire -o json %q: %v", out, err)
	}
	return acq.Lease.ID, acq.Token
}

// -o json, yaml and wide on acquire, get and list; human quantities on
// acquire reach the lease.
func TestOutputFormatsAndQuantities(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "fmt", "--memory", "512Mi", "--disk", "1Gi", "--cpus", "1.5", "--label", "team=x", "-o", "yaml")
	if code != 0 {
		t.Fatalf("acquire -o yaml: %d %s", code, errs)
	}
	var acq struct {
		Lease struct {
			ID        string
			Resources struct {
				Cpus        float64
				MemoryBytes string
				DiskBytes   string
			}
		}
		Token string
	}
	if err := yaml.Unmarshal([]byte(out), &acq); err != nil || acq.Lease.ID == "" || acq.Token == "" {
		t.Fatalf("acquire yaml %q: %v", out, err)
	}
	if r := acq.Lease.Resources; r.Cpus != 1.5 || r.MemoryBytes != "536870912" || r.DiskBytes != "1073741824" {
		t.Errorf("resources from 512Mi/1Gi/1.5: %+v", r)
	}
	id := acq.Lease.ID

	code, out, _ = runCLI(t, s, "get", id, "-o", "wide")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) < 2 || !strings.Contains(lines[0], "MEMORY") || !strings.Contains(lines[1], "512Mi") ||
		!strings.Contains(lines[1], "1Gi") || !strings.Contains(lines[1], "team=x") {
		t.Errorf("get -o wide: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, s, "get", id, "--output=json")
	var got struct{ ID, State string }
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.ID != id || got.State != "LEASE_STATE_READY" {
		t.Errorf("get --output=json: %d %q", code, out)
	}
	code, out, _ = runCLI(t, s, "list", "-o", "yaml")
	var list struct{ Leases []struct{ ID string } }
	if code != 0 || yaml.Unmarshal([]byte(out), &list) != nil || len(list.Leases) != 1 || list.Leases[0].ID != id {
		t.Errorf("list -o yaml: %d %q", code, out)
	}
	code, out, _ = runCLI(t, s, "list", "--o", "json") // the old long name of -o
	if code != 0 || !strings.HasPrefix(out, "{") {
		t.Errorf("list --o json: %d %q", code, out)
	}
	code, out, _ = runCLI(t, s, "list", "-o", "wide")
	if code != 0 || !strings.Contains(out, "LABELS") || !strings.Contains(out, id) {
		t.Errorf("list -o wide: %d %q", code, out)
	}
}

// Errors name their category in words.
func TestErrorCategoryInWords(t *testing.T) {
	s := orchtest.Start(t, nil)
	if code, _, errs := runCLI(t, s, "get", "nonexistent"); code != 1 || !strings.HasSuffix(errs, "(not found)\n") {
		t.Errorf("get nonexistent: %d %q", code, errs)
	}
	if code, _, errs := runCLI(t, s, "acquire"); code != 1 || !strings.Contains(errs, "(invalid argument)") {
		t.Errorf("acquire without a conversation: %d %q", code, errs)
	}
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "words", "-o", "json")
	id, tok := acquired(t, out)
	if code, _, errs := runTool(t, s, tok, tool{name: "cp"}, filepath.Join(t.TempDir(), "missing"), id+":/tmp/x"); code != 1 ||
		!strings.HasSuffix(errs, "(not found)\n") || strings.Contains(errs, "Unknown") {
		t.Errorf("cp of a missing local file: %d %q", code, errs)
	}
}

// completion bash writes a script bash accepts; zsh and fish write one.
func TestCompletion(t *testing.T) {
	code, out, errs := runArgs("completion", "bash")
	if code != 0 || !strings.Contains(out, "orchestrator") {
		t.Fatalf("completion bash: %d %s", code, errs)
	}
	script := filepath.Join(t.TempDir(), "orchestrator.bash")
	if err := os.WriteFile(script, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		testenv.SkipOrFail(t, "no bash to check the completion script with")
	}
	if b, err := exec.Command(bash, "-n", script).CombinedOutput(); err != nil {
		t.Errorf("bash -n rejects the completion script: %v\n%s", err, b)
	}
	for _, sh := range []string{"zsh", "fish"} {
		if code, out, _ := runArgs("completion", sh); code != 0 || !strings.Contains(out, "orchestrator") {
			t.Errorf("completion %s: %d", sh, code)
		}
	}
	// The shell asks the binary for candidates: subcommands and flags.
	if _, out, _ := runArgs("__complete", "lease", "l"); !strings.Contains(out, "list") {
		t.Errorf("__complete lease l: %q", out)
	}
	if _, out, _ := runArgs("__complete", "lease", "acquire", "--mem"); !strings.Contains(out, "--memory") {
		t.Errorf("__complete lease acquire --mem: %q", out)
	}
}

// list --watch prints the current leases, then each change; get --watch
// follows one lease; an interrupted watch exits 0.
func TestListWatch(t *testing.T) {
	s := orchtest.Start(t, nil)
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "before", "--label", "w=1", "-o", "json")
	first, _ := acquired(t, out)

	watch := func(args ...string) (*testenv.SyncBuffer, func() int) {
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr testenv.SyncBuffer
		done := make(chan int, 1)
		go func() { done <- Run(ctx, args, operatorEnv(s, &stdout, &stderr)) }()
		return &stdout, func() int {
			cancel()
			select {
			case code := <-done:
				if stderr.String() != "" {
					t.Errorf("%v: stderr %q", args, stderr.String())
				}
				return code
			case <-time.After(10 * time.Second):
				t.Fatalf("%v did not end when interrupted", args)
				return -1
			}
		}
	}
	waitFor := func(b *testenv.SyncBuffer, what ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if got := b.String(); !slices.ContainsFunc(what, func(w string) bool { return !strings.Contains(got, w) }) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("watch output lacks %q:\n%s", what, b.String())
	}

	table, stopTable := watch("lease", "list", "--watch", "--selector", "w=1")
	waitFor(table, "ID", first, "READY")
	jsonl, stopJSON := watch("lease", "list", "-w", "-o", "json")
	waitFor(jsonl, first)
	one, stopOne := watch("lease", "get", first, "-w")
	waitFor(one, first)

	_, out, _ = runCLI(t, s, "acquire", "--conversation", "after", "--label", "w=1", "-o", "json")
	second, _ := acquired(t, out)
	_, out, _ = runCLI(t, s, "acquire", "--conversation", "other", "-o", "json")
	other, _ := acquired(t, out)
	if code, _, errs := runCLI(t, s, "release", first); code != 0 {
		t.Fatalf("release: %s", errs)
	}
	waitFor(table, second, "RELEASED")
	waitFor(jsonl, second, other, `"LEASE_STATE_RELEASED"`)
	waitFor(one, "RELEASED")

	if code := stopTable(); code != 0 {
		t.Errorf("interrupted list --watch exits %d", code)
	}
	if strings.Contains(table.String(), other) {
		t.Errorf("list --watch --selector w=1 shows a lease without the label:\n%s", table.String())
	}
	if strings.Count(table.String(), "ID ") != 1 {
		t.Errorf("the header is printed once:\n%s", table.String())
	}
	stopJSON()
	for _, line := range strings.Split(strings.TrimSpace(jsonl.String()), "\n") {
		var l struct{ ID string }
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.ID == "" {
			t.Errorf("list -w -o json line %q: %v", line, err)
		}
	}
	stopOne()
	if strings.Contains(one.String(), second) {
		t.Errorf("get --watch shows another lease:\n%s", one.String())
	}
}

// Commands added to the root (serve) get the single-dash compatibility and
// their exit codes too.
func TestExtraCommand(t *testing.T) {
	var listen string
	var verbose bool
	serve := &cobra.Command{Use: "serve", Example: "  orchestrator serve", RunE: func(*cobra.Command, []string) error {
		if listen == "fail" {
			return ExitError(3)
		}
		return nil
	}}
	serve.Flags().StringVar(&listen, "listen", "", "")
	serve.Flags().BoolVar(&verbose, "verbose", false, "")
	var out, errb bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errb}
	if code := Execute(context.Background(), NewRoot(env, serve), []string{"serve", "-listen", "127.0.0.1:9", "-verbose"}, env); code != 0 || listen != "127.0.0.1:9" || !verbose {
		t.Errorf("serve -listen X -verbose: exit %d, listen %q, verbose %v, stderr %q", code, listen, verbose, errb.String())
	}
	if code := Execute(context.Background(), NewRoot(env, serve), []string{"serve", "-listen=fail"}, env); code != 3 {
		t.Errorf("an ExitError from serve: exit %d", code)
	}
}
