package lease

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/periodic"
)

// The disk limit (Resources.DiskBytes) where the engine cannot enforce it:
// the Manager measures each READY lease with a limit (Runtime.Usage), keeps
// the result in Lease.Usage and, past the limit, warns (Lease.Warnings; the
// proxy refuses uploads) and after Config.DiskGrace stops the sandbox and
// fails the lease, keeping the stopped container (Lease.KeepContainer) for
// an operator to copy the files out until Config.Retention has passed.

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

// diskMinInterval is the shortest interval between two measurements of one
// lease: a quarter of DiskInterval, at least 100ms (but not above
// DiskInterval).
func (m *Manager) diskMinInterval() time.Duration {
	return min(m.cfg.DiskInterval, max(m.cfg.DiskInterval/4, 100*time.Millisecond))
}

// diskLoop measures the due leases every tick until ctx ends, at most
// Config.DiskConcurrency at once.
func (m *Manager) diskLoop(ctx context.Context) {
	tick := min(max(m.diskMinInterval()/2, 10*time.Millisecond), time.Second)
	sem := make(chan struct{}, m.cfg.DiskConcurrency)
	periodic.Run(ctx, tick, func(ctx context.Context) { m.diskPass(ctx, sem) })
}

// diskPass starts the measurements that are due, the most overdue first,
// as long as a slot in sem is free; the others wait for the next pass.
func (m *Manager) diskPass(ctx context.Context, sem chan struct{}) {
	now := time.Now()
	var due []*entry
	m.mu.Lock()
	for _, e := range m.leases {
		if e.l.State == StateReady && e.l.Resources.DiskBytes > 0 && e.l.ContainerID != "" &&
			!e.disk.measuring && !now.Before(e.disk.next) && m.homeLocked(e) {
			due = append(due, e)
		}
	}
	slices.SortFunc(due, func(a, b *entry) int { return a.disk.next.Compare(b.disk.next) })
	type job struct {
		e   *entry
		cid string
	}
	var jobs []job
slots:
	for _, e := range due {
		select {
		case sem <- struct{}{}:
		default:
			break slots // none free: the rest wait for the next pass
		}
		e.disk.measuring = true
		jobs = append(jobs, job{e, e.l.ContainerID})
	}
	m.mu.Unlock()
	for _, j := range jobs {
		m.goBackground(func() {
			defer func() { <-sem }()
			m.measureDisk(ctx, j.e, j.cid)
		})
	}
}

// measureDisk measures one lease's sandbox and applies the policy.
func (m *Manager) measureDisk(ctx context.Context, e *entry, cid string) {
	mctx, cancel := context.WithTimeout(ctx, max(4*m.cfg.DiskInterval, 30*time.Second))
	u, err := m.rt.Usage(mctx, cid)
	cancel()
	real := time.Now()

	m.mu.Lock()
	e.disk.measuring = false
	if e.l.State != StateReady || e.l.ContainerID != cid {
		m.mu.Unlock()
		return
	}
	id, limit := e.l.ID, e.l.Resources.DiskBytes
	if err != nil {
		e.disk.next = real.Add(m.cfg.DiskInterval)
		m.mu.Unlock()
		if ctx.Err() == nil {
			m.log.Warn("measuring disk usage failed", "lease_id", id, "container_id", cid, "err", err)
		}
		return
	}
	used := u.DiskBytes
	e.l.Usage = Usage{DiskBytes: used, MeasuredAt: m.now()}
	e.disk.charged = 0
	var changed, stop bool
	var reason string
	if used > limit {
		if e.disk.overSince.IsZero() {
			e.disk.overSince = real
			m.log.Warn("sandbox over its disk limit", "lease_id", id, "container_id", cid, "disk_bytes", used, "limit_bytes", limit, "grace", m.cfg.DiskGrace)
		}
		changed = setDiskWarning(&e.l, DiskWarning(used, limit))
		if real.Sub(e.disk.overSince) >= m.cfg.DiskGrace {
			reason = DiskReason(used, limit)
			if m.transitionLocked(e, StateFailed, reason) == nil {
				e.l.KeepContainer = true
				m.diskStops++
				stop, changed = true, true
			}
		}
	} else {
		if !e.disk.overSince.IsZero() {
			m.log.Info("sandbox back under its disk limit", "lease_id", id, "container_id", cid, "disk_bytes", used, "limit_bytes", limit)
		}
		e.disk.overSince = time.Time{}
		changed = clearDiskWarning(&e.l)
	}
	e.disk.next = real.Add(m.nextDiskInterval(e, used, limit, real))
	e.disk.last, e.disk.lastAt = used, real
	m.diskMeasurements++
	var l Lease
	var rev uint64
	if changed {
		// Usage alone is not written (a write per measurement would hammer
		// the store); a warning that appears or clears is.
		e.rev++
		if !stop {
			m.emitLocked(e, nil)
		}
		l, rev = e.snapshot()
	}
	m.mu.Unlock()
	if changed {
		_ = m.persist(l, rev)
	}
	if stop {
		m.stopForDisk(ctx, e, id, cid, reason)
	}
}

