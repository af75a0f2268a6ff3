package cli

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/berth-dev/berth/internal/quantity"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// newSnapshotCommand is `orchestrator snapshot`: list and remove the
// snapshots that `orchestrator lease snapshot` takes.
func newSnapshotCommand(env Env) *cobra.Command {
	lf := &leaseFlags{}
	cmd := newGroup("snapshot", "List and remove snapshots (a lease's files stored as an image; acquire --snapshot forks them)",
		`  orchestrator lease snapshot LEASE --name before-refactor
  orchestrator snapshot list -o json
  orchestrator lease acquire --conversation c-2 --snapshot before-refactor
  orchestrator snapshot rm before-refactor`,
		newSnapshotListCommand(env, lf), newSnapshotRmCommand(env, lf))
	return lf.registerGroup(cmd, env)
}

// newLeaseSnapshotCommand is `orchestrator lease snapshot LEASE`.
func newLeaseSnapshotCommand(env Env, lf *leaseFlags) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "snapshot LEASE [--name NAME]",
		Short: "Store a lease's sandbox files as a snapshot that acquire --snapshot forks",
		Long: `Store a READY or PAUSED lease's sandbox files as the lease owner's
snapshot NAME (the local image berth/snapshot:TAG, TAG derived from owner
and name; names are per owner). The lease keeps running (a running sandbox is frozen
while its files are read). The snapshot holds the files, not the processes,
the lease's environment or secrets. Acquire a new conversation from it with
lease acquire --snapshot NAME (a fork); only the lease's owner may fork it.
Without --name it is named LEASE-YYYYMMDD-HHMMSS.`,
		Example: `  orchestrator lease snapshot LEASE --name before-refactor
  orchestrator lease snapshot LEASE -o json | jq .sizeBytes`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.callSnapshots(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				return c.Snapshot(ctx, &orchv1.SnapshotRequest{Id: args[0], Name: name})
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the snapshot's name (a-z, 0-9, '_', '.', '-'; default LEASE-YYYYMMDD-HHMMSS)")
	return cmd
}

func newSnapshotListCommand(env Env, lf *leaseFlags) *cobra.Command {
	var owner, leaseID, conv string
	cmd := &cobra.Command{
		Use:     "list [--owner O] [--lease ID] [--conversation ID]",
		Aliases: []string{"ls"},
		Short:   "List snapshots (a client sees its own; the operator every owner's)",
		Example: `  orchestrator snapshot list
  orchestrator snapshot list --conversation c-1 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lf.callSnapshots(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				return c.ListSnapshots(ctx, &orchv1.ListSnapshotsRequest{Owner: owner, LeaseId: leaseID, ConversationId: conv})
			})
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "one owner's snapshots (operator)")
	cmd.Flags().StringVar(&leaseID, "lease", "", "the snapshots of one lease")
	cmd.Flags().StringVar(&conv, "conversation", "", "the snapshots of one conversation")
	return cmd
}

func newSnapshotRmCommand(env Env, lf *leaseFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove"},
		Short:   "Remove snapshots (refused while a lease forked from one still has its sandbox)",
		Example: `  orchestrator snapshot rm before-refactor`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return removeEach(cmd.Context(), env, lf, orchv1.NewLeaseServiceClient, args, func(ctx context.Context, c orchv1.LeaseServiceClient, name string) (proto.Message, error) {
				_, err := c.DeleteSnapshot(ctx, &orchv1.DeleteSnapshotRequest{Name: name})
				return &orchv1.LeaseSnapshot{Name: name}, err
			})
		},
	}
}

// callSnapshots is leaseFlags.call with the snapshot table for -o table
// and wide.
func (lf *leaseFlags) callSnapshots(ctx context.Context, env Env, fn func(context.Context, orchv1.LeaseServiceClient) (proto.Message, error)) error {
	return callPrint(ctx, env, lf, orchv1.NewLeaseServiceClient, fn, printSnapshots)
}

// printSnapshots writes snapshots as a table.
func printSnapshots(w io.Writer, msg proto.Message) {
	var list []*orchv1.LeaseSnapshot
	switch m := msg.(type) {
	case *orchv1.LeaseSnapshot:
		list = []*orchv1.LeaseSnapshot{m}
	case *orchv1.ListSnapshotsResponse:
		list = m.GetSnapshots()
	}
	header := []string{"NAME", "SIZE", "LEASE", "CONVERSATION", "OWNER", "IMAGE", "CREATED", "TOOK"}
	printList(w, "snapshots", header, list, func(s *orchv1.LeaseSnapshot) []string {
		took := "-"
		if s.GetDuration() != nil {
			took = s.GetDuration().AsDuration().Round(time.Millisecond).String()
		}
		return []string{safe(s.GetName()), quantity.FormatBytes(s.GetSizeBytes()), orDash(s.GetLeaseId() != "", safe(s.GetLeaseId())),
			orDash(s.GetConversationId() != "", safe(s.GetConversationId())), orDash(s.GetOwner() != "", safe(s.GetOwner())),
			orDash(s.GetImage() != "", safe(s.GetImage())), timeOrDash(s.GetCreatedAt()), took}
	})
}
