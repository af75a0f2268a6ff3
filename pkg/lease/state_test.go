package lease

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

func TestStateMachine(t *testing.T) {
	legal := map[[2]State]bool{
		{StateUnspecified, StatePending}: true,
		{StatePending, StateReady}:       true,
		{StatePending, StateFailed}:      true,
		{StatePending, StateReleasing}:   true,
		{StateReady, StateReleasing}:     true,
		{StateReady, StateExpired}:       true,
		{StateReady, StateFailed}:        true,
		{StateReady, StatePending}:       true, // in-place restart
		{StateReady, StatePaused}:        true,
		{StatePaused, StateReady}:        true,
		{StatePaused, StatePaused}:       true, // a frozen sandbox found stopped: hibernated
		{StatePaused, StateReleasing}:    true,
		{StatePaused, StateExpired}:      true,
		{StatePaused, StateFailed}:       true,
		{StateReleasing, StateReleased}:  true,
		{StateReleasing, StateFailed}:    true,
	}
	all := append([]State{StateUnspecified}, States...)
	for _, from := range all {
		for _, to := range all {
			want := legal[[2]State{from, to}]
			if got := CanTransition(from, to); got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
			l := Lease{ID: "x", State: from}
			at := time.Unix(100, 0)
			// READY → PENDING is an in-place restart: it enters PhaseRestarting.
			phase := map[[2]State]Phase{{StateReady, StatePending}: PhaseRestarting}[[2]State{from, to}]
			tr, err := l.TransitionPhase(to, phase, "because", at)
			if want {
				if err != nil {
					t.Errorf("%s -> %s: %v", from, to, err)
					continue
				}
				if tr != (Transition{From: from, To: to, Phase: phase, Reason: "because", At: at}) || len(l.Transitions) != 1 ||
					l.State != to || l.Reason != "because" || !l.UpdatedAt.Equal(at) {
					t.Errorf("%s -> %s: lease not updated: %+v", from, to, l)
				}
				if to.Ended() != !l.EndedAt.IsZero() {
					t.Errorf("%s -> %s: EndedAt = %v", from, to, l.EndedAt)
				}
			} else {
				if !errdefs.IsFailedPrecondition(err) {
					t.Errorf("%s -> %s: err = %v, want FailedPrecondition", from, to, err)
				}
				if l.State != from || len(l.Transitions) != 0 {
					t.Errorf("%s -> %s: illegal transition changed the lease", from, to)
				}
			}
		}
	}
	for _, s := range States {
		if s.Live() == s.Ended() {
			t.Errorf("%s: Live=%v Ended=%v", s, s.Live(), s.Ended())
		}
	}
	for from, tos := range moves {
		for _, to := range tos {
			if from.state.Ended() && !phaseChange(from, to) {
				t.Errorf("%s is ended but has a transition out to %s", from, to)
			}
		}
	}
	if StateUnspecified.Live() || StateUnspecified.Ended() || StateUnspecified.Valid() {
		t.Error("unspecified state must be neither live, ended nor valid")
	}
}

// parsePlace reads "READY" or "READY/claiming" ("-" is StateUnspecified).
func parsePlace(t *testing.T, s string) place {
	t.Helper()
	st, ph, _ := strings.Cut(s, "/")
	if st == "-" {
		return place{StateUnspecified, Phase(ph)}
	}
	state, err := ParseState(st)
	if err != nil {
		t.Fatal(err)
	}
	return place{state, Phase(ph)}
}

