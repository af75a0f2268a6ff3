package lease

import (
	"context"
	"testing"
	"time"
)

// TestPauseResumeCyclesKeepLastTransitions performs the attack of a lease
// token that pauses and resumes its lease without end (150 cycles, 302
// transitions): the record, in memory, in the bbolt file and after a
// restart, keeps only the last MaxTransitions transitions and counts the
// dropped ones.
func TestPauseResumeCyclesKeepLastTransitions(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	l, _ := h.acquire("c1")
	const cycles = 150
	for i := range cycles {
		if _, err := h.m.Pause(ctx, l.ID, PauseFreeze); err != nil {
			t.Fatalf("pause %d: %v", i, err)
		}
		if _, err := h.m.Resume(ctx, l.ID); err != nil {
			t.Fatalf("resume %d: %v", i, err)
		}
	}
	const total = 2 + 2*cycles // acquired, ready, then a pause and a resume each
	check := func(where string, got Lease) {
		t.Helper()
		if len(got.Transitions) != MaxTransitions || got.TransitionsDropped != total-MaxTransitions || got.TransitionCount() != total {
			t.Fatalf("%s: %d transitions kept, %d dropped (count %d); want %d kept, %d dropped",
				where, len(got.Transitions), got.TransitionsDropped, got.TransitionCount(), MaxTransitions, total-MaxTransitions)
		}
		last := got.Transitions[len(got.Transitions)-1]
		if last.From != StatePaused || last.To != StateReady || last.Reason != ReasonThawed {
			t.Fatalf("%s: last transition %+v, want the last resume", where, last)
		}
		first := got.Transitions[0]
		if first.From != StateReady || first.To != StatePaused {
			t.Fatalf("%s: oldest kept transition %+v, want a pause", where, first)
		}
	}
	check("memory", h.get(l.ID))
	check("bbolt", h.stored(l.ID))
	h.restart()
	check("after restart", h.get(l.ID))
	// One more transition after the restart still drops the oldest.
	if _, err := h.m.Pause(ctx, l.ID, PauseFreeze); err != nil {
		t.Fatal(err)
	}
	if got := h.stored(l.ID); len(got.Transitions) != MaxTransitions || got.TransitionCount() != total+1 {
		t.Fatalf("after one more pause: %d kept, count %d", len(got.Transitions), got.TransitionCount())
	}
}

// TestTransitionDropsOldest checks Lease.Transition's bound on its own:
// the copy a caller held before keeps its own history.
func TestTransitionDropsOldest(t *testing.T) {
	var l Lease
	testEpoch := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	flip := func() State {
		if l.State == StatePaused {
			return StateReady
		}
		return StatePaused
	}
	if _, err := l.Transition(StatePending, "acquired", testEpoch); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Transition(StateReady, "ready", testEpoch); err != nil {
		t.Fatal(err)
	}
	for l.TransitionCount() < MaxTransitions {
		if _, err := l.Transition(flip(), "x", testEpoch); err != nil {
			t.Fatal(err)
		}
	}
	before := l.Clone()
	if len(l.Transitions) != MaxTransitions || l.TransitionsDropped != 0 {
		t.Fatalf("%d kept, %d dropped before the bound", len(l.Transitions), l.TransitionsDropped)
	}
	if _, err := l.Transition(flip(), "one more", testEpoch); err != nil {
		t.Fatal(err)
	}
	if len(l.Transitions) != MaxTransitions || l.TransitionsDropped != 1 || l.Transitions[0] != before.Transitions[1] {
		t.Fatalf("%d kept, %d dropped, first %+v", len(l.Transitions), l.TransitionsDropped, l.Transitions[0])
	}
	if before.Transitions[0].To != StatePending {
		t.Fatalf("the earlier copy changed: %+v", before.Transitions[0])
	}
}
