package lease

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Draining takes an orchestrator out of service (an operator taking a host
// out): Drain sets the Manager draining, which
//
//   - refuses, with errdefs.ErrUnavailable, every acquire that would create
//     a lease (one that returns the conversation's live lease, or joins its
//     creation, still works: Acquire's hook) and every resume of a PAUSED
//     lease (Resume's hook; that includes the proxy's transparent resume
//     and an acquire of a paused conversation), so that nothing wakes a
//     drained sandbox again;
//   - empties the warm pools and stops refilling them (poolSet.fill's hook);
//
// and then hibernates or releases every live lease homed here. Draining is
// kept in memory only: it lasts until the Manager closes, and the next
// Start accepts acquires again (its leases — hibernated ones included —
// are adopted as after any restart). UNAVAILABLE rather than
// FAILED_PRECONDITION because the refusal is about this orchestrator, not
// the request: another replica, or this one after its restart, takes it.

// DrainMode is what Drain does to each live lease.
type DrainMode string

// Drain modes.
const (
	// DrainHibernate pauses each READY lease with PauseHibernate: its
	// container stops, its files stay, and it resumes (in place) once the
	// host and the orchestrator are back. Hibernate rather than freeze: a
	// frozen sandbox's memory does not survive the host going down, and
	// freezing frees nothing. A lease already PAUSED (either way) stays as
	// it is; a PENDING one is hibernated once it is READY.
	DrainHibernate DrainMode = "hibernate"
	// DrainRelease releases each live lease and removes its sandbox, as
	// Release does.
	DrainRelease DrainMode = "release"
)

// ReasonDrained is the default reason recorded on DrainRelease's releases.
const ReasonDrained = "drained by operator"

// ParseDrainMode parses "hibernate" or "release" (case-insensitively).
// Anything else, "" included, is errdefs.ErrInvalidArgument naming field:
// the choice between keeping and dropping every sandbox is not defaulted.
func ParseDrainMode(field, s string) (DrainMode, error) {
	switch m := DrainMode(strings.ToLower(strings.TrimSpace(s))); m {
	case DrainHibernate, DrainRelease:
		return m, nil
	case "":
		return "", errdefs.InvalidArgument(field, "required: hibernate or release")
	}
	return "", errdefs.InvalidArgument(field, "unknown drain mode %q (want hibernate or release)", s)
}

// drainHost is what the drainer needs from the Manager (implemented by
// *Manager): admission of the call, and the lease operations a drain does.
// enterLocked is called with the Manager's mu held, the others without it.
type drainHost interface {
	// enterLocked admits a call Close waits for; the drainer's done ends
	// it (manager.go).
	enterLocked() error
	Get(ctx context.Context, id string) (Lease, error)                   // manager.go
	Subscribe(ctx context.Context, f EventFilter) <-chan Event           // events.go
	Pause(ctx context.Context, id string, mode PauseMode) (Lease, error) // pause.go
	Release(ctx context.Context, id, reason string) (Lease, error)       // ops.go
}

var _ drainHost = (*Manager)(nil)

// drainer is Drain (see above): the Manager's draining flag and the drain
// of its leases. It shares the Manager's mu and leases map; the acquire
// path, the pauser and the warm pools ask it whether they may go on
// (drainingLocked, refusalLocked).
type drainer struct {
	host drainHost
	log  *slog.Logger
	// done ends a call enterLocked admitted (the Manager's wg.Done).
	done func()
	// concurrency is Config.ReapConcurrency: it bounds the leases drained
	// at once.
	concurrency int

	mu     *sync.Mutex       // the Manager's
	leases map[string]*entry // the Manager's, read with mu held
	// fleet says which leases are homed here (replicas.go); pools are
	// emptied (pool.go).
	fleet *fleet
	pools *poolSet

	// on is the draining flag, guarded by mu. It is set by the first
	// Drain and never cleared.
	on bool
}

// newDrainer returns the drainer of a Manager configured by cfg (defaults
// applied): host is the Manager, done its wg.Done, mu and leases its own,
// fleet and pools its components.
func newDrainer(cfg Config, host drainHost, done func(), mu *sync.Mutex, leases map[string]*entry, fleet *fleet, pools *poolSet) *drainer {
	return &drainer{host: host, log: cfg.Logger, done: done, concurrency: cfg.ReapConcurrency,
		mu: mu, leases: leases, fleet: fleet, pools: pools}
}

// DrainFailure is a lease that Drain left as it was.
type DrainFailure struct {
	// LeaseID is the lease's id.
	LeaseID string
	// Err is why: the pause's or the release's error, category kept.
	Err error
}

// DrainResult is what Drain did; both lists are sorted by lease id.
type DrainResult struct {
	// Drained are the leases hibernated (or PAUSED already), released, or
	// ended while the drain ran.
	Drained []string
	// Failed are the leases whose pause or release failed.
	Failed []DrainFailure
}

// Draining reports whether Drain was called since Start.
func (m *Manager) Draining() bool { return m.drain.draining() }

// draining reports whether Drain was called (Manager.Draining).
func (d *drainer) draining() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.on
}