// TestPhaseMachine checks the transition table over (state, phase) places
// against a table written out here: every pair of places, as a transition
// (TransitionPhase: recorded) and, within one state, as a phase change
// (SetPhase: not recorded). An illegal move fails with FailedPrecondition
// and leaves the lease as it was.
func TestPhaseMachine(t *testing.T) {
	legal := map[string][]string{
		"-":                  {"PENDING"},
		"PENDING":            {"READY", "READY/claiming", "FAILED", "RELEASING"},
		"PENDING/restarting": {"READY", "FAILED", "RELEASING"},
		"READY":              {"PENDING/restarting", "PAUSED", "RELEASING", "EXPIRED", "FAILED", "FAILED/kept"},
		"READY/claiming":     {"READY", "PENDING/restarting", "PAUSED", "RELEASING", "EXPIRED", "FAILED", "FAILED/kept"},
		"PAUSED":             {"READY", "PAUSED", "RELEASING", "EXPIRED", "FAILED"},
		"RELEASING":          {"RELEASED", "FAILED"},
		"FAILED/kept":        {"FAILED"},
	}
	want := map[[2]place]bool{}
	for from, tos := range legal {
		for _, to := range tos {
			want[[2]place{parsePlace(t, from), parsePlace(t, to)}] = true
		}
	}
	var all []place
	for _, s := range append([]State{StateUnspecified}, States...) {
		for _, p := range Phases {
			all = append(all, place{s, p})
		}
	}
	at := time.Unix(100, 0)
	for _, from := range all {
		// Setting the current phase changes nothing, whatever the place.
		if l := (Lease{ID: "x", State: from.state, Phase: from.phase}); l.SetPhase(from.phase) != nil || l.Phase != from.phase {
			t.Errorf("SetPhase(%s) on %s changed something", from.phase, from)
		}
		for _, to := range all {
			legal := want[[2]place{from, to}]
			if got := canMove(from, to); got != legal {
				t.Errorf("canMove(%s, %s) = %v, want %v", from, to, got, legal)
			}
			start := Lease{ID: "x", State: from.state, Phase: from.phase, Reason: "before"}
			if from.state == to.state && from.phase != to.phase {
				// A phase change: SetPhase, never a transition.
				l := start
				err := l.SetPhase(to.phase)
				switch {
				case legal && (err != nil || l.Phase != to.phase || l.State != from.state || l.Reason != "before" || len(l.Transitions) != 0):
					t.Errorf("SetPhase %s -> %s: %v, lease %+v", from, to, err, l)
				case !legal && (!errdefs.IsFailedPrecondition(err) || l.Phase != from.phase):
					t.Errorf("SetPhase %s -> %s: err = %v, phase %s; want FailedPrecondition, unchanged", from, to, err, l.Phase)
				}
				l = start
				if _, err := l.TransitionPhase(to.state, to.phase, "because", at); !errdefs.IsFailedPrecondition(err) || l.Phase != from.phase {
					t.Errorf("TransitionPhase %s -> %s: err = %v; a phase change is not a transition", from, to, err)
				}
				continue
			}
			l := start
			tr, err := l.TransitionPhase(to.state, to.phase, "because", at)
			if !legal {
				if !errdefs.IsFailedPrecondition(err) || l.State != from.state || l.Phase != from.phase || len(l.Transitions) != 0 {
					t.Errorf("TransitionPhase %s -> %s: err = %v, lease %s/%s; want FailedPrecondition, unchanged", from, to, err, l.State, l.Phase)
				}
				continue
			}
			if err != nil {
				t.Errorf("TransitionPhase %s -> %s: %v", from, to, err)
				continue
			}
			if tr != (Transition{From: from.state, To: to.state, Phase: to.phase, Reason: "because", At: at}) ||
				len(l.Transitions) != 1 || l.Transitions[0] != tr || l.State != to.state || l.Phase != to.phase || l.Reason != "because" {
				t.Errorf("TransitionPhase %s -> %s: transition %+v, lease %+v", from, to, tr, l)
			}
		}
	}
	// The places a lease can be in: the states, and the phases each admits.
	places := map[string]bool{"PENDING/restarting": true, "READY/claiming": true, "FAILED/kept": true}
	for _, s := range States {
		places[string(s)] = true
	}
	for _, p := range all {
		if want := places[p.String()] || p == (place{StateUnspecified, PhaseNone}); p.admitted() != want {
			t.Errorf("%s admitted = %v, want %v", p, p.admitted(), want)
		}
	}
	// Transition enters PhaseNone: a READY lease cannot go PENDING without
	// saying it restarts.
	l := Lease{ID: "x", State: StateReady}
	if _, err := l.Transition(StatePending, "because", at); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("READY -> PENDING without a phase: err = %v", err)
	}
}

