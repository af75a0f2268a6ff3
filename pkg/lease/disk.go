package lease

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/periodic"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// The disk limit (Resources.DiskBytes) where the engine cannot enforce it:
// the Manager measures each READY lease with a limit (Runtime.Usage), keeps
// the result in Lease.Usage and, past the limit, warns (Lease.Warnings; the
// proxy refuses uploads) and after DiskConfig.Grace stops the sandbox and
// fails the lease, keeping the stopped container (FAILED/PhaseKept) for
// an operator to copy the files out until Config.Retention has passed. The
// diskEnforcer does it; Config.Disk configures it.

// DiskConfig configures the enforcement of the disk limit where the engine
// cannot enforce it (disk.go). Zero fields take the defaults
// (DefaultDiskConfig).
type DiskConfig struct {
	// Interval is the base interval between two measurements of a READY
	// lease's disk usage (only leases with Resources.DiskBytes are
	// measured). It adapts per lease: down to a quarter of it (at least
	// 100ms) when the usage is near or over the limit or growing towards
	// it, up to four times it when the usage is far below the limit and
	// unchanged. Default 15s.
	Interval time.Duration
	// Concurrency bounds the measurements running at once (each makes the
	// engine walk a writable layer). Default 2; negative takes the default
	// too.
	Concurrency int
	// Grace is how long a lease may stay over its disk limit (with a
	// warning, uploads refused) before berth stops its sandbox and fails
	// the lease. Default 30s.
	Grace time.Duration
}

// DefaultDiskConfig returns the defaults of DiskConfig.
func DefaultDiskConfig() DiskConfig {
	return DiskConfig{Interval: 15 * time.Second, Concurrency: 2, Grace: 30 * time.Second}
}

// withDefaults returns c with its zero fields (and a negative Concurrency)
// taken from DefaultDiskConfig, validated.
func (c DiskConfig) withDefaults() (DiskConfig, error) {
	d := DefaultDiskConfig()
	if c.Interval == 0 {
		c.Interval = d.Interval
	}
	if c.Concurrency <= 0 {
		c.Concurrency = d.Concurrency
	}
	if c.Grace == 0 {
		c.Grace = d.Grace
	}
	return c, c.Validate()
}

// Validate reports the first field that cannot work (an
// errdefs.ErrInvalidArgument naming it): every field must be positive. A
// Config's zero fields are filled with the defaults before it is checked;
// a caller without defaults (the orchestrator's configuration) checks its
// own values as they are.
func (c DiskConfig) Validate() error {
	switch {
	case c.Interval <= 0:
		return errdefs.InvalidArgument("disk_interval", "must be positive, got %s", c.Interval)
	case c.Grace <= 0:
		return errdefs.InvalidArgument("disk_grace", "must be positive, got %s", c.Grace)
	case c.Concurrency <= 0:
		return errdefs.InvalidArgument("disk_concurrency", "must be positive, got %d", c.Concurrency)
	}
	return nil
}

// diskWarningPrefix starts the warning of a lease over its disk limit.
const diskWarningPrefix = "disk limit exceeded: "

// DiskWarning is the warning of a lease whose sandbox uses used bytes of
// its limit of limit bytes.
func DiskWarning(used, limit int64) string {
	return fmt.Sprintf("%s%d of %d bytes", diskWarningPrefix, used, limit)
}

// DiskReason is the reason of a lease failed past its disk limit.
func DiskReason(used, limit int64) string {
	return fmt.Sprintf("disk limit exceeded (%d > %d bytes)", used, limit)
}

// diskStopGrace is the SIGTERM grace of a sandbox stopped past its limit.
const diskStopGrace = 2 * time.Second

// diskHost is what the diskEnforcer needs from the Manager; *Manager
// implements it. Every method ending in Locked is called with the
// Manager's mu held.
type diskHost interface {
	// transitionPhaseLocked moves e to a state and phase (manager.go).
	transitionPhaseLocked(e *entry, to State, p Phase, reason string) error
	// setPhaseLocked changes e's phase within its state (manager.go).
	setPhaseLocked(e *entry, p Phase) error
	// persist writes a snapshot of a lease (manager.go).
	persist(l Lease, rev uint64) error
	// goBackground runs f in a goroutine Close waits for (manager.go).
	goBackground(f func())
	// now is the lease clock (manager.go).
	now() time.Time
}

// diskRuntime is the part of Runtime the diskEnforcer uses.
type diskRuntime interface {
	Usage(ctx context.Context, id string) (runtime.Usage, error)
	Stop(ctx context.Context, id string, grace time.Duration) error
}

