// Package cli implements the orchestrator's operator and CI command line on
// cobra: `orchestrator lease acquire|get|list|renew|release|reap|watch`
// talking to a running orchestrator over gRPC, and `exec`, `cp` and `git`
// talking to a lease's sandbox through the orchestrator's proxy. Output is a
// human table by default, or -o wide|json|yaml. Exit codes: 0 success, 1 an
// error (a one-line message on stderr with its category in words), 2 a
// usage mistake (unknown command or flag, bad argument); exec exits with
// the command's own code, or 124 to 127 as docker exec, a shell and GNU
// timeout do (see ExitTimedOut and the following constants).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/internal/version"
)

// Exit codes of the command line.
const (
	// ExitOK is success.
	ExitOK = 0
	// ExitFailure is a failed operation (the server said no, the network failed).
	ExitFailure = 1
	// ExitUsage is a mistake in the command line.
	ExitUsage = 2
)

// Groups of the root's commands in its help.
const (
	groupDaemon  = "daemon"
	groupLeases  = "leases"
	groupSandbox = "sandbox"
	groupOther   = "other"
)

// Env is what a command needs from its surroundings.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// LookupEnv tells a variable set to "" from an unset one (exec -e
	// KEY); when nil, a variable is set when Getenv returns non-empty.
	LookupEnv func(string) (string, bool)
}

// getenv reads the environment, or nothing when Getenv is unset.
func (e Env) getenv(k string) string {
	if e.Getenv == nil {
		return ""
	}
	return e.Getenv(k)
}

// lookupEnv reads a variable and whether it is set.
func (e Env) lookupEnv(k string) (string, bool) {
	if e.LookupEnv != nil {
		return e.LookupEnv(k)
	}
	v := e.getenv(k)
	return v, v != ""
}

