package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// execOptions are exec's flags.
type execOptions struct {
	sandboxFlags
	processFlags
	timeout time.Duration
	stdin   bool
	tty     bool
}

// newExecCommand is `orchestrator exec`.
func newExecCommand(env Env) *cobra.Command {
	o := &execOptions{}
	cmd := &cobra.Command{
		Use:   "exec [flags] LEASE -- CMD [ARGS...]",
		Short: "Run a command in a lease's sandbox and exit with its code",
		Long: `Run a command in a lease's sandbox, streaming its stdout and stderr, and exit
with the command's exit code, as docker exec does. The flags are docker
exec's: -e KEY=VALUE (or -e KEY, from this environment) and --env-file,
-w DIR, -u USER, -i (send stdin), -t (run on a terminal in the sandbox).

Exit codes: the command's own; 124 when --timeout stopped it (as GNU
timeout); 125 when exec itself failed (unknown lease, refused token,
orchestrator unreachable, connection lost, missing working directory or
user: one line on stderr); 126 when the command cannot be executed; 127
when it is not found; 128+N when signal N ended it (137 also when it ran
out of memory; 130 when Ctrl-C interrupted exec). Usage mistakes exit 2
before anything runs.

The token is the lease's (BERTH_TOKEN) or the operator's.`,
		Example: `  orchestrator exec LEASE -- make test
  orchestrator exec -w /workspace/repo -e GOFLAGS=-mod=mod -e HOME LEASE -- go test ./...
  orchestrator exec --env-file ci.env -u root LEASE -- ./install-deps.sh
  orchestrator exec --sh LEASE -- 'ls | wc -l'
  echo data | orchestrator exec -i LEASE -- cat
  orchestrator exec -it LEASE -- python3
  orchestrator exec --timeout 30s LEASE -- ./slow-test || echo "exit $? (124: timed out)"`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lease, argv, err := execArgs(cmd, args)
			if err != nil {
				return err
			}
			vars, err := o.environment(env)
			if err != nil {
				return err
			}
			if o.tty {
				if o.timeout > 0 {
					return usagef("--timeout does not go with -t (a terminal session has no timeout)")
				}
				return execFailure(o.runTTY(cmd.Context(), env, lease, argv, vars))
			}
			return execFailure(o.run(cmd.Context(), env, lease, argv, vars))
		},
	}
	o.sandboxFlags.register(cmd.Flags(), env, true)
	fs := cmd.Flags()
	o.processFlags.register(fs, "command")
	fs.BoolVarP(&o.stdin, "interactive", "i", false, "send this process's stdin to the command")
	fs.BoolVar(&o.stdin, "stdin", false, "same as --interactive")
	fs.BoolVarP(&o.tty, "tty", "t", false, "run the command on a terminal in the sandbox (as shell does)")
	fs.DurationVar(&o.timeout, "timeout", 0, "stop the command after this long (exit 124)")
	return cmd
}

// execArgs splits "LEASE -- CMD ARGS..." (or "LEASE CMD" with no "--" when
// CMD takes no arguments).
func execArgs(cmd *cobra.Command, args []string) (lease string, argv []string, err error) {
	pos := args
	if dash := cmd.ArgsLenAtDash(); dash >= 0 {
		pos, argv = args[:dash], args[dash:]
	} else if len(args) == 2 {
		pos, argv = args[:1], args[1:]
	}
	if len(pos) != 1 {
		return "", nil, usagef("want LEASE -- CMD [ARGS...], got %d arguments before --", len(pos))
	}
	if len(argv) == 0 {
		return "", nil, usagef("no command given")
	}
	return pos[0], argv, nil
}

