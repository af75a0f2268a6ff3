package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/pkg/lease"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// newWatchCommand is `lease watch`: the current leases' last transitions,
// then one line per transition as it happens.
func newWatchCommand(env Env, lf *leaseFlags) *cobra.Command {
	var (
		owner, id   string
		changesOnly bool
	)
	cmd := &cobra.Command{
		Use:   "watch [--owner O] [--lease ID]",
		Short: "Print the live leases' last transitions, then each transition as it happens",
		Long: `Print one line per lease transition (time, lease, from -> to, reason): first
the transition that brought each live lease to its current state (oldest
first), then every transition as it happens, until interrupted (exit 0), as
"kubectl get -w" does. --changes-only skips the current leases. -o json
prints one LeaseEvent object per line, -o yaml one document per event.`,
		Example: `  orchestrator lease watch
  orchestrator lease watch --lease LEASE -o json
  orchestrator lease watch --changes-only --owner team-a`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			show := func(ev *orchv1.LeaseEvent) error {
				if lf.output == outJSON || lf.output == outYAML {
					return printStreamed(env.Stdout, lf.output, ev)
				}
				tr := ev.GetTransition()
				_, err := fmt.Fprintf(env.Stdout, "%s\t%s\t%s -> %s\t%s\n", tr.GetAt().AsTime().Format(time.RFC3339), safe(ev.GetLease().GetId()),
					stateName(tr.GetFrom()), stateName(tr.GetTo()), safe(tr.GetReason()))
				return err
			}
			var before func(context.Context, orchv1.LeaseServiceClient) error
			if !changesOnly {
				before = func(ctx context.Context, c orchv1.LeaseServiceClient) error {
					return showCurrent(ctx, c, owner, id, show)
				}
			}
			return lf.watch(cmd.Context(), &orchv1.WatchRequest{Owner: owner, LeaseId: id}, before, show)
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "only this owner's leases")
	cmd.Flags().StringVar(&id, "lease", "", "only this lease")
	cmd.Flags().BoolVar(&changesOnly, "changes-only", false, "print only the transitions from now on, not the current leases first")
	return cmd
}

// showCurrent passes show, for each live lease (of owner, or the lease
// id, live or not), the event of its last transition, oldest first.
func showCurrent(ctx context.Context, c orchv1.LeaseServiceClient, owner, id string, show func(*orchv1.LeaseEvent) error) error {
	var leases []*orchv1.Lease
	if id != "" {
		l, err := c.Get(ctx, &orchv1.GetLeaseRequest{Id: id})
		if err != nil {
			return err
		}
		leases = []*orchv1.Lease{l}
	} else {
		var err error
		if leases, err = listAll(ctx, c, &orchv1.ListLeasesRequest{Owner: owner, PageSize: 1000}); err != nil {
			return err
		}
	}
	events := make([]*orchv1.LeaseEvent, len(leases))
	for i, l := range leases {
		events[i] = &orchv1.LeaseEvent{Lease: l, Transition: lastTransition(l)}
	}
	slices.SortStableFunc(events, func(a, b *orchv1.LeaseEvent) int {
		return a.GetTransition().GetAt().AsTime().Compare(b.GetTransition().GetAt().AsTime())
	})
	for _, ev := range events {
		if err := show(ev); err != nil {
			return err
		}
	}
	return nil
}

// lastTransition is the transition that brought l to its state (one made
// up of its state, reason and update time if it has none recorded).
func lastTransition(l *orchv1.Lease) *orchv1.Transition {
	if trs := l.GetTransitions(); len(trs) > 0 {
		return trs[len(trs)-1]
	}
	return &orchv1.Transition{To: l.GetState(), Reason: l.GetReason(), At: l.GetUpdatedAt()}
}

// addWatchFlag adds --watch/-w to a get or list command; what names what
// is printed first.
func addWatchFlag(cmd *cobra.Command, p *bool, what string) {
	cmd.Flags().BoolVarP(p, "watch", "w", false, "print "+what+", then a row for each change as it happens (until interrupted)")
}

