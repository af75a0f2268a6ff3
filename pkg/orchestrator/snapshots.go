package orchestrator

import (
	"context"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Snapshot snapshots a lease the caller may see (the same authorization as
// Pause): the snapshot belongs to the lease's owner.
func (s *leaseServer) Snapshot(ctx context.Context, req *orchv1.SnapshotRequest) (*orchv1.LeaseSnapshot, error) {
	if _, err := s.lookup(ctx, req.Id); err != nil {
		return nil, err
	}
	snap, err := s.m.Snapshots().Take(ctx, req.Id, req.Name)
	if err != nil {
		return nil, err
	}
	return toSnapshot(snap), nil
}

// snapshotOwner returns whose snapshots the caller may list or remove:
// a client its own (asking for another owner's is PERMISSION_DENIED), the
// operator one owner's or (owner "") every owner's; a lease token none.
func snapshotOwner(ctx context.Context, owner string) (string, bool, error) {
	p := principal(ctx)
	switch p.Role {
	case RoleOperator:
		return owner, owner == "", nil
	case RoleClient:
		if owner != "" && owner != p.Owner {
			return "", false, errdefs.Newf(errdefs.ErrPermissionDenied, "owner: a client token sees only its own snapshots")
		}
		return p.Owner, false, nil
	}
	return "", false, errDenied
}

// ListSnapshots lists the snapshots the caller may see.
func (s *leaseServer) ListSnapshots(ctx context.Context, req *orchv1.ListSnapshotsRequest) (*orchv1.ListSnapshotsResponse, error) {
	owner, anyOwner, err := snapshotOwner(ctx, req.Owner)
	if err != nil {
		return nil, err
	}
	list, err := s.m.Snapshots().List(ctx, lease.SnapshotFilter{Owner: owner, AnyOwner: anyOwner, LeaseID: req.LeaseId, ConversationID: req.ConversationId})
	if err != nil {
		return nil, err
	}
	out := &orchv1.ListSnapshotsResponse{Snapshots: make([]*orchv1.LeaseSnapshot, 0, len(list))}
	for _, snap := range list {
		out.Snapshots = append(out.Snapshots, toSnapshot(snap))
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot the caller owns (any, for the operator).
func (s *leaseServer) DeleteSnapshot(ctx context.Context, req *orchv1.DeleteSnapshotRequest) (*orchv1.DeleteSnapshotResponse, error) {
	if req.Name == "" {
		return nil, errdefs.InvalidArgument("name", "required")
	}
	owner, anyOwner, err := snapshotOwner(ctx, "")
	if err != nil {
		return nil, err
	}
	if err := s.m.Snapshots().Remove(ctx, req.Name, owner, anyOwner); err != nil {
		return nil, err
	}
	return &orchv1.DeleteSnapshotResponse{}, nil
}

// toSnapshot converts a snapshot for the wire.
func toSnapshot(s lease.Snapshot) *orchv1.LeaseSnapshot {
	out := &orchv1.LeaseSnapshot{
		Name: s.Name, Ref: s.Ref, Id: s.ID, LeaseId: s.LeaseID, ConversationId: s.ConversationID, Owner: s.Owner,
		Image: s.Image, User: s.User, SizeBytes: s.Size, CreatedAt: ts(s.CreatedAt),
	}
	if s.Duration > 0 {
		out.Duration = durationpb.New(s.Duration)
	}
	return out
}

// defaultSnapshots is Defaults' Snapshots: the lease manager's defaults,
// but a service bounds each owner's snapshots to 20 adding 10 GiB together
// (the library: no limit).
func defaultSnapshots() lease.SnapshotConfig {
	c := lease.DefaultSnapshotConfig()
	c.MaxPerOwner = 20
	c.MaxBytesPerOwner = 10 << 30
	return c
}
