package lease

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
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
			tr, err := l.Transition(to, "because", at)
			if want {
				if err != nil {
					t.Errorf("%s -> %s: %v", from, to, err)
					continue
				}
				if tr != (Transition{From: from, To: to, Reason: "because", At: at}) || len(l.Transitions) != 1 ||
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
		if s.Ended() && len(allowed[s]) != 0 {
			t.Errorf("%s is ended but has transitions out", s)
		}
	}
	if StateUnspecified.Live() || StateUnspecified.Ended() || StateUnspecified.Valid() {
		t.Error("unspecified state must be neither live, ended nor valid")
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