// NewRoot returns the `orchestrator` command with the client commands
// (lease, exec, cp, git, version, completion) and extra, e.g. serve.
func NewRoot(env Env, extra ...*cobra.Command) *cobra.Command {
	root := &cobra.Command{
		Use:   "orchestrator",
		Short: "berth: disposable sandboxes for agents, leased over an API",
		Long: `orchestrator is berth's daemon (serve) and its operator and CI command line.

Client commands talk to a running orchestrator: --addr (env BERTH_ADDR,
default ` + DefaultAddr + `) and --token (env BERTH_TOKEN, else
BERTH_OPERATOR_TOKEN).

Exit codes: 0 success, 1 error, 2 usage mistake; exec and shell exit with
the program's own code (124 timed out, 125 exec failed, 126 cannot
execute, 127 not found).`,
		Example: `  orchestrator serve --listen 127.0.0.1:7070
  orchestrator lease acquire --conversation ci-42 --memory 2Gi -o json
  orchestrator exec LEASE -- make test
  orchestrator shell LEASE
  orchestrator cp ./report.txt LEASE:/workspace/report.txt
  orchestrator completion bash > /etc/bash_completion.d/orchestrator`,
		Version:       version.Version,
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE:          groupRun,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	// Commands that only group others are runnable (to answer an unknown
	// subcommand with exit code 2), but their usage shows no "[flags]" line.
	root.SetUsageTemplate(strings.Replace(root.UsageTemplate(), "{{if .Runnable}}", "{{if and .Runnable (not .HasAvailableSubCommands)}}", 1))
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	root.AddGroup(&cobra.Group{ID: groupDaemon, Title: "Daemon:"}, &cobra.Group{ID: groupLeases, Title: "Leases:"},
		&cobra.Group{ID: groupSandbox, Title: "Working in a sandbox:"}, &cobra.Group{ID: groupOther, Title: "Other commands:"})
	root.SetHelpCommandGroupID(groupOther)
	root.SetCompletionCommandGroupID(groupOther)
	for _, c := range extra {
		if c.GroupID == "" {
			c.GroupID = groupDaemon
		}
	}
	root.AddCommand(extra...)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add(groupDaemon, newDrainCommand(env)) // drain.go
	add(groupLeases, newSnapshotCommand(env))
	add(groupLeases, newVolumeCommand(env)) // volume.go
	add(groupLeases, newLeaseCommand(env))
	add(groupLeases, newLogsCommand(env))
	add(groupSandbox, newExecCommand(env), newShellCommand(env), newCpCommand(env), newGitCommand(env))
	add(groupOther, newVersionCommand(env))
	// cobra's completion command, made now rather than at Execute so that
	// it carries examples like the others.
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c != root {
		c.Example = completionExample
	}
	return root
}

const completionExample = `  source <(orchestrator completion bash)
  orchestrator completion bash | sudo tee /etc/bash_completion.d/orchestrator >/dev/null
  orchestrator completion zsh > "${fpath[1]}/_orchestrator"
  orchestrator completion fish > ~/.config/fish/completions/orchestrator.fish`

// Run runs the client command line (NewRoot without extra commands) with
// args and returns the exit code.
func Run(ctx context.Context, args []string, env Env) int {
	return Execute(ctx, NewRoot(env), args, env)
}

// Execute runs root with args (single-dash long flags rewritten, see
// rewriteSingleDash) and returns the exit code. Errors are printed on
// env.Stderr: usage mistakes exit 2, failures 1, and an error with an
// ExitCode method (exec's command, serve) exits with that code unprinted.
func Execute(ctx context.Context, root *cobra.Command, args []string, env Env) int {
	root.SetArgs(rewriteSingleDash(root, args))
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	var fe failure
	if errors.As(err, &fe) {
		printError(env.Stderr, fe.err)
		if fe.code != 0 {
			return fe.code
		}
		return ExitFailure
	}
	// Everything else comes from cobra (unknown command, bad flag, wrong
	// arguments) or from our own usage checks.
	name := "orchestrator"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	fmt.Fprintf(env.Stderr, "%s: %s\nRun '%s --help' for usage.\n", name, safe(err.Error()), name)
	return ExitUsage
}

// usageError is a mistake in the command line (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// usagef returns a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// failure is an operation that failed; Execute prints it and exits with
// code (ExitFailure when 0; exec sets its own, see execFailure).
type failure struct {
	err  error
	code int
}

func (f failure) Error() string { return f.err.Error() }
func (f failure) Unwrap() error { return f.err }

// fail marks err as a failed operation rather than a usage mistake.
func fail(err error) error {
	if err == nil {
		return nil
	}
	var ue usageError
	if errors.As(err, &ue) {
		return err
	}
	return failure{err: err}
}

// exitError is exec's command's exit status, passed through unprinted.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// ExitCode is the process's exit code.
func (e exitError) ExitCode() int { return int(e) }

// ExitError returns an error that makes Execute exit with code and print
// nothing (the command has reported already).
func ExitError(code int) error { return exitError(code) }

// groupRun runs a command that only groups subcommands: with no argument it
// prints the help on stderr (a usage mistake), with one it names the
// unknown subcommand.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		cmd.SetOut(cmd.ErrOrStderr())
		_ = cmd.Help()
		return usagef("a subcommand is required")
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageError{msg}
}

// newGroup returns a command that groups subs.
func newGroup(use, short, example string, subs ...*cobra.Command) *cobra.Command {
	g := &cobra.Command{Use: use, Short: short, Example: example, Args: cobra.ArbitraryArgs, RunE: groupRun}
	g.AddCommand(subs...)
	return g
}

func newVersionCommand(env Env) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the orchestrator's version",
		Example: "  orchestrator version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(env.Stdout, version.Version)
			return nil
		},
	}
}

// exactArgs is cobra.ExactArgs with our message and a usage error.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("want exactly %s, got %d arguments", what, len(args))
		}
		return nil
	}
}