// drainingLocked reports whether Drain was called. Called with mu held.
func (d *drainer) drainingLocked() bool { return d.on }

// refusalLocked is the error of a call refused while draining (what:
// "acquire", "resume lease ID"), or nil when not draining. Called with mu
// held.
func (d *drainer) refusalLocked(what string) error {
	if !d.on {
		return nil
	}
	return errdefs.Unavailable("%s: this orchestrator is draining (taken out of service by the operator) and takes no new or resumed sandboxes until it restarts", what)
}

// Drain sets the Manager draining (see above) and then hibernates or
// releases, as mode says, every live lease homed on this replica (all of
// them without a SharedStore), at most Config.ReapConcurrency at a time.
// It waits for them, bounded by ctx: when ctx ends it returns what it did so
// far and ctx's error. A lease whose pause or release fails is listed in
// Failed and left as it was; calling Drain again tries the leases still
// live. reason is recorded on DrainRelease's releases (default
// ReasonDrained). An unknown mode is errdefs.ErrInvalidArgument naming
// "mode"; a Manager not running is errdefs.ErrUnavailable.
func (m *Manager) Drain(ctx context.Context, mode DrainMode, reason string) (DrainResult, error) {
	return m.drain.drain(ctx, mode, reason)
}

// drain is Manager.Drain.
func (d *drainer) drain(ctx context.Context, mode DrainMode, reason string) (DrainResult, error) {
	if mode != DrainHibernate && mode != DrainRelease {
		return DrainResult{}, errdefs.InvalidArgument("mode", "unknown drain mode %q (want hibernate or release)", string(mode))
	}
	if reason = SanitizeText(reason, MaxReasonLen); reason == "" {
		reason = ReasonDrained
	}
	d.mu.Lock()
	if err := d.host.enterLocked(); err != nil {
		d.mu.Unlock()
		return DrainResult{}, err
	}
	defer d.done()
	first := !d.on
	d.on = true
	var ids []string
	for id, e := range d.leases {
		if e.l.State.Live() && d.fleet.homeLocked(e) {
			ids = append(ids, id)
		}
	}
	d.mu.Unlock()
	if first {
		d.log.Warn("draining: new leases and resumes are refused until restart; warm pools empty", "mode", string(mode))
	}
	d.pools.kick() // pool.go: the pool loop trims the pools now
	slices.Sort(ids)

	errs := make([]error, len(ids))
	sem := make(chan struct{}, d.concurrency)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if mode == DrainRelease {
				_, errs[i] = d.host.Release(ctx, id, reason)
			} else {
				errs[i] = d.hibernate(ctx, id)
			}
		}()
	}
	wg.Wait()

	var res DrainResult
	for i, id := range ids {
		if errs[i] == nil {
			res.Drained = append(res.Drained, id)
			continue
		}
		res.Failed = append(res.Failed, DrainFailure{LeaseID: id, Err: errs[i]})
		d.log.Warn("drain: lease left as it was", "lease_id", id, "mode", string(mode), "err", errs[i])
	}
	d.log.Info("drained leases", "mode", string(mode), "drained", len(res.Drained), "failed", len(res.Failed))
	return res, ctx.Err()
}

// hibernate brings live lease id to PAUSED (or lets it end): a READY
// lease is hibernated, a PENDING one (being created or restarted) is
// waited for, one PAUSED, RELEASING or ended is left alone.
func (d *drainer) hibernate(ctx context.Context, id string) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Subscribed before each look, so that no change is missed in between.
	events := d.host.Subscribe(sctx, EventFilter{LeaseID: id})
	for {
		l, err := d.host.Get(ctx, id)
		if err != nil {
			return err
		}
		switch l.State {
		case StateReady:
			_, err := d.host.Pause(ctx, id, PauseHibernate)
			if err == nil {
				return nil
			}
			// Something else moved it first (an idle pause, an expiry): look
			// again; a lease still READY is a real failure.
			if now, gerr := d.host.Get(ctx, id); gerr == nil && now.State != StateReady {
				continue
			}
			return err
		case StatePending:
			select {
			case _, ok := <-events:
				if !ok {
					if err := ctx.Err(); err != nil {
						return err
					}
					return errdefs.Unavailable("drain: stopped waiting for PENDING lease %s: its events ended (the lease manager is closing)", id)
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		default: // PAUSED, RELEASING or ended: nothing runs, or soon will not
			return nil
		}
	}
}
