package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/berth-dev/berth/cmd/orchestrator/internal/cli"
)

// The root carries serve: its help (with the old single-dash spelling)
// exits 0, a wrong flag 2.
func TestRootHasServe(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"serve", "--help"}, 0, "Usage:"},
		{[]string{"serve", "-help"}, 0, "Usage:"},
		{[]string{"--help"}, 0, "serve"},
		{[]string{"serve", "--frobnicate"}, 2, "unknown flag"},
	} {
		var out, errb bytes.Buffer
		env := cli.Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
		code := cli.Execute(context.Background(), cli.NewRoot(env, newServeCommand()), c.args, env)
		if code != c.code || !strings.Contains(out.String()+errb.String(), c.want) {
			t.Errorf("%v: exit %d (want %d)\nstdout %s\nstderr %s", c.args, code, c.code, out.String(), errb.String())
		}
	}
}