// TestLegacyRecords reads records written before Lease.Phase existed:
// their flags and history become phases, and the restart budget counts
// their restarts.
func TestLegacyRecords(t *testing.T) {
	tr := func(from, to State) string {
		return `{"from":"` + string(from) + `","to":"` + string(to) + `","reason":"r","at":"2026-12-01T10:00:00Z"}`
	}
	created, ready, restart := tr(StateUnspecified, StatePending), tr(StatePending, StateReady), tr(StateReady, StatePending)
	hist := func(ts ...string) string { return `"transitions":[` + strings.Join(ts, ",") + `]` }
	for _, tc := range []struct {
		name     string
		json     string
		phase    Phase
		restarts int // transitions into PhaseRestarting
	}{
		{"ready", `{"id":"L","state":"READY",` + hist(created, ready) + `}`, PhaseNone, 0},
		{"claiming", `{"id":"L","state":"READY","claiming":true,` + hist(created, ready) + `}`, PhaseClaiming, 0},
		{"claiming on another state", `{"id":"L","state":"EXPIRED","claiming":true,` + hist(created, ready, tr(StateReady, StateExpired)) + `}`, PhaseNone, 0},
		{"kept", `{"id":"L","state":"FAILED","keep_container":true,` + hist(created, ready, tr(StateReady, StateFailed)) + `}`, PhaseKept, 0},
		{"kept and cleaned", `{"id":"L","state":"FAILED","keep_container":true,"cleaned":true,` + hist(created, ready, tr(StateReady, StateFailed)) + `}`, PhaseKept, 0},
		{"restarting", `{"id":"L","state":"PENDING",` + hist(created, ready, restart) + `}`, PhaseRestarting, 1},
		{"restarted twice, restarting again", `{"id":"L","state":"PENDING",` + hist(created, ready, restart, ready, restart, ready, restart) + `}`, PhaseRestarting, 3},
		{"restarted, ready", `{"id":"L","state":"READY",` + hist(created, ready, restart, ready) + `}`, PhaseNone, 1},
		{"creating", `{"id":"L","state":"PENDING",` + hist(created) + `}`, PhaseNone, 0},
		{"new record", `{"id":"L","state":"PENDING","phase":"restarting",` + hist(created, ready, `{"from":"READY","to":"PENDING","phase":"restarting","at":"2026-12-01T10:00:00Z"}`) + `}`, PhaseRestarting, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Lease
			if err := json.Unmarshal([]byte(tc.json), &l); err != nil {
				t.Fatal(err)
			}
			if l.Phase != tc.phase {
				t.Errorf("phase = %s, want %s", l.Phase, tc.phase)
			}
			now := time.Date(2026, 12, 1, 10, 1, 0, 0, time.UTC)
			if n := restartsWithin(&l, time.Hour, now); n != tc.restarts {
				t.Errorf("restarts within the window = %d, want %d", n, tc.restarts)
			}
			// Written again, the record has the phase and not the old flags.
			b, err := json.Marshal(l)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), `"claiming":`) || strings.Contains(string(b), `"keep_container"`) {
				t.Errorf("record written with an old flag: %s", b)
			}
			var back Lease
			if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, l) {
				t.Errorf("round trip: %+v, %v; want %+v", back, err, l)
			}
		})
	}
}

// TestLegacyRecordLoads: a PENDING record of a restart written before
// phases existed is resumed by the next Start (through the store and
// Manager.load), not failed as an interrupted creation.
func TestLegacyRecordLoads(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	h.stop()
	st, err := OpenBolt(h.path)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := st.Get(l.ID)
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	// The record as the previous version wrote it: READY → PENDING with no phase.
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	raw["state"] = string(StatePending)
	raw["transitions"] = append(raw["transitions"].([]any), map[string]any{
		"from": "READY", "to": "PENDING", "reason": "container exited with code 137; restarting", "at": time.Now().UTC(),
	})
	if b, err = json.Marshal(raw); err != nil {
		t.Fatal(err)
	}
	if err := st.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketLeases).Put([]byte(l.ID), b) }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	h.rt.set(func(f *fakeRuntime) {
		f.boxes[l.ContainerID].State, f.boxes[l.ContainerID].ExitCode = runtime.StateExited, 137
	})
	h.start()
	eventually(t, 2*time.Second, "restart resumed", func() bool { return h.get(l.ID).State == StateReady })
	if got := h.get(l.ID); got.Reason != "restarted after container exited with code 137" || got.Restarts != 1 || got.Phase != PhaseNone {
		t.Fatalf("%s/%s %q restarts %d", got.State, got.Phase, got.Reason, got.Restarts)
	}
}

