package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// execRun runs `orchestrator exec ARGS` against s with token tok, stdin,
// and local holding this process's environment (beside BERTH_ADDR and
// BERTH_TOKEN).
func execRun(t *testing.T, s *orchtest.Server, tok, stdin string, local map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	lookup := func(k string) (string, bool) {
		switch k {
		case "BERTH_ADDR":
			return s.Base, true
		case "BERTH_TOKEN":
			return tok, true
		}
		v, ok := local[k]
		return v, ok
	}
	env := Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb, LookupEnv: lookup,
		Getenv: func(k string) string { v, _ := lookup(k); return v }}
	code := Run(context.Background(), append([]string{"exec"}, args...), env)
	return code, out.String(), errb.String()
}

// exec's exit codes against real agents: the command's own, 127 for a
// command not found, 126 for one that cannot be executed, 124 for a
// --timeout, 125 when exec itself fails (unknown lease, refused token,
// unreachable orchestrator, missing working directory), 2 for usage.
func TestExecExitCodes(t *testing.T) {
	s := orchtest.Start(t, nil)
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "exec-codes", "-o", "json")
	id, tok := acquired(t, out)
	run := func(args ...string) (int, string, string) {
		t.Helper()
		return execRun(t, s, tok, "", nil, args...)
	}
	_, root, _ := run(id, "--", "pwd")
	root = strings.TrimSpace(root)
	if code, _, errs := run("-w", root, id, "--", "sh", "-c", `printf '#!/bin/sh\necho hi\n' > noexec.sh && chmod 644 noexec.sh && mkdir -p adir`); code != 0 {
		t.Fatalf("setup: %d %s", code, errs)
	}

	oneLine := func(errs string) bool {
		return strings.Count(errs, "\n") == 1 && strings.HasPrefix(errs, "orchestrator: ")
	}
	for _, c := range []struct {
		name  string
		args  []string
		code  int
		inErr string
	}{
		{"own code", []string{id, "--", "sh", "-c", "exit 3"}, 3, ""},
		{"not found", []string{id, "--", "no-such-program-xyz"}, ExitNotFound, "no-such-program-xyz"},
		{"not found by path", []string{"-w", root, id, "--", "./missing.sh"}, ExitNotFound, "missing.sh"},
		{"not executable", []string{"-w", root, id, "--", "./noexec.sh"}, ExitCannotExecute, "noexec.sh"},
		{"a directory", []string{"-w", root, id, "--", "./adir"}, ExitCannotExecute, "adir"},
		{"--sh not found", []string{"--sh", id, "--", "no-such-program-xyz"}, ExitNotFound, "no-such-program-xyz"}, // sh's own 127
		{"missing workdir", []string{"-w", "/no/such/dir", id, "--", "true"}, ExitExecFailed, "(failed precondition)"},
		{"unknown lease", []string{"no-such-lease", "--", "true"}, ExitExecFailed, ""},
	} {
		code, _, errs := run(c.args...)
		t.Logf("%s: exit %d, stderr %q", c.name, code, errs)
		if code != c.code || !strings.Contains(errs, c.inErr) {
			t.Errorf("%s: exit %d, stderr %q; want %d naming %q", c.name, code, errs, c.code, c.inErr)
		}
		if code >= ExitExecFailed && code <= ExitNotFound && c.name != "--sh not found" && (!oneLine(errs) || strings.Contains(errs, "Unknown")) {
			t.Errorf("%s: stderr %q, want one orchestrator: line", c.name, errs)
		}
	}

	// An unknown lease with the operator's token is "not found".
	code, _, errs := execRun(t, s, orchtest.OperatorToken, "", nil, "no-such-lease", "--", "true")
	if code != ExitExecFailed || !strings.Contains(errs, "(not found)") || !oneLine(errs) {
		t.Errorf("unknown lease (operator): exit %d, stderr %q", code, errs)
	}
	// After a release, the lease's token no longer opens its sandbox.
	if code, _, errs := runCLI(t, s, "release", id); code != 0 {
		t.Fatalf("release: %s", errs)
	}
	if code, _, errs := run(id, "--", "true"); code != ExitExecFailed || !oneLine(errs) {
		t.Errorf("released lease: exit %d, stderr %q", code, errs)
	}
	// An orchestrator that cannot be reached.
	if code, _, errs := runArgs("exec", "L", "--", "true"); code != ExitExecFailed || !oneLine(errs) || !strings.Contains(errs, "(unavailable)") {
		t.Errorf("unreachable orchestrator: exit %d, stderr %q", code, errs)
	}
}