// run streams the command's output and returns its exit status as an
// ExitError (nil for 0).
func (o *execOptions) run(ctx context.Context, env Env, lease string, argv []string, vars map[string]string) error {
	ctx, interrupted, stop := onInterrupt(ctx)
	defer stop()
	sc, err := o.open(ctx, lease)
	if err != nil {
		return err
	}
	defer sc.conn.Close()
	req := &agentv1.ExecRequest{Cwd: o.cwd, User: o.user, Env: vars}
	if o.shell {
		req.Command = strings.Join(argv, " ")
	} else {
		req.Argv = argv
	}
	if o.timeout > 0 {
		req.Timeout = durationpb.New(o.timeout)
	}
	if o.stdin && env.Stdin != nil {
		b, err := io.ReadAll(io.LimitReader(env.Stdin, validate.MaxStdin+1))
		if err != nil {
			return fail(fmt.Errorf("read stdin: %w", err))
		}
		if len(b) > validate.MaxStdin {
			return fail(errdefs.ResourceExhausted("stdin: more than %d MiB (copy large input in with cp)", validate.MaxStdin>>20))
		}
		req.StdinData = b
	}
	stream, err := agentv1.NewProcessServiceClient(sc.conn).ExecStream(sc.ctx, req)
	if err != nil {
		return fail(err)
	}
	for {
		ev, err := stream.Recv()
		if sig := interrupted(); sig != 0 {
			return ExitError(128 + int(sig)) // the agent stops the command
		}
		if errors.Is(err, io.EOF) {
			return fail(errNoExit)
		}
		if err != nil {
			return fail(err)
		}
		switch e := ev.Event.(type) {
		case *agentv1.ExecEvent_Stdout:
			_, _ = env.Stdout.Write(e.Stdout)
		case *agentv1.ExecEvent_Stderr:
			_, _ = env.Stderr.Write(e.Stderr)
		case *agentv1.ExecEvent_Exited:
			if e.Exited.TimedOut {
				fmt.Fprintf(env.Stderr, "orchestrator: command timed out after %s\n", o.timeout)
			}
			if e.Exited.OomKilled {
				fmt.Fprintln(env.Stderr, "killed: out of memory")
			}
			if code := exitStatus(e.Exited); code != 0 {
				return ExitError(code)
			}
			return nil
		}
	}
}

// runTTY runs the command on a terminal in the sandbox: a terminal session
// as `shell` opens it (its code path, with exec's flags), with this
// process's stdin as the input when -i is given.
func (o *execOptions) runTTY(ctx context.Context, env Env, lease string, argv []string, vars map[string]string) error {
	pf := processFlags{cwd: o.cwd, user: o.user, shell: o.shell}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		pf.env = append(pf.env, k+"="+vars[k])
	}
	so := &shellOptions{sandboxFlags: o.sandboxFlags, processFlags: pf, detachKeys: defaultDetachKeys}
	if !o.stdin {
		env.Stdin = nil // docker exec -t without -i: no input
	}
	return so.run(ctx, env, lease, argv)
}

// onInterrupt returns ctx cancelled on SIGINT or SIGTERM, a function that
// reports the signal that came (0 for none), and the one that stops
// listening.
func onInterrupt(ctx context.Context) (context.Context, func() syscall.Signal, func()) {
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	var got atomic.Int32
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			if sig, ok := s.(syscall.Signal); ok {
				got.Store(int32(sig))
			}
			cancel()
		case <-done:
		}
	}()
	return ctx, func() syscall.Signal { return syscall.Signal(got.Load()) }, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}

// Exit codes of exec beyond the command's own, as docker exec, a shell
// and GNU timeout use them.
const (
	// ExitTimedOut is a command that --timeout stopped (GNU timeout's 124).
	ExitTimedOut = 124
	// ExitExecFailed is exec itself failing before or around the command:
	// the lease, the token, the orchestrator, the connection, the working
	// directory or the user (docker's 125).
	ExitExecFailed = 125
	// ExitCannotExecute is a command that exists but cannot be executed
	// (a shell's 126).
	ExitCannotExecute = 126
	// ExitNotFound is a command that does not exist (a shell's 127).
	ExitNotFound = 127
	// exitOutOfMemory is a command the OOM killer ended (128+SIGKILL).
	exitOutOfMemory = 137
)

// exitStatus is the shell's exit code for an exited command: 124 when the
// timeout stopped it, 137 when it ran out of memory, 128+N when signal N
// ended it, else its own code.
func exitStatus(e *agentv1.Exited) int {
	switch {
	case e.GetTimedOut():
		return ExitTimedOut
	case e.GetOomKilled():
		return exitOutOfMemory
	case e.GetSignal() != "" && e.GetExitCode() < 0:
		return 128 + signalNumber(e.GetSignal())
	}
	return int(e.GetExitCode())
}

// execFailure gives exec's failures their exit code (usage mistakes keep
// 2, the command's own status passes): 127 and 126 for a command the agent
// could not start because it is missing or not executable (the reason it
// sends), else 125.
func execFailure(err error) error {
	var fe failure
	if !errors.As(err, &fe) {
		return err
	}
	switch errdefs.Reason(errgrpc.FromGRPC(fe.err)) {
	case process.ReasonCommandNotFound:
		fe.code = ExitNotFound
	case process.ReasonCommandNotExecutable:
		fe.code = ExitCannotExecute
	default:
		fe.code = ExitExecFailed
	}
	return fe
}

func signalNumber(name string) int {
	sig, err := process.ParseSignal(name)
	if err != nil {
		return 1
	}
	return int(sig)
}