// TestUnknownPhaseLoads: a record in a phase this version does not know
// (written by a later one) loads in no phase.
func TestUnknownPhaseLoads(t *testing.T) {
	h := newHarness(t, nil)
	l, _ := h.acquire("c")
	h.stop()
	st, err := OpenBolt(h.path)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := st.Get(l.ID)
	rec.Phase = "migrating"
	if err := st.Put(rec); err != nil {
		t.Fatal(err)
	}
	st.Close()
	h.start()
	if got := h.get(l.ID); got.State != StateReady || got.Phase != PhaseNone {
		t.Fatalf("loaded as %s/%s, want READY in no phase", got.State, got.Phase)
	}
}

func TestParseState(t *testing.T) {
	for in, want := range map[string]State{"READY": StateReady, "ready": StateReady, "LEASE_STATE_EXPIRED": StateExpired, " failed ": StateFailed} {
		if got, err := ParseState(in); err != nil || got != want {
			t.Errorf("ParseState(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "UNSPECIFIED", "LEASE_STATE_UNSPECIFIED", "nope"} {
		if _, err := ParseState(in); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseState(%q): err = %v", in, err)
		}
	}
}

func TestParseSelector(t *testing.T) {
	got, err := ParseSelector("label_selector", " team=a , env=prod=x,k=")
	if err != nil || len(got) != 3 || got["team"] != "a" || got["env"] != "prod=x" || got["k"] != "" {
		t.Fatalf("got %v, %v", got, err)
	}
	if got, err := ParseSelector("label_selector", ""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"novalue", "=v", "a=1,a=2", "bad key=1"} {
		if _, err := ParseSelector("label_selector", bad); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "label_selector") {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}

func TestBoltStore(t *testing.T) {
	t.Parallel() // its own file; waits out bolt's lock timeout
	path := filepath.Join(t.TempDir(), "sub", DBFileName)
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	l := Lease{ID: newID(time.Now()), ConversationID: "c", State: StateReady, Env: map[string]string{"A": "1"},
		TTL: time.Minute, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	if err := s.Put(l); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	if err := s.Put(Lease{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("put without id: %v", err)
	}

	// A second open of a locked file fails instead of hanging.
	if _, err := OpenBolt(path); !errdefs.IsUnavailable(err) {
		t.Fatalf("second open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(l.ID)
	if err != nil || got.ConversationID != "c" || got.Env["A"] != "1" || got.TTL != time.Minute || !got.CreatedAt.Equal(l.CreatedAt) {
		t.Fatalf("after reopen: %+v, %v", got, err)
	}
	n := 0
	if err := s.ForEach(func(Lease) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("ForEach: %d, %v", n, err)
	}
	stop := errors.New("stop")
	if err := s.ForEach(func(Lease) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("ForEach error: %v", err)
	}
	l2, l3 := l, l
	l2.ID, l3.ID = newID(time.Now()), newID(time.Now())
	if err := s.PutAll([]Lease{l2, l3}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutAll([]Lease{l2, {}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("PutAll with a bad record: %v", err)
	}
	n = 0
	if err := s.ForEach(func(Lease) error { n++; return nil }); err != nil || n != 3 {
		t.Fatalf("ForEach after PutAll: %d, %v", n, err)
	}
	if err := s.Delete(l.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(l.ID); err != nil {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := s.Get(l.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestIDs(t *testing.T) {
	a := newID(time.UnixMilli(1000))
	b := newID(time.UnixMilli(2000))
	if !ValidID(a) || !ValidID(b) || a >= b {
		t.Fatalf("ids %q %q: want valid and time-ordered", a, b)
	}
	for _, bad := range []string{"", "x", strings.ToUpper(a), a + "0", a[:25] + "."} {
		if ValidID(bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
}

func TestLoadOrCreateSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d", SecretFileName)
	a, err := LoadOrCreateSecret(path)
	if err != nil || len(a) != 32 {
		t.Fatalf("create: %d bytes, %v", len(a), err)
	}
	b, err := LoadOrCreateSecret(path)
	if err != nil || string(a) != string(b) {
		t.Fatalf("load: %v (same=%v)", err, string(a) == string(b))
	}
}