// diskEnforcer measures the READY leases with a disk limit and applies the
// policy (see the top of this file). Its state is guarded by the Manager's
// mu, which guards the leases it reads.
type diskEnforcer struct {
	cfg  DiskConfig
	host diskHost
	// hub tells the watchers of a lease's change (events.go).
	hub *hub
	rt  diskRuntime
	log *slog.Logger
	// retention is Config.Retention (keptLocked); removeTimeout
	// Config.RemoveTimeout (stopForDisk).
	retention, removeTimeout time.Duration

	mu     *sync.Mutex       // the Manager's
	leases map[string]*entry // the Manager's, read with mu held
	// fleet says whether this replica measures a lease (its home,
	// replicas.go); queue takes the removals of the leases it fails
	// (work.go). New sets both.
	fleet *fleet
	queue *workQueue
	// states is the bookkeeping of the leases measured or charged; an
	// entry's goes with the entry (prune).
	states map[*entry]*diskState
	// measurements and stops count disk measurements and sandboxes
	// stopped past their disk limit since New.
	measurements, stops uint64
}

// newDiskEnforcer returns the enforcer of a Manager: cfg has its defaults
// applied; hub, mu and leases are the Manager's.
func newDiskEnforcer(cfg Config, host diskHost, hub *hub, mu *sync.Mutex, leases map[string]*entry) *diskEnforcer {
	return &diskEnforcer{cfg: cfg.Disk, host: host, hub: hub, rt: cfg.Runtime, log: cfg.Logger,
		retention: cfg.Retention, removeTimeout: cfg.RemoveTimeout,
		mu: mu, leases: leases, states: map[*entry]*diskState{}}
}

// diskState is an entry's measurement bookkeeping (real clock, not
// persisted). Guarded by Manager.mu.
type diskState struct {
	next      time.Time     // next measurement due (zero: at once)
	measuring bool          // a measurement is running
	last      int64         // the previous measurement
	lastAt    time.Time     // when it was taken
	every     time.Duration // the current relaxed interval (far and unchanged)
	overSince time.Time     // first measurement over the limit in this episode
	charged   int64         // bytes uploads added since the last measurement
}

// stateLocked returns e's bookkeeping, created empty on first use. Called
// with mu held.
func (d *diskEnforcer) stateLocked(e *entry) *diskState {
	st := d.states[e]
	if st == nil {
		st = &diskState{}
		d.states[e] = st
	}
	return st
}

// chargedLocked is what uploads added to e's usage since its last
// measurement (Route.DiskUsed). Called with mu held.
func (d *diskEnforcer) chargedLocked(e *entry) int64 {
	if st := d.states[e]; st != nil {
		return st.charged
	}
	return 0
}

// pruneLocked drops the bookkeeping of entries that ended (never measured
// again) or left the Manager. Called with mu held.
func (d *diskEnforcer) pruneLocked() {
	for e := range d.states {
		if e.l.State.Ended() || d.leases[e.l.ID] != e {
			delete(d.states, e)
		}
	}
}

// minInterval is the shortest interval between two measurements of one
// lease: a quarter of DiskConfig.Interval, at least 100ms (but not above
// Interval).
func (d *diskEnforcer) minInterval() time.Duration {
	return min(d.cfg.Interval, max(d.cfg.Interval/4, 100*time.Millisecond))
}

// loop measures the due leases every tick until ctx ends, at most
// DiskConfig.Concurrency at once.
func (d *diskEnforcer) loop(ctx context.Context) {
	tick := min(max(d.minInterval()/2, 10*time.Millisecond), time.Second)
	sem := make(chan struct{}, d.cfg.Concurrency)
	periodic.Run(ctx, tick, func(ctx context.Context) { d.pass(ctx, sem) })
}

