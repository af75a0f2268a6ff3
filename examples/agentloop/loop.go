package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/workspace"
)

// demoDir is where the task works, relative to the workspace root.
const demoDir = "agentloop-demo"

// git runs git without depending on the machine's git configuration.
const git = "git -c user.name=agentloop -c user.email=agentloop@berth -c init.defaultBranch=main "

// runTask is a scripted "agent": it writes a program and its test, runs the
// test, commits, changes the program, runs the test again and reads the git
// changes and diff. It only uses the Workspace interface, so it cannot know
// whether it runs on the host or in a sandbox, and prints the same report
// for both.
func runTask(ctx context.Context, ws workspace.Workspace, out io.Writer) error {
	step := func(format string, args ...any) { fmt.Fprintf(out, "== "+format+"\n", args...) }
	sh := func(line string) (workspace.Result, error) {
		return ws.Exec(ctx, workspace.Command{Shell: line, Cwd: demoDir, Timeout: time.Minute})
	}
	write := func(name, content string) error {
		return ws.Upload(ctx, strings.NewReader(content), demoDir+"/"+name)
	}

	step("prepare %s", demoDir)
	if _, err := ws.Exec(ctx, workspace.Command{Argv: []string{"sh", "-c", "rm -rf " + demoDir + " && mkdir " + demoDir}}); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	step("write greet.sh and test.sh")
	if err := write("greet.sh", "#!/bin/sh\necho \"hello, $1\"\n"); err != nil {
		return err
	}
	if err := write("test.sh", "out=$(sh greet.sh berth)\n[ \"$out\" = \"hello, berth\" ] && echo PASS || { echo \"FAIL: got '$out'\"; exit 1; }\n"); err != nil {
		return err
	}
	if err := runTest(sh, out); err != nil {
		return err
	}
	step("commit")
	res, err := sh(git + "init -q && " + git + "add . && " + git + "commit -q -m 'greet: first version'")
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("commit failed (%d): %s", res.ExitCode, res.Stderr)
	}
	step("change greet.sh")
	if err := write("greet.sh", "#!/bin/sh\necho \"hello, $1!\"\n"); err != nil {
		return err
	}
	if err := write("NOTES", "greeting now ends with an exclamation mark\n"); err != nil {
		return err
	}
	if err := runTest(sh, out); err != nil {
		return err
	}
	step("git changes")
	changes, err := ws.GitChanges(ctx, demoDir)
	if err != nil {
		return err
	}
	for _, c := range changes {
		fmt.Fprintf(out, "%s %s\n", c.Kind, c.Path)
	}
	step("git diff greet.sh")
	d, err := ws.GitDiff(ctx, demoDir, "greet.sh")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "original: %q\nmodified: %q\n", d.Original, d.Modified)
	step("download greet.sh")
	var buf bytes.Buffer
	if err := ws.Download(ctx, demoDir+"/greet.sh", &buf); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d bytes, matches: %v\n", buf.Len(), buf.String() == d.Modified)
	return nil
}

func runTest(sh func(string) (workspace.Result, error), out io.Writer) error {
	res, err := sh("sh test.sh")
	if err != nil {
		return fmt.Errorf("run test: %w", err)
	}
	fmt.Fprintf(out, "== run test.sh: exit %d\n%s", res.ExitCode, res.Stdout)
	return nil
}
