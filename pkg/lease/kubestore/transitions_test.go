package kubestore

import (
	"encoding/json"
	"testing"

	"github.com/berth-dev/berth/pkg/lease"
)

// cycled returns l after n pause/resume cycles (2n transitions).
func cycled(t *testing.T, l lease.Lease, n int) lease.Lease {
	t.Helper()
	l = l.Clone()
	l.State, l.Paused = lease.StateReady, ""
	for range n {
		for _, to := range []lease.State{lease.StatePaused, lease.StateReady} {
			if _, err := l.Transition(to, lease.ReasonFrozen, l.UpdatedAt); err != nil {
				t.Fatal(err)
			}
		}
	}
	return l
}

// TestPauseResumeCyclesBoundObject performs the attack of a lease token
// pausing and resuming its lease without end on the cluster store: the
// BerthLease object stops growing (far below etcd's 1.5 MiB), keeps the
// dropped count, and a replica's write of an older snapshot with as many
// kept transitions is still recognised as stale.
func TestPauseResumeCyclesBoundObject(t *testing.T) {
	size := func(l lease.Lease) int {
		u, err := encode(l, "berth", DefaultFleet, "a")
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	base := fullLease(RandomID(t))
	after150, after5000 := cycled(t, base, 150), cycled(t, base, 5000)
	if len(after5000.Transitions) != lease.MaxTransitions || after5000.TransitionCount() != len(base.Transitions)+10000 {
		t.Fatalf("%d transitions kept, count %d", len(after5000.Transitions), after5000.TransitionCount())
	}
	// The dropped count's digits are all that may grow.
	if s150, s5000 := size(after150), size(after5000); s5000 > s150+8 || s5000 > 64<<10 {
		t.Fatalf("object of %d bytes after 150 cycles, %d after 5000", s150, s5000)
	}

	f := newFakeClients()
	a, b := f.store(t, "a"), f.store(t, "b")
	older := cycled(t, base, 140) // as many kept transitions, fewer made
	if err := a.Put(after150); err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(after150.ID)
	if err != nil || got.TransitionsDropped != after150.TransitionsDropped || len(got.Transitions) != lease.MaxTransitions {
		t.Fatalf("Get = %d kept, %d dropped, %v", len(got.Transitions), got.TransitionsDropped, err)
	}
	if err := b.Put(older); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(after150.ID); err != nil || got.TransitionCount() != after150.TransitionCount() {
		t.Fatalf("a stale write replaced the record: count %d, want %d (%v)", got.TransitionCount(), after150.TransitionCount(), err)
	}
}
