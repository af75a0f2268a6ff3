package kubernetes

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// DefaultLeaderLease is the coordination.k8s.io Lease the replicas of one
// fleet elect their leader with.
const DefaultLeaderLease = "berth-leader"

// Election configures RunElected. Zero durations take client-go's usual
// values (15 s, 10 s, 2 s): a leader that dies without releasing is
// replaced within about LeaseDuration + RetryPeriod.
type Election struct {
	// Lease names the Lease object; default DefaultLeaderLease.
	Lease string
	// Identity names this replica in the Lease (holderIdentity); required
	// and unique per replica (e.g. the orchestrator's instance id).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's
	// leader-election timings.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Release gives the Lease up when ctx ends, so that another replica
	// takes over at once rather than after LeaseDuration.
	Release bool
}

// RunElected takes part in the election of one leader among the
// orchestrator replicas that share the namespace, over a
// coordination.k8s.io Lease, until ctx ends: while this replica leads,
// lead runs with a context that ends when it stops leading (then lead must
// return; RunElected campaigns again). RunLeader uses it to run expiry and
// reaping on one replica at a time. It returns ctx's error.
func (r *Runtime) RunElected(ctx context.Context, e Election, lead func(ctx context.Context)) error {
	if e.Identity == "" {
		return errdefs.InvalidArgument("identity", "is required")
	}
	if e.Lease == "" {
		e.Lease = DefaultLeaderLease
	}
	if e.LeaseDuration <= 0 {
		e.LeaseDuration = 15 * time.Second
	}
	if e.RenewDeadline <= 0 {
		e.RenewDeadline = 10 * time.Second
	}
	if e.RetryPeriod <= 0 {
		e.RetryPeriod = 2 * time.Second
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: e.Lease, Namespace: r.cfg.Namespace},
		Client:     r.cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.LeaseDuration,
			RenewDeadline:   e.RenewDeadline,
			RetryPeriod:     e.RetryPeriod,
			ReleaseOnCancel: e.Release,
			Name:            e.Lease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: lead,
				OnStoppedLeading: func() {},
				OnNewLeader: func(id string) {
					r.log.Info("kubernetes: leader elected", "lease", e.Lease, "leader", id, "self", id == e.Identity)
				},
			},
		})
		if err != nil {
			return errdefs.InvalidArgument("election", "%v", err)
		}
		le.Run(ctx) // returns when ctx ends or leadership is lost
	}
	return ctx.Err()
}

// RunLeader runs lead while this replica is the elected one among the
// orchestrators of the namespace (RunElected over the DefaultLeaderLease
// Lease, client-go's usual timings, the Lease released on shutdown so that
// another replica takes over at once), until ctx ends. identity names the
// replica (its instance id). It is the lease manager's FleetConfig.Elect: expiry
// and reaping run on one replica at a time.
func (r *Runtime) RunLeader(ctx context.Context, identity string, lead func(ctx context.Context)) error {
	return r.RunElected(ctx, Election{Lease: r.cfg.LeaderLease, Identity: identity, LeaseDuration: r.cfg.LeaderLeaseDuration,
		RenewDeadline: r.cfg.LeaderLeaseDuration * 2 / 3, RetryPeriod: r.cfg.LeaderLeaseDuration / 7, Release: true}, lead)
}

// LeaderOf returns the replica holding the election Lease named lease
// ("" when nobody does).
func (r *Runtime) LeaderOf(ctx context.Context, lease string) (string, error) {
	l, err := r.cs.CoordinationV1().Leases(r.cfg.Namespace).Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		return "", r.apiErr(err, "get lease", lease)
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// LeaderLeaseOf is the name of the coordination.k8s.io Lease the replicas
// of fleet elect their leader with: DefaultLeaderLease for the fleet
// "default" (or ""), else DefaultLeaderLease + "-" + fleet.
func LeaderLeaseOf(fleet string) string {
	if fleet == "" || fleet == "default" {
		return DefaultLeaderLease
	}
	return DefaultLeaderLease + "-" + fleet
}
