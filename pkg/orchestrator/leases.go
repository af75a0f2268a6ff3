package orchestrator

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/streamlimit"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// leaseServer is the gRPC adapter over the lease manager. It authorizes
// each call by the caller's Principal and converts messages; the lease
// logic lives in pkg/lease. Its methods return errdefs categories (the
// manager's, and errdefs.Newf for its own checks, whose messages clients
// know); the server's statusUnary/statusStream interceptors turn them into
// gRPC statuses (grpcErr).
type leaseServer struct {
	orchv1.UnimplementedLeaseServiceServer
	m *lease.Manager
	// streams bounds each caller's open watches and log follows, together
	// with the proxy's terminal attaches and file watches.
	streams *streamlimit.Limiter
	// usage fills Get's live figures (usage.go); logs serves Logs (logs.go).
	usage *usageTracker
	logs  *logSource
}

// streamCaller is p's key in the stream limiter: its token (the
// operator, one client owner, or one lease).
func streamCaller(p Principal) string {
	switch p.Role {
	case RoleOperator:
		return streamlimit.Operator
	case RoleClient:
		return streamlimit.Client(p.Owner)
	}
	return streamlimit.Lease(p.LeaseID)
}

func principal(ctx context.Context) Principal {
	p, _ := PrincipalFrom(ctx)
	return p
}

// grpcErr maps an error to a gRPC status (errgrpc.ToGRPC); an error with a
// retry hint (lease.RetryAfter, RESOURCE_EXHAUSTED) carries it as a
// RetryInfo detail.
func grpcErr(err error) error {
	wire := errgrpc.ToGRPC(err)
	if d, ok := lease.RetryAfter(err); ok {
		if st, derr := status.Convert(wire).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); derr == nil {
			return st.Err()
		}
	}
	return wire
}

var errDenied = errdefs.Newf(errdefs.ErrPermissionDenied, "this token may not make this call")

// canSee reports whether p may read or change l.
func canSee(p Principal, l lease.Lease) bool {
	switch p.Role {
	case RoleOperator:
		return true
	case RoleClient:
		return l.Owner == p.Owner
	case RoleLease:
		return l.ID == p.LeaseID
	}
	return false
}

// lookup gets a lease the caller may see; others' leases are NOT_FOUND so
// their existence is not revealed.
func (s *leaseServer) lookup(ctx context.Context, id string) (lease.Lease, error) {
	if id == "" {
		return lease.Lease{}, errdefs.Newf(errdefs.ErrInvalidArgument, "id: required")
	}
	l, err := s.m.Get(ctx, id)
	if err != nil {
		return l, err
	}
	if !canSee(principal(ctx), l) {
		return l, errdefs.Newf(errdefs.ErrNotFound, "lease %s not found", id)
	}
	return l, nil
}

func (s *leaseServer) Acquire(ctx context.Context, req *orchv1.AcquireRequest) (*orchv1.AcquireResponse, error) {
	p := principal(ctx)
	owner := p.Owner
	switch p.Role {
	case RoleOperator:
		if req.Owner != "" {
			owner = req.Owner
		}
	case RoleClient:
		if req.Owner != "" && req.Owner != p.Owner {
			return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "owner: a client token acquires only for its own owner")
		}
	default:
		return nil, errDenied
	}
	res, err := s.fromResources(req.Resources)
	if err != nil {
		return nil, err
	}
	ar := lease.AcquireRequest{
		ConversationID: req.ConversationId, Owner: owner, Image: req.Image,
		Labels: req.Labels, Env: req.Env, Secrets: req.Secrets, Resources: res, User: req.User,
		NoOwnerLimit: p.Role == RoleOperator,
		Snapshot:     req.Snapshot, AnySnapshot: p.Role == RoleOperator,
	}
	ar.Persist, ar.Mounts = req.GetWorkspace().GetPersist(), fromHostMounts(req.Mounts) // volumes.go
	ar.Network = acquireNetwork(req.Network)
	if a := req.GetApp(); a != nil {
		ar.App = &lease.App{Command: a.GetCommand(), WorkDir: a.GetWorkingDir()}
	}
	ar.WorkDir = req.WorkingDir
	for _, p := range req.PublicPorts {
		ar.PublicPorts = append(ar.PublicPorts, int(p))
	}
	if ar.TTL, err = duration("ttl", req.Ttl); err != nil {
		return nil, err
	}
	if ar.IdleTimeout, err = duration("idle_timeout", req.IdleTimeout); err != nil {
		return nil, err
	}
	if ar.IdlePolicy, err = lease.ParseIdlePolicy("idle_policy", req.IdlePolicy); err != nil {
		return nil, err
	}
	l, tok, created, err := s.m.Acquire(ctx, ar)
	if err != nil {
		return nil, err
	}
	return &orchv1.AcquireResponse{Lease: toLease(l), Token: tok, Created: created}, nil
}

