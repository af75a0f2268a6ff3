package lease

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

const mib = 1 << 20

func diskHarness(t *testing.T, grace time.Duration, tweak func(*Config)) *harness {
	return newHarness(t, func(c *Config) {
		c.Disk.Interval = 40 * time.Millisecond
		c.Disk.Grace = grace
		c.Admission.DefaultResources.DiskBytes = 10 * mib
		if tweak != nil {
			tweak(c)
		}
	})
}

func (h *harness) acquireWith(conv string, res runtime.Resources) Lease {
	h.t.Helper()
	l, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: conv, Resources: res})
	if err != nil {
		h.t.Fatalf("acquire %s: %v", conv, err)
	}
	return l
}

// stored reads a lease's record from the store.
func (h *harness) stored(id string) Lease {
	h.t.Helper()
	l, err := h.store.Get(id)
	if err != nil {
		h.t.Fatalf("store get %s: %v", id, err)
	}
	return l
}

// watchSees reports whether an event already sent on ch matches pred.
func watchSees(t *testing.T, ch <-chan Event, pred func(Lease) bool) bool {
	t.Helper()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return false
			}
			if pred(ev.Lease) {
				return true
			}
		case <-time.After(time.Second):
			return false
		}
	}
}

func hasDiskWarning(l Lease) bool {
	return slices.ContainsFunc(l.Warnings, func(w string) bool { return strings.HasPrefix(w, diskWarningPrefix) })
}

func TestDiskDefaultLimitAndUsage(t *testing.T) {
	h := diskHarness(t, time.Hour, nil)
	l, _ := h.acquire("c1")
	if l.Resources.DiskBytes != 10*mib {
		t.Fatalf("disk limit = %d, want the default %d", l.Resources.DiskBytes, 10*mib)
	}
	own := h.acquireWith("c2", runtime.Resources{DiskBytes: 50 * mib})
	if own.Resources.DiskBytes != 50*mib {
		t.Fatalf("disk limit = %d, want the requested %d", own.Resources.DiskBytes, 50*mib)
	}
	h.rt.setUsage(l.ContainerID, 3*mib)
	eventually(t, 2*time.Second, "usage measured", func() bool {
		u := h.get(l.ID).Usage
		return u.DiskBytes == 3*mib && !u.MeasuredAt.IsZero()
	})
	r, err := h.m.Route(l.ID)
	if err != nil || r.DiskLimit != 10*mib || r.DiskUsed != 3*mib {
		t.Fatalf("route = %+v, %v; want limit 10 MiB, used 3 MiB", r, err)
	}
	if _, _, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c3", Resources: runtime.Resources{DiskBytes: -1}}); err == nil || !strings.Contains(err.Error(), "resources.disk_bytes") {
		t.Fatalf("negative disk: err = %v, want one naming resources.disk_bytes", err)
	}
}

func TestDiskNoLimitIsNotMeasured(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Disk.Interval = 20 * time.Millisecond })
	l, _ := h.acquire("c1")
	if l.Resources.DiskBytes != 0 {
		t.Fatalf("disk limit = %d, want none", l.Resources.DiskBytes)
	}
	time.Sleep(200 * time.Millisecond)
	h.rt.mu.Lock()
	calls := h.rt.usageCalls
	h.rt.mu.Unlock()
	if calls != 0 {
		t.Fatalf("Usage called %d times for a lease without a limit", calls)
	}
}

