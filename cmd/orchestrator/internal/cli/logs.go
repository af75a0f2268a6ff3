package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// newLogsCommand is `orchestrator logs`.
func newLogsCommand(env Env) *cobra.Command {
	lf := &leaseFlags{}
	var (
		follow bool
		tail   int
		since  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "logs LEASE [--follow] [--tail N] [--since D]",
		Short: "Show a lease's transitions and its sandbox's output",
		Long: `Show why a sandbox is where it is: the lease's transitions with their
reasons (a failed start says why, with the container's last lines), then the
container's output: the agent's own log and whatever the container's main
process writes to stdout and stderr. With --follow, new transitions and
output are printed as they happen until the lease ends or the command is
interrupted (exit 0).

Each line is TIME SOURCE TEXT; SOURCE is "transition" (with FROM -> TO),
"stdout", "stderr", "output" (containerd does not tell the two apart; its
lines carry no time) or "berth" (a note, e.g. the output is gone because the
sandbox was removed). -o json prints one LogEntry object per line.

The operator token sees every lease; a client token its own leases; a lease
token its own lease.`,
		Example: `  orchestrator logs LEASE
  orchestrator logs LEASE --follow
  orchestrator logs LEASE --tail 50 --since 10m -o json | jq -r .text`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		PreRunE:           func(*cobra.Command, []string) error { return checkOutput(lf.output) },
		RunE: func(cmd *cobra.Command, args []string) error {
			if tail < 0 {
				return usagef("--tail must not be negative")
			}
			if since < 0 {
				return usagef("--since must not be negative")
			}
			req := &orchv1.LogsRequest{Id: args[0], Follow: follow, Tail: int32(tail)}
			if since > 0 {
				req.Since = timestamppb.New(time.Now().Add(-since))
			}
			return lf.logs(cmd.Context(), env.Stdout, req)
		},
	}
	fs := cmd.Flags()
	fs.BoolVarP(&follow, "follow", "f", false, "keep printing new transitions and output until the lease ends")
	fs.IntVar(&tail, "tail", 0, "show only the last N lines of output (0: all)")
	fs.DurationVar(&since, "since", 0, "show only what happened in the last D (e.g. 10m)")
	lf.register(fs, env)
	addOutputFlag(fs, &lf.output)
	return cmd
}

// logs streams the Logs call to w.
func (lf *leaseFlags) logs(ctx context.Context, w io.Writer, req *orchv1.LogsRequest) error {
	conn, ctx, done, err := lf.dialInterruptible(ctx)
	if err != nil {
		return err
	}
	defer done()
	if !req.Follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	stream, err := orchv1.NewLeaseServiceClient(conn).Logs(withToken(ctx, lf.bearer()), req)
	if err != nil {
		return fail(err)
	}
	for {
		e, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil && status.Code(err) == codes.Canceled {
				return nil // interrupted
			}
			return fail(err)
		}
		if lf.output == outJSON || lf.output == outYAML {
			if err := printStreamed(w, lf.output, e); err != nil {
				return err
			}
			continue
		}
		when := "-"
		if e.GetTime() != nil {
			when = e.GetTime().AsTime().Local().Format("2006-01-02T15:04:05.000Z07:00")
		}
		text := safe(e.GetText())
		if tr := e.GetTransition(); tr != nil {
			text = stateName(tr.GetFrom()) + " -> " + stateName(tr.GetTo()) + ": " + text
		}
		if _, err := fmt.Fprintf(w, "%s %-10s %s\n", when, safe(e.GetSource()), text); err != nil {
			return err
		}
	}
}
