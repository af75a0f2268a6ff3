package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-dev/berth/pkg/agent/process"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// execOptions are exec's flags.
type execOptions struct {
	sandboxFlags
	cwd     string
	timeout time.Duration
	stdin   bool
	shell   bool
}

// newExecCommand is `orchestrator exec`.
func newExecCommand(env Env) *cobra.Command {
	o := &execOptions{}
	cmd := &cobra.Command{
		Use:   "exec [flags] LEASE -- CMD [ARGS...]",
		Short: "Run a command in a lease's sandbox and exit with its code",
		Long: `Run a command in a lease's sandbox, streaming its stdout and stderr, and exit
with the command's exit code (128+N when a signal N ended it, 137 when it ran
out of memory). Errors of the CLI itself exit 1, usage mistakes 2.

The token is the lease's (BERTH_TOKEN) or the operator's.`,
		Example: `  orchestrator exec LEASE -- make test
  orchestrator exec --cwd /workspace/repo LEASE -- git log -1
  orchestrator exec --sh LEASE -- 'ls | wc -l'
  echo data | orchestrator exec --stdin LEASE -- cat
  orchestrator exec --timeout 30s LEASE -- ./slow-test`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lease, argv, err := execArgs(cmd, args)
			if err != nil {
				return err
			}
			return o.run(cmd.Context(), env, lease, argv)
		},
	}
	o.register(cmd.Flags(), env, true)
	fs := cmd.Flags()
	fs.StringVar(&o.cwd, "cwd", "", "working directory in the sandbox (absolute)")
	fs.DurationVar(&o.timeout, "timeout", 0, "kill the command after this long")
	fs.BoolVar(&o.stdin, "stdin", false, "send this process's stdin to the command")
	fs.BoolVar(&o.shell, "sh", false, "run the arguments as one shell line (/bin/sh -c)")
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
func (o *execOptions) run(ctx context.Context, env Env, lease string, argv []string) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	sc, err := o.open(ctx, lease)
	if err != nil {
		return err
	}
	defer sc.conn.Close()
	req := &agentv1.ExecRequest{Cwd: o.cwd}
	if o.shell {
		req.Command = strings.Join(argv, " ")
	} else {
		req.Argv = argv
	}
	if o.timeout > 0 {
		req.Timeout = durationpb.New(o.timeout)
	}
	if o.stdin && env.Stdin != nil {
		b, err := io.ReadAll(env.Stdin)
		if err != nil {
			return fail(fmt.Errorf("read stdin: %w", err))
		}
		req.StdinData = b
	}
	stream, err := agentv1.NewProcessServiceClient(sc.conn).ExecStream(sc.ctx, req)
	if err != nil {
		return fail(err)
	}
	for {
		ev, err := stream.Recv()
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

// exitStatus is the shell's exit code for an exited command: 137 when it
// ran out of memory, 128+N when signal N ended it, else its own code.
func exitStatus(e *agentv1.Exited) int {
	if e.GetOomKilled() {
		return 137
	}
	if e.GetSignal() != "" && e.GetExitCode() < 0 {
		return 128 + signalNumber(e.GetSignal())
	}
	return int(e.GetExitCode())
}

func signalNumber(name string) int {
	sig, err := process.ParseSignal(name)
	if err != nil {
		return 1
	}
	return int(sig)
}