// pass starts the measurements that are due, the most overdue first, as
// long as a slot in sem is free; the others wait for the next pass.
func (d *diskEnforcer) pass(ctx context.Context, sem chan struct{}) {
	now := time.Now()
	type cand struct {
		e    *entry
		next time.Time
	}
	var due []cand
	d.mu.Lock()
	d.pruneLocked()
	for _, e := range d.leases {
		if e.l.State != StateReady || e.l.Resources.DiskBytes <= 0 || e.l.ContainerID == "" {
			continue
		}
		var next time.Time
		if st := d.states[e]; st != nil {
			if st.measuring {
				continue
			}
			next = st.next
		}
		if !now.Before(next) && d.fleet.homeLocked(e) {
			due = append(due, cand{e, next})
		}
	}
	slices.SortFunc(due, func(a, b cand) int { return a.next.Compare(b.next) })
	type job struct {
		e   *entry
		cid string
	}
	var jobs []job
slots:
	for _, c := range due {
		select {
		case sem <- struct{}{}:
		default:
			break slots // none free: the rest wait for the next pass
		}
		d.stateLocked(c.e).measuring = true
		jobs = append(jobs, job{c.e, c.e.l.ContainerID})
	}
	d.mu.Unlock()
	for _, j := range jobs {
		d.host.goBackground(func() {
			defer func() { <-sem }()
			d.measure(ctx, j.e, j.cid)
		})
	}
}

// measure measures one lease's sandbox and applies the policy.
func (d *diskEnforcer) measure(ctx context.Context, e *entry, cid string) {
	mctx, cancel := context.WithTimeout(ctx, max(4*d.cfg.Interval, 30*time.Second))
	u, err := d.rt.Usage(mctx, cid)
	cancel()
	real := time.Now()

	d.mu.Lock()
	st := d.stateLocked(e)
	st.measuring = false
	if e.l.State != StateReady || e.l.ContainerID != cid {
		d.mu.Unlock()
		return
	}
	id, limit := e.l.ID, e.l.Resources.DiskBytes
	if err != nil {
		st.next = real.Add(d.cfg.Interval)
		d.mu.Unlock()
		if ctx.Err() == nil {
			d.log.Warn("measuring disk usage failed", "lease_id", id, "container_id", cid, "err", err)
		}
		return
	}
	used := u.DiskBytes
	e.l.Usage = Usage{DiskBytes: used, MeasuredAt: d.host.now()}
	st.charged = 0
	var changed, stop bool
	var reason string
	if used > limit {
		if st.overSince.IsZero() {
			st.overSince = real
			d.log.Warn("sandbox over its disk limit", "lease_id", id, "container_id", cid, "disk_bytes", used, "limit_bytes", limit, "grace", d.cfg.Grace)
		}
		changed = setDiskWarning(&e.l, DiskWarning(used, limit))
		if real.Sub(st.overSince) >= d.cfg.Grace {
			reason = DiskReason(used, limit)
			if d.host.transitionPhaseLocked(e, StateFailed, PhaseKept, reason) == nil {
				d.stops++
				stop, changed = true, true
			}
		}
	} else {
		if !st.overSince.IsZero() {
			d.log.Info("sandbox back under its disk limit", "lease_id", id, "container_id", cid, "disk_bytes", used, "limit_bytes", limit)
		}
		st.overSince = time.Time{}
		changed = clearDiskWarning(&e.l)
	}
	st.next = real.Add(d.nextInterval(st, used, limit, real))
	st.last, st.lastAt = used, real
	d.measurements++
	var l Lease
	var rev uint64
	if changed {
		// Usage alone is not written (a write per measurement would hammer
		// the store); a warning that appears or clears is.
		e.rev++
		if !stop {
			d.hub.emitLocked(e, nil)
		}
		l, rev = e.snapshot()
	}
	d.mu.Unlock()
	if changed {
		_ = d.host.persist(l, rev)
	}
	if stop {
		d.stopForDisk(ctx, e, id, cid, reason)
	}
}

// stopForDisk stops the container of a lease failed past its disk limit,
// keeping it. If it cannot be stopped (after three attempts) it is removed
// instead: a sandbox that keeps writing must not fill the host.
func (d *diskEnforcer) stopForDisk(ctx context.Context, e *entry, id, cid, reason string) {
	d.log.Warn("stopping sandbox past its disk limit; the container is kept", "lease_id", id, "container_id", cid, "reason", reason)
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(attempt) * time.Second):
			}
		}
		sctx, cancel := detached(ctx, d.removeTimeout)
		err = d.rt.Stop(sctx, cid, diskStopGrace)
		cancel()
		if err == nil {
			return
		}
	}
	d.log.Error("stopping sandbox past its disk limit failed; removing it", "lease_id", id, "container_id", cid, "err", err)
	d.mu.Lock()
	_ = d.host.setPhaseLocked(e, PhaseNone) // FAILED/kept → FAILED
	d.queue.addRemovalLocked(e)             // work.go
	l, rev := e.snapshot()
	d.mu.Unlock()
	_ = d.host.persist(l, rev)
}