func (s *leaseServer) Get(ctx context.Context, req *orchv1.GetLeaseRequest) (*orchv1.Lease, error) {
	l, err := s.lookup(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	out := toLease(l)
	s.usage.fill(ctx, l, out)
	return out, nil
}

func (s *leaseServer) List(ctx context.Context, req *orchv1.ListLeasesRequest) (*orchv1.ListLeasesResponse, error) {
	p := principal(ctx)
	f := lease.Filter{Owner: req.Owner, ConversationID: req.ConversationId, IncludeEnded: req.IncludeEnded,
		PageSize: int(req.PageSize), PageToken: req.PageToken}
	switch p.Role {
	case RoleOperator:
	case RoleClient:
		if req.Owner != "" && req.Owner != p.Owner {
			return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "owner: a client token lists only its own leases")
		}
		f.Owner = p.Owner
	default:
		return nil, errDenied
	}
	if req.PageSize < 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "page_size: must not be negative")
	}
	if req.State != orchv1.LeaseState_LEASE_STATE_UNSPECIFIED {
		st, err := lease.ParseState(req.State.String())
		if err != nil {
			return nil, errdefs.InvalidArgument("state", "%v", err)
		}
		f.States = []lease.State{st}
	}
	sel, err := lease.ParseSelector("label_selector", req.LabelSelector)
	if err != nil {
		return nil, err
	}
	f.Labels = sel
	ls, next, err := s.m.List(ctx, f)
	if err != nil {
		return nil, err
	}
	out := &orchv1.ListLeasesResponse{NextPageToken: next}
	for _, l := range ls {
		out.Leases = append(out.Leases, toLease(l))
	}
	return out, nil
}

func (s *leaseServer) Renew(ctx context.Context, req *orchv1.RenewRequest) (*orchv1.Lease, error) {
	if _, err := s.lookup(ctx, req.Id); err != nil {
		return nil, err
	}
	ttl, err := duration("ttl", req.Ttl)
	if err != nil {
		return nil, err
	}
	l, err := s.m.Renew(ctx, req.Id, ttl)
	if err != nil {
		return nil, err
	}
	return toLease(l), nil
}

// Pause pauses a lease the caller may see (the same authorization as Renew
// and Release).
func (s *leaseServer) Pause(ctx context.Context, req *orchv1.PauseRequest) (*orchv1.Lease, error) {
	if _, err := s.lookup(ctx, req.Id); err != nil {
		return nil, err
	}
	mode, err := lease.ParsePauseMode("mode", req.Mode)
	if err != nil {
		return nil, err
	}
	l, err := s.m.Pause(ctx, req.Id, mode)
	if err != nil {
		return nil, err
	}
	return toLease(l), nil
}

// Resume resumes a paused lease the caller may see.
func (s *leaseServer) Resume(ctx context.Context, req *orchv1.ResumeRequest) (*orchv1.Lease, error) {
	if _, err := s.lookup(ctx, req.Id); err != nil {
		return nil, err
	}
	l, err := s.m.Resume(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	return toLease(l), nil
}

func (s *leaseServer) Release(ctx context.Context, req *orchv1.ReleaseRequest) (*orchv1.Lease, error) {
	if _, err := s.lookup(ctx, req.Id); err != nil {
		return nil, err
	}
	reason := req.Reason
	if reason == "" {
		reason = "released by " + describe(principal(ctx))
	}
	l, err := s.m.Release(ctx, req.Id, reason)
	if err != nil {
		return nil, err
	}
	return toLease(l), nil
}

func (s *leaseServer) Reap(ctx context.Context, req *orchv1.ReapRequest) (*orchv1.ReapResponse, error) {
	p := principal(ctx)
	if p.Role != RoleOperator {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "reap needs the operator token")
	}
	sel, err := lease.ParseSelector("label_selector", req.LabelSelector)
	if err != nil {
		return nil, err
	}
	reason := req.Reason
	if reason == "" {
		reason = "reaped by operator"
	}
	ids, err := s.m.Reap(ctx, lease.ReapFilter{IDs: req.Ids, Owner: req.Owner, ConversationID: req.ConversationId, Labels: sel, All: req.All, Reason: reason})
	if err != nil {
		return nil, err
	}
	return &orchv1.ReapResponse{Reaped: ids}, nil
}

func (s *leaseServer) Watch(req *orchv1.WatchRequest, stream grpc.ServerStreamingServer[orchv1.LeaseEvent]) error {
	ctx := stream.Context()
	p := principal(ctx)
	f := lease.EventFilter{Owner: req.Owner, LeaseID: req.LeaseId}
	switch p.Role {
	case RoleOperator:
	case RoleClient:
		if req.Owner != "" && req.Owner != p.Owner {
			return errdefs.Newf(errdefs.ErrPermissionDenied, "owner: a client token watches only its own leases")
		}
		f.Owner = p.Owner
	case RoleLease:
		if req.LeaseId != "" && req.LeaseId != p.LeaseID {
			return errDenied
		}
		f.LeaseID = p.LeaseID
	default:
		return errDenied
	}
	done, err := s.streams.Acquire(streamCaller(p))
	if err != nil {
		return err
	}
	defer done()
	// Send headers now so REST clients see the stream open.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	events := s.m.Subscribe(ctx, f)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				// Conflict is ABORTED on the wire (errgrpc).
				return errdefs.Newf(errdefs.ErrConflict, "watch fell behind; list again and re-watch")
			}
			out := &orchv1.LeaseEvent{Lease: toLease(ev.Lease)}
			if ev.Transition != nil {
				out.Transition = toTransition(*ev.Transition)
			}
			if err := stream.Send(out); err != nil {
				return err
			}
		}
	}
}