// --timeout exits 124 as GNU timeout does, and says so on stderr.
func TestExecTimeout(t *testing.T) {
	s := orchtest.Start(t, nil)
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "exec-timeout", "-o", "json")
	id, tok := acquired(t, out)
	start := time.Now()
	code, _, errs := execRun(t, s, tok, "", nil, "--timeout", "1s", id, "--", "sleep", "30")
	if code != ExitTimedOut || !strings.Contains(errs, "timed out after 1s") {
		t.Errorf("--timeout 1s -- sleep 30: exit %d, stderr %q", code, errs)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("--timeout 1s took %s", d)
	}
}

// -e, --env-file, -w/--workdir/--cwd, -u and -i/--stdin reach the command;
// -t runs it on a terminal.
func TestExecFlags(t *testing.T) {
	s := orchtest.Start(t, nil)
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "exec-flags", "-o", "json")
	id, tok := acquired(t, out)
	local := map[string]string{"FROM_LOCAL": "local value", "EMPTY_LOCAL": ""}

	envFile := filepath.Join(t.TempDir(), "ci.env")
	if err := os.WriteFile(envFile, []byte("\ufeff# a comment\n\nFILE_A=from file\n  FILE_B=b=c \nFROM_LOCAL\nNOT_SET_LOCALLY\nOVERRIDDEN=file\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := execRun(t, s, tok, "", local, "--env-file", envFile, "-e", "OVERRIDDEN=flag", "-e", "E1=one=1", "-e", "EMPTY_LOCAL",
		"-e", "NOT_SET_LOCALLY", id, "--", "sh", "-c",
		`echo "a=$FILE_A|b=$FILE_B|l=$FROM_LOCAL|o=$OVERRIDDEN|e1=$E1|empty=${EMPTY_LOCAL-unset}|ns=${NOT_SET_LOCALLY-unset}"`)
	want := "a=from file|b=b=c |l=local value|o=flag|e1=one=1|empty=|ns=unset\n"
	if code != 0 || out != want {
		t.Errorf("-e/--env-file: exit %d, stdout %q (want %q), stderr %q", code, out, want, errs)
	}

	for _, flag := range []string{"-w", "--workdir", "--cwd", "-cwd", "-workdir"} {
		if code, out, errs := execRun(t, s, tok, "", nil, flag, "/tmp", id, "--", "pwd"); code != 0 || out != "/tmp\n" {
			t.Errorf("%s /tmp: exit %d, stdout %q, stderr %q", flag, code, out, errs)
		}
	}

	// -u: the in-process agent can switch users only when it runs as root.
	code, out, errs = execRun(t, s, tok, "", nil, "-u", "65534", "-w", "/", id, "--", "id", "-u")
	if os.Geteuid() == 0 {
		if code != 0 || out != "65534\n" {
			t.Errorf("-u 65534: exit %d, stdout %q, stderr %q", code, out, errs)
		}
		if code, out, _ := execRun(t, s, tok, "", nil, "--user", "0", "-w", "/", id, "--", "id", "-u"); code != 0 || out != "0\n" {
			t.Errorf("--user 0: exit %d, stdout %q", code, out)
		}
	} else if code != ExitExecFailed || !strings.Contains(errs, "user") {
		t.Errorf("-u without a root agent: exit %d, stderr %q (want 125 naming the user)", code, errs)
	}
	if os.Geteuid() == 0 {
		if code, _, errs := execRun(t, s, tok, "", nil, "-u", "no-such-user", id, "--", "true"); code != ExitExecFailed || !strings.Contains(errs, "no-such-user") {
			t.Errorf("-u no-such-user: exit %d, stderr %q", code, errs)
		}
	}

	for _, flag := range []string{"-i", "--interactive", "--stdin"} {
		if code, out, errs := execRun(t, s, tok, "piped\nlines\n", nil, flag, id, "--", "cat"); code != 0 || out != "piped\nlines\n" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", flag, code, out, errs)
		}
	}
	if code, out, _ := execRun(t, s, tok, "not sent\n", nil, id, "--", "cat"); code != 0 || out != "" {
		t.Errorf("without -i stdin is sent: exit %d, stdout %q", code, out)
	}

	// -t: a terminal in the sandbox, the exit code passed through; without
	// -i nothing is typed; -it types stdin.
	code, out, errs = execRun(t, s, tok, "ignored\n", map[string]string{"TERM": "vt100"}, "-t", "-e", "X=y", "-w", "/tmp", id, "--", "sh", "-c",
		`test -t 0 && test -t 1 && echo "tty $X $(pwd) $TERM"; exit 3`)
	if code != 3 || !strings.Contains(out, "tty y /tmp vt100") {
		t.Errorf("-t: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = execRun(t, s, tok, "typed\n", nil, "-it", id, "--", "sh", "-c", `read x; echo "got=$x"`)
	if code != 0 || !strings.Contains(out, "got=typed") {
		t.Errorf("-it: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, _, errs := execRun(t, s, tok, "", nil, "-t", id, "--", "no-such-program-xyz"); code != ExitNotFound || !strings.Contains(errs, "no-such-program-xyz") {
		t.Errorf("-t not found: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := execRun(t, s, "wrong", "", nil, "-t", id, "--", "true"); code != ExitExecFailed || !strings.Contains(errs, "(unauthenticated)") {
		t.Errorf("-t with a wrong token: exit %d, stderr %q", code, errs)
	}
}

// Malformed values of exec's flags are usage mistakes (2) naming the flag,
// found before anything runs.
func TestExecUsageMistakes(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.env")
	if err := os.WriteFile(bad, []byte("GOOD=1\nBAD NAME=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(dir, "binary.env")
	if err := os.WriteFile(binary, []byte("A=\xff\xfe\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args  []string
		inErr string
	}{
		{[]string{"-e", "=x", "L", "--", "true"}, `-e "=x"`},
		{[]string{"-e", "A B=x", "L", "--", "true"}, `-e "A B=x"`},
		{[]string{"--env-file", filepath.Join(dir, "missing.env"), "L", "--", "true"}, "--env-file"},
		{[]string{"--env-file", bad, "L", "--", "true"}, "line 2"},
		{[]string{"--env-file", binary, "L", "--", "true"}, "UTF-8"},
		{[]string{"-t", "--timeout", "1s", "L", "--", "true"}, "--timeout"},
		{[]string{"--timeout", "soon", "L", "--", "true"}, "--timeout"},
		{[]string{"-x", "L", "--", "true"}, "-x"},
	} {
		code, _, errs := runArgs(append([]string{"exec"}, c.args...)...)
		if code != ExitUsage || !strings.Contains(errs, c.inErr) || !strings.Contains(errs, "--help") {
			t.Errorf("exec %v: exit %d, stderr %q; want 2 naming %q", c.args, code, errs, c.inErr)
		}
	}
}

// exitStatus maps the agent's exit to a shell's code.
func TestExitStatus(t *testing.T) {
	for _, c := range []struct {
		e    *agentv1.Exited
		want int
	}{
		{&agentv1.Exited{ExitCode: 0}, 0},
		{&agentv1.Exited{ExitCode: 42}, 42},
		{&agentv1.Exited{ExitCode: -1, Signal: "SIGTERM", TimedOut: true}, ExitTimedOut},
		{&agentv1.Exited{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}, ExitTimedOut},
		{&agentv1.Exited{ExitCode: -1, Signal: "SIGKILL", OomKilled: true}, 137},
		{&agentv1.Exited{ExitCode: -1, Signal: "SIGINT"}, 130},
		{&agentv1.Exited{ExitCode: 1, Signal: "SIGTERM"}, 1}, // exited on its own after the signal
	} {
		if got := exitStatus(c.e); got != c.want {
			t.Errorf("exitStatus(%v) = %d, want %d", c.e, got, c.want)
		}
	}
}

// lease watch prints the live leases' last transitions first, then each
// transition as it happens; --changes-only only the latter.
func TestLeaseWatchShowsCurrentFirst(t *testing.T) {
	s := orchtest.Start(t, nil)
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "watch-before", "-o", "json")
	first, _ := acquired(t, out)

	start := func(args ...string) (*testenv.SyncBuffer, func()) {
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr testenv.SyncBuffer
		done := make(chan int, 1)
		go func() {
			done <- Run(ctx, append([]string{"lease", "watch"}, args...), operatorEnv(s, &stdout, &stderr))
		}()
		return &stdout, func() {
			cancel()
			select {
			case code := <-done:
				if code != 0 || stderr.String() != "" {
					t.Errorf("lease watch %v: exit %d, stderr %q", args, code, stderr.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("lease watch %v did not end when interrupted", args)
			}
		}
	}
	waitFor := func(b *testenv.SyncBuffer, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(b.String(), what) {
			if time.Now().After(deadline) {
				t.Fatalf("watch output lacks %q:\n%s", what, b.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	table, stopTable := start()
	waitFor(table, first+"\tPENDING -> READY") // nothing has changed yet
	jsonl, stopJSON := start("-o", "json")
	waitFor(jsonl, first)
	only, stopOnly := start("--changes-only")
	one, stopOne := start("--lease", first)
	waitFor(one, first)
	time.Sleep(200 * time.Millisecond) // let --changes-only subscribe

	_, out, _ = runCLI(t, s, "acquire", "--conversation", "watch-after", "-o", "json")
	second, _ := acquired(t, out)
	waitFor(table, second+"\tPENDING -> READY")
	waitFor(only, second+"\tPENDING -> READY")
	waitFor(jsonl, second)
	if code, _, errs := runCLI(t, s, "release", first); code != 0 {
		t.Fatalf("release: %s", errs)
	}
	waitFor(one, "-> RELEASED")
	stopTable()
	stopJSON()
	stopOnly()
	stopOne()

	lines := strings.Split(strings.TrimSpace(table.String()), "\n")
	if len(lines) < 2 || !strings.Contains(lines[0], first) {
		t.Errorf("the current lease is not first:\n%s", table.String())
	}
	if strings.Contains(only.String(), first+"\tPENDING") {
		t.Errorf("--changes-only shows the lease that existed before:\n%s", only.String())
	}
	if strings.Contains(one.String(), second) {
		t.Errorf("--lease %s shows another lease:\n%s", first, one.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(jsonl.String()), "\n") {
		var ev orchv1.LeaseEvent
		if err := decodeJSONLine(line, &ev); err != nil || ev.GetLease().GetId() == "" || ev.GetTransition().GetTo() == orchv1.LeaseState_LEASE_STATE_UNSPECIFIED {
			t.Errorf("-o json line %q: %v", line, err)
		}
	}
}

// decodeJSONLine checks a line is one JSON object and decodes its lease
// and transition.
func decodeJSONLine(line string, ev *orchv1.LeaseEvent) error {
	var raw struct {
		Lease      struct{ ID string }
		Transition struct{ To string }
	}
	if err := json.Unmarshal([]byte(line), &raw); err != nil {
		return err
	}
	ev.Lease = &orchv1.Lease{Id: raw.Lease.ID}
	ev.Transition = &orchv1.Transition{To: orchv1.LeaseState(orchv1.LeaseState_value[raw.Transition.To])}
	return nil
}