// nextInterval picks the wait before the next measurement of a lease with
// bookkeeping st: short near, over or heading for the limit (at the rate
// of the last two measurements), relaxed when far below it and unchanged.
// Called with mu held.
func (d *diskEnforcer) nextInterval(st *diskState, used, limit int64, now time.Time) time.Duration {
	base, lo := d.cfg.Interval, d.minInterval()
	if used > limit {
		// Check again in time for the end of the grace period.
		left := st.overSince.Add(d.cfg.Grace).Sub(now)
		return max(min(lo, left), 10*time.Millisecond)
	}
	if used >= limit/10*8 {
		return lo
	}
	grew := used - st.last
	if dt := now.Sub(st.lastAt); !st.lastAt.IsZero() && grew > 0 && dt > 0 {
		st.every = 0
		// Half the time the limit would take to reach at this rate.
		eta := time.Duration(float64(limit-used) / float64(grew) * float64(dt))
		return min(max(eta/2, lo), base)
	}
	if used < limit/2 && !st.lastAt.IsZero() && abs(grew) <= limit/100 {
		st.every = min(max(2*st.every, base), 4*base)
		return st.every
	}
	st.every = 0
	return base
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// setDiskWarning puts w in place of l's disk warning and reports whether
// there was none before.
func setDiskWarning(l *Lease, w string) bool {
	for i, x := range l.Warnings {
		if strings.HasPrefix(x, diskWarningPrefix) {
			l.Warnings[i] = w
			return false
		}
	}
	l.Warnings = append(l.Warnings, w)
	return true
}

// clearDiskWarning removes l's disk warning and reports whether it had one.
func clearDiskWarning(l *Lease) bool {
	n := len(l.Warnings)
	l.Warnings = slices.DeleteFunc(l.Warnings, func(x string) bool { return strings.HasPrefix(x, diskWarningPrefix) })
	if len(l.Warnings) == 0 {
		l.Warnings = nil
	}
	return len(l.Warnings) != n
}

// ChargeDisk adds n bytes that an upload just wrote to lease id's estimated
// disk usage (Route.DiskUsed) until the next measurement, which it brings
// forward. The proxy calls it after a successful upload so that uploads in
// quick succession cannot all pass against one stale measurement. Unknown
// leases and leases without a limit are ignored.
func (m *Manager) ChargeDisk(id string, n int64) { m.disk.charge(id, n) }

// charge is ChargeDisk.
func (d *diskEnforcer) charge(id string, n int64) {
	if n <= 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.leases[id]
	if e == nil || e.l.State != StateReady || e.l.Resources.DiskBytes <= 0 {
		return
	}
	st := d.stateLocked(e)
	st.charged += n
	if soon := time.Now().Add(d.minInterval()); st.next.After(soon) {
		st.next = soon
	}
}

// keptLocked reports whether e's container is being kept after its lease
// failed (PhaseKept) and its time is not up: Config.Retention
// after EndedAt, or 1h when Retention keeps records forever. Reconcile,
// resync and the reaper leave such a container alone. Called with mu held.
func (d *diskEnforcer) keptLocked(e *entry, now time.Time) bool {
	if e.l.Phase != PhaseKept || e.l.Cleaned || !e.l.State.Ended() {
		return false
	}
	keep := d.retention
	if keep < 0 {
		keep = time.Hour
	}
	return now.Sub(e.l.EndedAt) < keep
}

// DiskStats are the disk limit's figures for metrics.
type DiskStats struct {
	// Limited counts READY leases with a disk limit; Over those whose last
	// measurement was over it.
	Limited, Over int
	// UsedBytes sums the last measured usage of READY leases with a limit.
	UsedBytes int64
	// Measurements counts measurements since the Manager was created;
	// Stops the sandboxes stopped past their limit.
	Measurements, Stops uint64
	// Kept counts ended leases whose stopped container is being kept.
	Kept int
}

// DiskStats returns the disk limit's figures.
func (m *Manager) DiskStats() DiskStats { return m.disk.stats() }

// stats is DiskStats.
func (d *diskEnforcer) stats() DiskStats {
	now := d.host.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	s := DiskStats{Measurements: d.measurements, Stops: d.stops}
	for _, e := range d.leases {
		switch {
		case e.l.State == StateReady && e.l.Resources.DiskBytes > 0:
			s.Limited++
			s.UsedBytes += e.l.Usage.DiskBytes
			if st := d.states[e]; st != nil && !st.overSince.IsZero() {
				s.Over++
			}
		case d.keptLocked(e, now):
			s.Kept++
		}
	}
	return s
}