// watchHelp describes --watch's output in a command's long help.
const watchHelp = `With --watch (-w), the table is followed by one row for every change, as it
happens, until interrupted (exit 0); -o json then prints one Lease object per
line, -o yaml one document per lease.`

// watch opens a Watch stream, then runs before (which prints the current
// state: the stream is open first, so no change between the two is lost),
// then calls each for every event until the stream ends or the command is
// interrupted (exit 0).
func (lf *leaseFlags) watch(ctx context.Context, req *orchv1.WatchRequest, before func(context.Context, orchv1.LeaseServiceClient) error, each func(*orchv1.LeaseEvent) error) error {
	conn, ctx, done, err := lf.dialInterruptible(ctx)
	if err != nil {
		return err
	}
	defer done()
	ctx = withToken(ctx, lf.bearer())
	c := orchv1.NewLeaseServiceClient(conn)
	stream, err := c.Watch(ctx, req)
	if err != nil {
		return fail(err)
	}
	// The server subscribes as it sends the headers.
	if _, err := stream.Header(); err != nil {
		return endOfWatch(ctx, err)
	}
	if before != nil {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := before(cctx, c)
		cancel()
		if err != nil {
			return fail(err)
		}
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return endOfWatch(ctx, err)
		}
		if err := each(ev); err != nil {
			return fail(err)
		}
	}
}

// endOfWatch is nil when the watch ended because it was interrupted or the
// server closed it, else the failure.
func endOfWatch(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, io.EOF) {
		return nil
	}
	return fail(err)
}

// watchLeases is get/list --watch: the leases current returns, then every
// lease that changes and passes keep (nil keeps all), as rows of one table
// (or one JSON line / YAML document per lease).
func (lf *leaseFlags) watchLeases(ctx context.Context, env Env, req *orchv1.WatchRequest,
	current func(context.Context, orchv1.LeaseServiceClient) ([]*orchv1.Lease, error), keep func(*orchv1.Lease) bool) error {
	t := newLeaseTable(lf.output == outWide)
	flush := func() {
		if isTable(lf.output) {
			t.flush(env.Stdout)
		}
	}
	show := func(l *orchv1.Lease) error {
		if keep != nil && !keep(l) {
			return nil
		}
		if lf.output == outJSON || lf.output == outYAML {
			return printStreamed(env.Stdout, lf.output, l)
		}
		t.add(l)
		return nil
	}
	before := func(ctx context.Context, c orchv1.LeaseServiceClient) error {
		leases, err := current(ctx, c)
		if err != nil {
			return err
		}
		for _, l := range leases {
			if err := show(l); err != nil {
				return err
			}
		}
		flush()
		return nil
	}
	return lf.watch(ctx, req, before, func(ev *orchv1.LeaseEvent) error {
		err := show(ev.GetLease())
		flush()
		return err
	})
}

// leaseFilter is list --watch's client-side filter for what the Watch
// request cannot select: the state, the conversation and the labels.
func leaseFilter(state orchv1.LeaseState, conv, selector string) (func(*orchv1.Lease) bool, error) {
	sel, err := lease.ParseSelector("--selector", selector)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	return func(l *orchv1.Lease) bool {
		if state != orchv1.LeaseState_LEASE_STATE_UNSPECIFIED && l.GetState() != state {
			return false
		}
		if conv != "" && l.GetConversationId() != conv {
			return false
		}
		for k, v := range sel {
			if got, ok := l.GetLabels()[k]; !ok || got != v {
				return false
			}
		}
		return true
	}, nil
}

// completeLeaseIDs completes a lease id argument with the live leases the
// token can see (nothing when the orchestrator cannot be reached).
func completeLeaseIDs(lf *leaseFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
		conn, err := lf.dial()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(withToken(cmd.Context(), lf.bearer()), 3*time.Second)
		defer cancel()
		leases, err := listAll(ctx, orchv1.NewLeaseServiceClient(conn), &orchv1.ListLeasesRequest{PageSize: 1000})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ids := make([]string, 0, len(leases))
		for _, l := range leases {
			ids = append(ids, l.GetId()+"\t"+stateName(l.GetState())+" "+l.GetConversationId())
		}
		return ids, cobra.ShellCompDirectiveNoFileComp
	}
}