func describe(p Principal) string {
	switch p.Role {
	case RoleOperator:
		return "operator"
	case RoleClient:
		return "client " + p.Owner
	case RoleLease:
		return "lease token"
	}
	return "unknown"
}

func duration(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: %v", field, err)
	}
	v := d.AsDuration()
	if v < 0 {
		return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: must not be negative, got %s", field, v)
	}
	return v, nil
}

// fromResources converts requested resources. CPUs arrive as a double
// (JSON accepts "NaN" and "Infinity"): non-finite, negative or above the
// configured maximum is INVALID_ARGUMENT naming resources.cpus, checked here
// because the conversion to nano-CPUs would overflow. The other maximums
// are the lease manager's.
func (s *leaseServer) fromResources(r *orchv1.Resources) (runtime.Resources, error) {
	if r == nil {
		return runtime.Resources{}, nil
	}
	c := r.Cpus
	switch {
	case math.IsNaN(c) || math.IsInf(c, 0):
		return runtime.Resources{}, errdefs.Newf(errdefs.ErrInvalidArgument, "resources.cpus: %v is not a finite number", c)
	case c < 0:
		return runtime.Resources{}, errdefs.Newf(errdefs.ErrInvalidArgument, "resources.cpus: %g must not be negative", c)
	}
	if mx := float64(s.m.Config().Admission.MaxResources.NanoCPUs) / 1e9; mx > 0 && c > mx {
		return runtime.Resources{}, errdefs.Newf(errdefs.ErrInvalidArgument, "resources.cpus: %g exceeds the maximum %g", c, mx)
	}
	if c*1e9 >= math.MaxInt64 {
		return runtime.Resources{}, errdefs.Newf(errdefs.ErrInvalidArgument, "resources.cpus: %g is too large", c)
	}
	return runtime.Resources{NanoCPUs: int64(c * 1e9), MemoryBytes: r.MemoryBytes, PidsLimit: r.Pids, DiskBytes: r.DiskBytes}, nil
}

func toState(s lease.State) orchv1.LeaseState {
	if v, ok := orchv1.LeaseState_value["LEASE_STATE_"+strings.ToUpper(string(s))]; ok {
		return orchv1.LeaseState(v)
	}
	return orchv1.LeaseState_LEASE_STATE_UNSPECIFIED
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func toTransition(t lease.Transition) *orchv1.Transition {
	return &orchv1.Transition{From: toState(t.From), To: toState(t.To), Reason: t.Reason, At: ts(t.At), Phase: string(t.Phase)}
}

// toLease converts a lease for the wire. Env is deliberately left out: it
// may hold secrets. Secrets show by name only (the lease has no values).
func toLease(l lease.Lease) *orchv1.Lease {
	out := &orchv1.Lease{
		Id: l.ID, ConversationId: l.ConversationID, Owner: l.Owner, Labels: l.Labels, Image: l.Image, User: l.User,
		Resources: &orchv1.Resources{Cpus: float64(l.Resources.NanoCPUs) / 1e9, MemoryBytes: l.Resources.MemoryBytes, Pids: l.Resources.PidsLimit,
			DiskBytes: l.Resources.DiskBytes},
		State: toState(l.State), Phase: string(l.Phase), Reason: l.Reason,
		CreatedAt: ts(l.CreatedAt), UpdatedAt: ts(l.UpdatedAt), ExpiresAt: ts(l.ExpiresAt), LastActivityAt: ts(l.LastActivityAt),
		Ttl: durationpb.New(l.TTL), IdleTimeout: durationpb.New(l.IdleTimeout),
		ContainerId: l.ContainerID, Endpoint: l.Endpoint, EndedAt: ts(l.EndedAt),
		Restarts: int32(min(l.Restarts, math.MaxInt32)),
		Paused:   string(l.Paused), PausedAt: ts(l.PausedAt), IdlePolicy: string(l.IdlePolicy),
		SecretNames: l.SecretNames,
		Pool:        l.Pool, // docs/pools.md
		WorkingDir:  l.WorkDir,
	}
	for _, p := range l.PublicPorts {
		out.PublicPorts = append(out.PublicPorts, int32(p))
	}
	if !l.Usage.MeasuredAt.IsZero() {
		out.Usage = &orchv1.Usage{DiskBytes: l.Usage.DiskBytes, MeasuredAt: ts(l.Usage.MeasuredAt)}
	}
	out.Warnings = l.Warnings
	setLeaseMounts(out, l) // volumes.go
	out.Network = toNetwork(l.Network)
	for _, t := range l.Transitions {
		out.Transitions = append(out.Transitions, toTransition(t))
	}
	out.TransitionsDropped = int64(l.TransitionsDropped)
	return out
}