// stopForDisk stops the container of a lease failed past its disk limit,
// keeping it. If it cannot be stopped (after three attempts) it is removed
// instead: a sandbox that keeps writing must not fill the host.
func (m *Manager) stopForDisk(ctx context.Context, e *entry, id, cid, reason string) {
	m.log.Warn("stopping sandbox past its disk limit; the container is kept", "lease_id", id, "container_id", cid, "reason", reason)
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(attempt) * time.Second):
			}
		}
		sctx, cancel := detached(ctx, m.cfg.RemoveTimeout)
		err = m.rt.Stop(sctx, cid, diskStopGrace)
		cancel()
		if err == nil {
			return
		}
	}
	m.log.Error("stopping sandbox past its disk limit failed; removing it", "lease_id", id, "container_id", cid, "err", err)
	m.mu.Lock()
	e.l.KeepContainer = false
	e.rev++
	m.enqueueCleanLocked(e)
	l, rev := e.snapshot()
	m.mu.Unlock()
	_ = m.persist(l, rev)
}

// nextDiskInterval picks the wait before e's next measurement: short near,
// over or heading for the limit (at the rate of the last two measurements),
// relaxed when far below it and unchanged. Called with mu held.
func (m *Manager) nextDiskInterval(e *entry, used, limit int64, now time.Time) time.Duration {
	base, lo := m.cfg.DiskInterval, m.diskMinInterval()
	if used > limit {
		// Check again in time for the end of the grace period.
		left := e.disk.overSince.Add(m.cfg.DiskGrace).Sub(now)
		return max(min(lo, left), 10*time.Millisecond)
	}
	if used >= limit/10*8 {
		return lo
	}
	grew := used - e.disk.last
	if dt := now.Sub(e.disk.lastAt); !e.disk.lastAt.IsZero() && grew > 0 && dt > 0 {
		e.disk.every = 0
		// Half the time the limit would take to reach at this rate.
		eta := time.Duration(float64(limit-used) / float64(grew) * float64(dt))
		return min(max(eta/2, lo), base)
	}
	if used < limit/2 && !e.disk.lastAt.IsZero() && abs(grew) <= limit/100 {
		e.disk.every = min(max(2*e.disk.every, base), 4*base)
		return e.disk.every
	}
	e.disk.every = 0
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
func (m *Manager) ChargeDisk(id string, n int64) {
	if n <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.leases[id]
	if e == nil || e.l.State != StateReady || e.l.Resources.DiskBytes <= 0 {
		return
	}
	e.disk.charged += n
	if soon := time.Now().Add(m.diskMinInterval()); e.disk.next.After(soon) {
		e.disk.next = soon
	}
}

// keptLocked reports whether e's container is being kept after its lease
// ended (Lease.KeepContainer) and its time is not up: Config.Retention
// after EndedAt, or 1h when Retention keeps records forever. Reconcile,
// resync and the reaper leave such a container alone. Called with mu held.
func (m *Manager) keptLocked(e *entry, now time.Time) bool {
	if !e.l.KeepContainer || e.l.Cleaned || !e.l.State.Ended() {
		return false
	}
	keep := m.cfg.Retention
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
func (m *Manager) DiskStats() DiskStats {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := DiskStats{Measurements: m.diskMeasurements, Stops: m.diskStops}
	for _, e := range m.leases {
		switch {
		case e.l.State == StateReady && e.l.Resources.DiskBytes > 0:
			s.Limited++
			s.UsedBytes += e.l.Usage.DiskBytes
			if !e.disk.overSince.IsZero() {
				s.Over++
			}
		case m.keptLocked(e, now):
			s.Kept++
		}
	}
	return s
}
