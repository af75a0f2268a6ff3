package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCLIExecLikeDockerExec drives `orchestrator exec` (the real binary)
// against a Docker sandbox as a CI script would after leaving docker exec:
// its flags (-e, --env-file, -w, -u, -i, -t) and its exit codes (127, 126,
// 124, 125, 130), beside docker exec's own codes for the same container.
func TestCLIExecLikeDockerExec(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	startProc(t, dir, addr)

	stdout, stderr, code := cliRun(t, addr, "lease", "acquire", "--conversation", "cli-exec-"+randHex(4), "--image", baseImage, "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: exit %d: %s", code, stderr)
	}
	var acq struct {
		Lease struct {
			ID          string `json:"id"`
			ContainerID string `json:"containerId"`
		} `json:"lease"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(stdout), &acq); err != nil || acq.Lease.ID == "" || acq.Token == "" {
		t.Fatalf("acquire -o json: %v\n%s", err, stdout)
	}
	id := acq.Lease.ID
	// run runs `orchestrator exec` with the lease's token, stdin and extra
	// environment.
	run := func(stdin string, env []string, args ...string) (string, string, int) {
		t.Helper()
		return cliExec(t, addr, acq.Token, stdin, env, args...)
	}

	if _, errs, code := run("", nil, "-w", "/workspace", id, "--", "sh", "-c", `printf '#!/bin/sh\necho hi\n' > noexec.sh && chmod 644 noexec.sh`); code != 0 {
		t.Fatalf("setup: exit %d: %s", code, errs)
	}

	// Exit codes.
	for _, c := range []struct {
		name string
		args []string
		code int
	}{
		{"own code", []string{id, "--", "sh", "-c", "exit 42"}, 42},
		{"not found", []string{id, "--", "no-such-program"}, 127},
		{"not executable", []string{"-w", "/workspace", id, "--", "./noexec.sh"}, 126},
		{"a directory", []string{id, "--", "/workspace"}, 126},
		{"unknown lease", []string{"no-such-lease", "--", "true"}, 125},
		{"usage", []string{"-e", "=x", id, "--", "true"}, 2},
	} {
		_, errs, code := run("", nil, c.args...)
		t.Logf("%s: exit %d: %s", c.name, code, strings.TrimSpace(errs))
		if code != c.code {
			t.Errorf("%s: exit %d, want %d (stderr %q)", c.name, code, c.code, errs)
		}
	}
	start := time.Now()
	if _, errs, code := run("", nil, "--timeout", "1s", id, "--", "sleep", "30"); code != 124 || !strings.Contains(errs, "timed out") {
		t.Errorf("--timeout 1s -- sleep 30: exit %d, stderr %q; want 124", code, errs)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("--timeout 1s took %s", d)
	}

	// docker exec gives the same 126 in the same container. (For a missing
	// command docker exec says 126 or 127 depending on the engine's
	// version; docker run and shells say 127.)
	if _, err := exec.LookPath("docker"); err == nil && acq.Lease.ContainerID != "" {
		err := exec.Command("docker", "exec", acq.Lease.ContainerID, "/workspace/noexec.sh").Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 126 {
			t.Errorf("docker exec of a non-executable file: %v; orchestrator exec exits 126", err)
		}
	}

	// Flags: -e (with a value and from this environment), --env-file, -w,
	// -u, -i.
	envFile := filepath.Join(t.TempDir(), "ci.env")
	if err := os.WriteFile(envFile, []byte("# CI settings\nFROM_FILE=file value\nLOCAL_TOO\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, code := run("", []string{"LOCAL_VAR=local value", "LOCAL_TOO=too"}, "-e", "A=1", "-e", "LOCAL_VAR", "--env-file", envFile,
		"-w", "/tmp", "-u", "root", id, "--", "sh", "-c", `echo "$A|$LOCAL_VAR|$FROM_FILE|$LOCAL_TOO|$(pwd)|$(id -u)"`)
	if want := "1|local value|file value|too|/tmp|0\n"; code != 0 || out != want {
		t.Errorf("-e -e --env-file -w -u root: exit %d, stdout %q (want %q), stderr %q", code, out, want, errs)
	}
	if out, errs, code := run("", nil, "--workdir", "/workspace", id, "--", "sh", "-c", "echo $(id -un) $(pwd)"); code != 0 || out != "sandbox /workspace\n" {
		t.Errorf("default user, --workdir: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out, errs, code := run("line one\nline two\n", nil, "-i", id, "--", "wc", "-l"); code != 0 || strings.TrimSpace(out) != "2" {
		t.Errorf("-i: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out, errs, code := run("", nil, "-t", id, "--", "sh", "-c", "test -t 1 && echo on a tty; exit 5"); code != 5 || !strings.Contains(out, "on a tty") {
		t.Errorf("-t: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	// Ctrl-C (SIGINT to the CLI) stops the command in the sandbox and exits
	// 130, as a shell does.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, orchBin, "exec", id, "--", "sleep", "300")
	cmd.Env = append(hermeticEnv(), "BERTH_ADDR=http://"+addr, "BERTH_TOKEN="+acq.Token)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !eventually(20*time.Second, 100*time.Millisecond, func() bool {
		_, _, code := run("", nil, id, "--", "pgrep", "-x", "sleep")
		return code == 0
	}) {
		t.Fatal("sleep 300 never ran in the sandbox")
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("exec interrupted by SIGINT: %v, want exit 130", err)
	}
	if !eventually(10*time.Second, 100*time.Millisecond, func() bool {
		_, _, code := run("", nil, id, "--", "pgrep", "-x", "sleep")
		return code == 1
	}) {
		t.Error("sleep 300 still runs in the sandbox after exec was interrupted")
	}

	if _, errs, code := cliRun(t, addr, "lease", "release", id); code != 0 {
		t.Errorf("release: %s", errs)
	}
}

// cliExec runs `orchestrator exec ARGS` with token, stdin and env added to
// the hermetic environment.
func cliExec(t *testing.T, addr, token, stdin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, orchBin, append([]string{"exec"}, args...)...)
	cmd.Env = append(append(hermeticEnv(), "BERTH_ADDR=http://"+addr, "BERTH_TOKEN="+token), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("orchestrator exec %s: %v", strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), 0
}
