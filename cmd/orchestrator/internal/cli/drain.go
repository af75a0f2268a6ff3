package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// drainTimeout is --timeout's default: a drain hibernates or releases
// every live lease, a few at a time.
const drainTimeout = 30 * time.Minute

// newDrainCommand is `orchestrator drain`: the operator takes the
// orchestrator (its host) out of service through LeaseService.Drain.
func newDrainCommand(env Env) *cobra.Command {
	lf := &leaseFlags{}
	var (
		mode, reason string
		timeout      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "drain --mode hibernate|release [flags]",
		Short: "Take the orchestrator out of service: refuse new leases, then hibernate or release every lease",
		Long: `Take the orchestrator (and its host) out of service. From the call on it
refuses, with UNAVAILABLE (HTTP 503), every acquire that would create a
lease and every resume of a paused one (a request through the proxy
included); an acquire that returns a conversation's live lease still
works, and its warm pools empty. Then every live lease is

  --mode hibernate  paused with mode hibernate: its container is stopped,
                    its files are kept, and it resumes (in place) after the
                    host and the orchestrator are back; a lease already
                    paused stays as it is
  --mode release    released: its sandbox is removed

four at a time. The answer lists the leases drained and
those that failed, with why; the command exits 1 when any failed, and
running it again retries them. Draining lasts until the orchestrator stops:
the next start accepts acquires again and adopts the hibernated leases.
Stopping the orchestrator without draining leaves every sandbox running.

It needs the operator token (BERTH_OPERATOR_TOKEN, or --token).`,
		Example: `  orchestrator drain --mode hibernate
  orchestrator drain --mode release --reason "host decommissioned" -o json
  BERTH_ADDR=http://10.0.0.7:7070 orchestrator drain --mode hibernate && systemctl stop berth`,
		Args: cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if err := checkOutput(lf.output); err != nil {
				return err
			}
			switch strings.ToLower(mode) {
			case "hibernate", "release":
				return nil
			case "":
				return usagef("--mode is required: hibernate or release")
			}
			return usagef("--mode must be hibernate or release, got %q", mode)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, ctx, done, err := lf.dialInterruptible(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			res, err := orchv1.NewLeaseServiceClient(conn).Drain(withToken(ctx, lf.bearer()), &orchv1.DrainRequest{Mode: mode, Reason: reason})
			if err != nil {
				return fail(err)
			}
			if lf.output == outJSON || lf.output == outYAML {
				if err := printMessage(env.Stdout, lf.output, res); err != nil {
					return fail(err)
				}
			} else {
				printDrain(env.Stdout, strings.ToLower(mode), res)
			}
			if n := len(res.GetFailed()); n > 0 {
				return fail(fmt.Errorf("%d of %d leases were not drained; run drain again to retry them", n, n+len(res.GetDrained())))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	lf.register(fs, env)
	addOutputFlag(fs, &lf.output)
	fs.StringVar(&mode, "mode", "", "what to do with each live lease: hibernate or release (required)")
	fs.StringVar(&reason, "reason", "", `reason recorded with the releases of --mode release (default "drained by operator")`)
	fs.DurationVar(&timeout, "timeout", drainTimeout, "give up waiting after this long (the leases not reached yet stay as they are)")
	return cmd
}

// printDrain writes a drain's answer for people: a count line, then one
// line per failed lease.
func printDrain(w io.Writer, mode string, res *orchv1.DrainResponse) {
	fmt.Fprintf(w, "draining: new leases are refused until the orchestrator restarts\ndrained %d leases (%s), %d failed\n",
		len(res.GetDrained()), mode, len(res.GetFailed()))
	for _, f := range res.GetFailed() {
		fmt.Fprintf(w, "failed %s: %s\n", safe(f.GetLeaseId()), safe(f.GetError()))
	}
}