func TestDiskWarningClearsBelowLimit(t *testing.T) {
	h := diskHarness(t, time.Hour, nil)
	l, _ := h.acquire("c1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := h.m.Subscribe(ctx, EventFilter{LeaseID: l.ID})
	h.rt.setUsage(l.ContainerID, 12*mib)
	eventually(t, 2*time.Second, "disk warning", func() bool { return hasDiskWarning(h.get(l.ID)) })
	got := h.get(l.ID)
	if want := DiskWarning(12*mib, 10*mib); !slices.Contains(got.Warnings, want) || got.State != StateReady {
		t.Fatalf("lease = %s %q, want READY with %q", got.State, got.Warnings, want)
	}
	// The warning is written to the store (just after memory) and sent to
	// watchers.
	eventually(t, 2*time.Second, "the warning stored", func() bool { return hasDiskWarning(h.stored(l.ID)) })
	if !watchSees(t, sub, func(l Lease) bool { return hasDiskWarning(l) }) {
		t.Fatal("no watch event carried the warning")
	}
	h.rt.setUsage(l.ContainerID, 9*mib)
	eventually(t, 2*time.Second, "warning cleared", func() bool { return !hasDiskWarning(h.get(l.ID)) })
	if got := h.get(l.ID); got.State != StateReady || got.Usage.DiskBytes != 9*mib {
		t.Fatalf("lease = %s usage %d, want READY at 9 MiB", got.State, got.Usage.DiskBytes)
	}
	if h.rt.count() != 1 || len(h.rt.stopped) != 0 {
		t.Fatal("the sandbox was stopped or removed although it went back under its limit")
	}
}

func TestDiskOverGraceStopsAndKeepsContainer(t *testing.T) {
	t.Parallel() // its own harness; mostly waits on the Manager's timers
	h := diskHarness(t, 300*time.Millisecond, func(c *Config) { c.Retention = 1500 * time.Millisecond })
	l, _ := h.acquire("over")
	under := h.acquireWith("under", runtime.Resources{DiskBytes: 100 * mib})
	small, _ := h.acquire("small") // the default limit, well below it
	h.rt.setUsage(under.ContainerID, 20*mib)
	h.rt.setUsage(small.ContainerID, 1*mib)

	start := time.Now()
	h.rt.setUsage(l.ContainerID, 11*mib)
	eventually(t, 2*time.Second, "disk warning", func() bool { return hasDiskWarning(h.get(l.ID)) })
	eventually(t, 3*time.Second, "lease FAILED", func() bool { return h.get(l.ID).State == StateFailed })
	took := time.Since(start)
	got := h.get(l.ID)
	if want := DiskReason(11*mib, 10*mib); got.Reason != want {
		t.Fatalf("reason = %q, want %q", got.Reason, want)
	}
	if took < 300*time.Millisecond {
		t.Fatalf("failed after %s, before the grace of 300ms", took)
	}
	if got.Phase != PhaseKept || got.Cleaned {
		t.Fatalf("phase=%s cleaned=%v, want the container kept", got.Phase, got.Cleaned)
	}
	eventually(t, 2*time.Second, "container stopped", func() bool {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return slices.Contains(h.rt.stopped, l.ContainerID)
	})
	// Kept through several reaper and resync passes, and stopped, not removed.
	time.Sleep(400 * time.Millisecond)
	if !h.rt.exists(l.ContainerID) {
		t.Fatal("the stopped container was removed before the retention passed")
	}
	sb, _ := h.rt.Get(context.Background(), l.ContainerID)
	if sb.State != runtime.StateExited {
		t.Fatalf("container state = %s, want exited", sb.State)
	}
	// Neighbours are untouched.
	for _, n := range []Lease{under, small} {
		if g := h.get(n.ID); g.State != StateReady || hasDiskWarning(g) || !h.rt.exists(n.ContainerID) {
			t.Fatalf("neighbour %s: %s %q", n.ConversationID, g.State, g.Warnings)
		}
	}
	if s := h.m.DiskStats(); s.Stops != 1 || s.Kept != 1 || s.Over != 0 || s.Limited != 2 {
		t.Fatalf("disk stats = %+v", s)
	}
	// Once the retention has passed the container goes, then the record.
	eventually(t, 4*time.Second, "kept container removed", func() bool { return !h.rt.exists(l.ContainerID) })
	eventually(t, 2*time.Second, "record cleaned or purged", func() bool {
		g, err := h.m.Get(context.Background(), l.ID)
		return err != nil || g.Cleaned
	})
}

func TestDiskKeptContainerSurvivesRestart(t *testing.T) {
	h := diskHarness(t, 50*time.Millisecond, nil)
	l, _ := h.acquire("c1")
	h.rt.setUsage(l.ContainerID, 11*mib)
	eventually(t, 3*time.Second, "lease FAILED", func() bool { return h.get(l.ID).State == StateFailed })
	eventually(t, 2*time.Second, "stored FAILED", func() bool { return h.stored(l.ID).Phase == PhaseKept })
	h.restart()
	time.Sleep(200 * time.Millisecond)
	if !h.rt.exists(l.ContainerID) {
		t.Fatal("reconcile removed the kept container")
	}
	if g := h.get(l.ID); g.Cleaned || g.Phase != PhaseKept || g.State != StateFailed {
		t.Fatalf("after restart: %s phase=%s cleaned=%v", g.State, g.Phase, g.Cleaned)
	}
	// An operator's explicit release of an ended lease changes nothing.
	if _, err := h.m.Release(context.Background(), l.ID, ""); err != nil {
		t.Fatal(err)
	}
	if !h.rt.exists(l.ContainerID) {
		t.Fatal("release of the ended lease removed the kept container")
	}
}

func TestDiskStopFailureRemovesInstead(t *testing.T) {
	t.Parallel() // its own harness; mostly waits on the Manager's timers
	h := diskHarness(t, 50*time.Millisecond, nil)
	l, _ := h.acquire("c1")
	h.rt.set(func(f *fakeRuntime) { f.stopErr = errors.New("engine says no") })
	h.rt.setUsage(l.ContainerID, 11*mib)
	eventually(t, 3*time.Second, "lease FAILED", func() bool { return h.get(l.ID).State == StateFailed })
	eventually(t, 8*time.Second, "container removed", func() bool { return !h.rt.exists(l.ContainerID) })
	eventually(t, 2*time.Second, "lease cleaned", func() bool { g := h.get(l.ID); return g.Cleaned && g.Phase == PhaseNone })
}

func TestChargeDisk(t *testing.T) {
	t.Parallel() // its own harness; mostly waits on the Manager's timers
	h := diskHarness(t, time.Hour, func(c *Config) { c.Disk.Interval = time.Hour })
	l, _ := h.acquire("c1")
	eventually(t, 2*time.Second, "first measurement", func() bool { return !h.get(l.ID).Usage.MeasuredAt.IsZero() })
	h.m.ChargeDisk(l.ID, 4*mib)
	r, _ := h.m.Route(l.ID)
	if r.DiskUsed != 4*mib {
		t.Fatalf("used after charge = %d, want %d", r.DiskUsed, 4*mib)
	}
	// The charge brings the next measurement forward (a quarter of the
	// interval here is 15m: nothing runs) and the measurement replaces it.
	h.rt.setUsage(l.ContainerID, 2*mib)
	h.m.mu.Lock()
	e := h.m.leases[l.ID]
	h.m.disk.stateLocked(e).next = time.Now()
	h.m.mu.Unlock()
	eventually(t, 2*time.Second, "charge replaced by the measurement", func() bool {
		r, _ := h.m.Route(l.ID)
		return r.DiskUsed == 2*mib
	})
}

func TestNextDiskInterval(t *testing.T) {
	d := &diskEnforcer{cfg: DiskConfig{Interval: 16 * time.Second, Grace: 30 * time.Second}}
	now := time.Now()
	const limit = 100 * mib
	cases := []struct {
		name       string
		last       int64
		lastAgo    time.Duration
		every      time.Duration
		overSince  time.Duration // ago; 0 = not over
		used       int64
		want       time.Duration
		wantAtMost bool
	}{
		{name: "first measurement, small", used: 1 * mib, want: 16 * time.Second},
		{name: "near the limit", last: 85 * mib, lastAgo: 16 * time.Second, used: 85 * mib, want: 4 * time.Second},
		{name: "over, grace far", overSince: time.Second, used: 101 * mib, want: 4 * time.Second},
		{name: "over, grace ending", overSince: 29 * time.Second, used: 101 * mib, want: time.Second, wantAtMost: true},
		{name: "far and unchanged backs off", last: 10 * mib, lastAgo: 16 * time.Second, used: 10 * mib, want: 16 * time.Second},
		{name: "far and unchanged again", last: 10 * mib, lastAgo: 16 * time.Second, every: 16 * time.Second, used: 10 * mib, want: 32 * time.Second},
		{name: "backoff capped at 4x", last: 10 * mib, lastAgo: 64 * time.Second, every: 64 * time.Second, used: 10 * mib, want: 64 * time.Second},
		// 10 MiB in 16s, 40 MiB left: 64s to the limit; half of it capped at the base.
		{name: "growing slowly", last: 40 * mib, lastAgo: 16 * time.Second, used: 50 * mib, want: 16 * time.Second},
		// 30 MiB in 4s, 30 MiB left: 4s to the limit, measure in 2s... at least a quarter.
		{name: "growing fast", last: 40 * mib, lastAgo: 4 * time.Second, used: 70 * mib, want: 4 * time.Second},
	}
	for _, c := range cases {
		st := &diskState{}
		st.last, st.every = c.last, c.every
		if c.lastAgo > 0 {
			st.lastAt = now.Add(-c.lastAgo)
		}
		if c.overSince > 0 {
			st.overSince = now.Add(-c.overSince)
		}
		got := d.nextInterval(st, c.used, limit, now)
		if (c.wantAtMost && got > c.want) || (!c.wantAtMost && got != c.want) {
			t.Errorf("%s: next = %s, want %s", c.name, got, c.want)
		}
	}
}

// TestDiskConfigDefaults checks DiskConfig's defaults and validation.
func TestDiskConfigDefaults(t *testing.T) {
	got, err := DiskConfig{}.withDefaults()
	if err != nil || got != DefaultDiskConfig() || got != (DiskConfig{Interval: 15 * time.Second, Concurrency: 2, Grace: 30 * time.Second}) {
		t.Fatalf("zero config = %+v, %v; want the defaults", got, err)
	}
	if got, _ := (DiskConfig{Interval: time.Second, Concurrency: -1}).withDefaults(); got.Interval != time.Second || got.Concurrency != 2 || got.Grace != 30*time.Second {
		t.Fatalf("partial config = %+v", got)
	}
	for field, c := range map[string]DiskConfig{
		"disk_interval": {Interval: -time.Second},
		"disk_grace":    {Grace: -time.Second},
	} {
		if _, err := c.withDefaults(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%+v: err = %v, want an invalid argument naming %s", c, err, field)
		}
	}
	if err := (DiskConfig{Interval: time.Second, Grace: time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "disk_concurrency") {
		t.Errorf("zero concurrency: err = %v, want one naming disk_concurrency", err)
	}
}
