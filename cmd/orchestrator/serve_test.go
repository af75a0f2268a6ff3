package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/berth-dev/berth/cmd/orchestrator/internal/cli"
)

// TestServeConfigErrors checks that every source reaches serve's
// configuration and that a mistake in one exits 2 naming it, before any
// engine is contacted.
func TestServeConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"flag", nil, []string{"serve", "--runtime", "podman"}, `runtime "podman" is not supported`},
		{"single-dash flag", nil, []string{"serve", "-listen", "127.0.0.1:1", "-runtime", "podman"}, `runtime "podman" is not supported`},
		{"env", map[string]string{"BERTH_MAX_PIDS": "x"}, []string{"serve"}, `BERTH_MAX_PIDS: "x" is not an integer`},
		{"file", map[string]string{"BERTH_CONFIG": "/nonexistent/berth.json"}, []string{"serve"}, "config file:"},
		{"argument", nil, []string{"serve", "extra"}, `unexpected arguments ["extra"]`},
		{"bad value", nil, []string{"serve", "--max-memory-bytes", "lots"}, `"lots" is not a size`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("BERTH_DATA_DIR", t.TempDir())
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			env := cli.Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
			code := cli.Execute(context.Background(), cli.NewRoot(env, newServeCommand()), c.args, env)
			if code != 2 || !strings.Contains(errb.String(), c.want) {
				t.Errorf("exit %d (want 2), stderr %q (want %q)", code, errb.String(), c.want)
			}
		})
	}
}

// TestServeHelp checks that --help lists the flags by group with their
// defaults, and the secrets without a flag.
func TestServeHelp(t *testing.T) {
	var out, errb bytes.Buffer
	env := cli.Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	if code := cli.Execute(context.Background(), cli.NewRoot(env, newServeCommand()), []string{"serve", "--help"}, env); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"Server flags:", "Runtime flags:", "Leases flags:", "Sandbox resources flags:",
		"--max-ttl duration", "(default 24h)", "--default-memory-bytes bytes", "(default 512Mi)", "BERTH_OPERATOR_TOKEN"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
}
