package lease

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// memFleet is an in-memory SharedStore backend several Managers share: the
// fake of the cluster's store (pkg/lease/kubestore is tested against a real
// API server). Each Manager gets a view with its instance id.
type memFleet struct {
	mu      sync.Mutex
	records map[string]Lease
	writer  map[string]string
	locks   map[string]string
	subs    map[*fleetSub]struct{}
	// held keeps the events for the instances whose feed lags (hold), in
	// order, until release.
	held map[string][]fleetEvent
}

type fleetSub struct {
	instance string
	ch       chan fleetEvent
}

type fleetEvent struct {
	l       Lease
	deleted bool
}

func newMemFleet() *memFleet {
	return &memFleet{records: map[string]Lease{}, writer: map[string]string{}, locks: map[string]string{}, subs: map[*fleetSub]struct{}{}}
}

// view is the store of the replica instance.
func (f *memFleet) view(instance string) *fleetView { return &fleetView{f: f, instance: instance} }

func (f *memFleet) notifyLocked(writer string, ev fleetEvent) {
	for s := range f.subs {
		if s.instance == writer {
			continue
		}
		if q, ok := f.held[s.instance]; ok {
			f.held[s.instance] = append(q, ev)
			continue
		}
		s.ch <- ev
	}
}

// hold makes instance's feed lag: the records written from now on reach
// it only at release.
func (f *memFleet) hold(instance string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held == nil {
		f.held = map[string][]fleetEvent{}
	}
	f.held[instance] = []fleetEvent{}
}

// release delivers what hold kept from instance, and what follows.
func (f *memFleet) release(instance string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.held[instance]
	delete(f.held, instance)
	for s := range f.subs {
		if s.instance == instance {
			for _, ev := range q {
				s.ch <- ev
			}
		}
	}
}

type fleetView struct {
	f        *memFleet
	instance string
}

var _ SharedStore = (*fleetView)(nil)

func (v *fleetView) Put(l Lease) error { return v.PutAll([]Lease{l}) }

func (v *fleetView) PutAll(ls []Lease) error {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	for _, l := range ls {
		l = l.Clone()
		v.f.records[l.ID] = l
		v.f.writer[l.ID] = v.instance
		v.f.notifyLocked(v.instance, fleetEvent{l: l.Clone()})
	}
	return nil
}

func (v *fleetView) Get(id string) (Lease, error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	l, ok := v.f.records[id]
	if !ok {
		return Lease{}, errdefs.NotFound("lease %s", id)
	}
	return l.Clone(), nil
}

func (v *fleetView) Delete(ids ...string) error {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	for _, id := range ids {
		if _, ok := v.f.records[id]; ok {
			delete(v.f.records, id)
			v.f.notifyLocked(v.instance, fleetEvent{l: Lease{ID: id}, deleted: true})
		}
	}
	return nil
}

func (v *fleetView) ForEach(fn func(Lease) error) error {
	v.f.mu.Lock()
	var all []Lease
	for _, l := range v.f.records {
		all = append(all, l.Clone())
	}
	v.f.mu.Unlock()
	slices.SortFunc(all, func(a, b Lease) int { return compareStr(a.ID, b.ID) })
	for _, l := range all {
		if err := fn(l); err != nil {
			return err
		}
	}
	return nil
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (v *fleetView) Subscribe(ctx context.Context, fn func(Lease, bool)) error {
	s := &fleetSub{instance: v.instance, ch: make(chan fleetEvent, 4096)}
	v.f.mu.Lock()
	for id, l := range v.f.records {
		if v.f.writer[id] != v.instance {
			s.ch <- fleetEvent{l: l.Clone()}
		}
	}
	v.f.subs[s] = struct{}{}
	v.f.mu.Unlock()
	defer func() {
		v.f.mu.Lock()
		delete(v.f.subs, s)
		v.f.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-s.ch:
			fn(ev.l, ev.deleted)
		}
	}
}

func (v *fleetView) LockConversation(ctx context.Context, owner, conv, id string) (string, error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	k := convKey(owner, conv)
	if h, ok := v.f.locks[k]; ok {
		return h, nil
	}
	v.f.locks[k] = id
	return id, nil
}

func (v *fleetView) TakeConversation(ctx context.Context, owner, conv, old, id string) (bool, error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	k := convKey(owner, conv)
	if h, ok := v.f.locks[k]; !ok || h != old {
		return false, nil
	}
	v.f.locks[k] = id
	return true, nil
}

func (v *fleetView) UnlockConversation(ctx context.Context, owner, conv, id string) error {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	if k := convKey(owner, conv); v.f.locks[k] == id {
		delete(v.f.locks, k)
	}
	return nil
}

func (f *memFleet) lockOf(owner, conv string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.locks[convKey(owner, conv)]
	return h, ok
}

// election is a test leader election: the replica named by leader leads.
type election struct {
	mu      sync.Mutex
	leader  string
	changed chan struct{}
}

func newElection(leader string) *election {
	return &election{leader: leader, changed: make(chan struct{})}
}

func (el *election) set(leader string) {
	el.mu.Lock()
	el.leader = leader
	close(el.changed)
	el.changed = make(chan struct{})
	el.mu.Unlock()
}

// elect is a FleetConfig.Elect for replica name.
func (el *election) elect(name string) func(context.Context, func(context.Context)) error {
	return func(ctx context.Context, lead func(context.Context)) error {
		for {
			el.mu.Lock()
			leads, changed := el.leader == name, el.changed
			el.mu.Unlock()
			if leads {
				lctx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() { lead(lctx); close(done) }()
				select {
				case <-ctx.Done():
				case <-changed:
				}
				cancel()
				<-done
			} else {
				select {
				case <-ctx.Done():
				case <-changed:
				}
			}
			if ctx.Err() != nil {
				return nil
			}
		}
	}
}

// replica is one Manager of a fleet.
type replica struct {
	m      *Manager
	cancel context.CancelFunc
}

// acquired is one Acquire's answer in acquireOnBoth.
type acquired struct {
	l   Lease
	tok string
}

// acquireOnBoth runs n Acquires at once, the even ones on replica a and
// the odd ones on b, req(i) the i-th request, and returns their answers
// in order; it fails the test (after all have returned) when one failed.
func acquireOnBoth(t *testing.T, a, b *replica, n int, req func(i int) AcquireRequest) []acquired {
	t.Helper()
	out := make([]acquired, n)
	var wg sync.WaitGroup
	for i := range n {
		r := a
		if i%2 == 1 {
			r = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, tok, _, err := r.m.Acquire(context.Background(), req(i))
			if err != nil {
				t.Errorf("acquire %d: %v", i, err)
				return
			}
			out[i] = acquired{l, tok}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

func startReplica(t *testing.T, f *memFleet, rt *fakeRuntime, el *election, name string) *replica {
	t.Helper()
	cfg := Config{InstanceID: name, Secret: testSecret, Store: f.view(name), Runtime: rt,
		ReapInterval: 20 * time.Millisecond, Restart: RestartConfig{Delay: 10 * time.Millisecond},
		Fleet: FleetConfig{Elect: el.elect(name), ActivityFlushInterval: 10 * time.Millisecond}}
	m, cancel := startManager(t, cfg)
	r := &replica{m: m, cancel: cancel}
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	if r.m == nil {
		return
	}
	r.cancel()
	_ = r.m.Close()
	r.m = nil
}

func stateOn(r *replica, id string) State {
	l, err := r.m.Get(context.Background(), id)
	if err != nil {
		return StateUnspecified
	}
	return l.State
}

// Concurrent acquires of one conversation on two replicas give one lease
// and one sandbox, and each replica serves it.
func TestReplicasAcquireOneConversation(t *testing.T) {
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("a")
	rt.createDelay = 50 * time.Millisecond
	a, b := startReplica(t, f, rt, el, "a"), startReplica(t, f, rt, el, "b")
	for round := range 5 {
		conv := "conv-" + string(rune('0'+round))
		got := acquireOnBoth(t, a, b, 6, func(int) AcquireRequest { return AcquireRequest{ConversationID: conv} })
		ids, toks := make([]string, len(got)), make([]string, len(got))
		for i, g := range got {
			ids[i], toks[i] = g.l.ID, g.tok
		}
		for i := range ids {
			if ids[i] != ids[0] || toks[i] != toks[0] {
				t.Fatalf("round %d: acquires got leases %v", round, ids)
			}
		}
		eventually(t, 2*time.Second, "both replicas see the lease READY", func() bool {
			return stateOn(a, ids[0]) == StateReady && stateOn(b, ids[0]) == StateReady
		})
		ra, _ := a.m.Route(ids[0])
		rb, _ := b.m.Route(ids[0])
		if ra.Endpoint == "" || ra.Endpoint != rb.Endpoint {
			t.Fatalf("routes differ: %+v vs %+v", ra, rb)
		}
	}
	if n := rt.creates(); n != 5 {
		t.Fatalf("%d sandboxes created for 5 conversations", n)
	}
}

// A release on the replica that is not the lease's home ends it
// everywhere, frees the conversation, and the next acquire gets a new lease.
func TestReplicasReleaseElsewhere(t *testing.T) {
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("a")
	a, b := startReplica(t, f, rt, el, "a"), startReplica(t, f, rt, el, "b")
	l, _, _, err := a.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "b sees the lease", func() bool { return stateOn(b, l.ID) == StateReady })
	if _, err := b.m.Release(context.Background(), l.ID, "released"); err != nil {
		t.Fatalf("release on b: %v", err)
	}
	eventually(t, 2*time.Second, "a sees it RELEASED", func() bool { return stateOn(a, l.ID) == StateReleased })
	eventually(t, 2*time.Second, "its sandbox removed", func() bool { return rt.count() == 0 })
	eventually(t, 2*time.Second, "the conversation lock freed", func() bool { _, ok := f.lockOf("", "c1"); return !ok })
	if got := stateOn(a, l.ID); got != StateReleased {
		t.Fatalf("a's handling of the removal overwrote the release: %s", got)
	}
	l2, _, _, err := a.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1"})
	if err != nil || l2.ID == l.ID {
		t.Fatalf("re-acquire: %v, %s", err, l2.ID)
	}
}

// Only the elected replica expires leases, every replica's included; when
// the leader goes, the next one takes over expiry.
func TestReplicasExpiryMovesWithLeader(t *testing.T) {
	t.Parallel() // its own harness; mostly waits on the Manager's timers
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("a")
	a, b := startReplica(t, f, rt, el, "a"), startReplica(t, f, rt, el, "b")
	lb, _, _, err := b.m.Acquire(context.Background(), AcquireRequest{ConversationID: "on-b", TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, "a (the leader) expires b's lease", func() bool {
		return stateOn(b, lb.ID) == StateExpired && stateOn(a, lb.ID) == StateExpired
	})
	la, _, _, err := a.m.Acquire(context.Background(), AcquireRequest{ConversationID: "on-a", TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "b sees a's lease", func() bool { return stateOn(b, la.ID) == StateReady })
	a.stop() // the leader dies
	el.set("b")
	eventually(t, 3*time.Second, "b, now elected, expires a's lease", func() bool { return stateOn(b, la.ID) == StateExpired })
	eventually(t, 2*time.Second, "its sandbox removed", func() bool { return rt.count() == 0 })
}

// A replica restarted under its instance id takes its leases back; its
// reconcile leaves the other replica's leases alone (their sandboxes are
// not in its list).
func TestReplicasRestartKeepsLeases(t *testing.T) {
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("b")
	a, b := startReplica(t, f, rt, el, "a"), startReplica(t, f, rt, el, "b")
	la, _, _, err := a.m.Acquire(context.Background(), AcquireRequest{ConversationID: "on-a"})
	if err != nil {
		t.Fatal(err)
	}
	lb, _, _, err := b.m.Acquire(context.Background(), AcquireRequest{ConversationID: "on-b"})
	if err != nil {
		t.Fatal(err)
	}
	a.stop()
	a = startReplica(t, f, rt, el, "a")
	if got := stateOn(a, la.ID); got != StateReady {
		t.Fatalf("a's own lease after its restart: %s", got)
	}
	if got := stateOn(a, lb.ID); got != StateReady {
		t.Fatalf("b's lease on a after a's restart: %s", got)
	}
	time.Sleep(100 * time.Millisecond)
	if got := stateOn(b, lb.ID); got != StateReady {
		t.Fatalf("b's lease on b after a's restart: %s", got)
	}
	if rt.count() != 2 {
		t.Fatalf("%d sandboxes after a's restart, want 2", rt.count())
	}
	// A died event of b's sandbox is b's to handle: a ignores it.
	rt.kill(lb.ContainerID, 137, false)
	eventually(t, 3*time.Second, "b restarts its sandbox", func() bool { return rt.restartCount() == 1 })
	time.Sleep(100 * time.Millisecond)
	if rt.restartCount() != 1 {
		t.Fatalf("%d restarts: the event was handled twice", rt.restartCount())
	}
}

// A conversation lock whose lease never got recorded (its replica died
// between the two) is taken over after remoteJoinWait.
func TestReplicasStaleLockTakenOver(t *testing.T) {
	old := remoteJoinWait
	remoteJoinWait = 200 * time.Millisecond
	t.Cleanup(func() { remoteJoinWait = old })
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("a")
	a := startReplica(t, f, rt, el, "a")
	if _, err := f.view("gone").LockConversation(context.Background(), "", "c1", newID(time.Now())); err != nil {
		t.Fatal(err)
	}
	l, _, _, err := a.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := f.lockOf("", "c1"); h != l.ID || l.State != StateReady {
		t.Fatalf("lock holder %s, lease %s %s", h, l.ID, l.State)
	}
}

// A record older than the one a replica holds (fewer transitions: written
// from a snapshot taken before the release reached its writer) does not
// move the lease back.
func TestReplicasStaleRecordIgnored(t *testing.T) {
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("a")
	a := startReplica(t, f, rt, el, "a")
	l, _, _, err := a.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.m.Release(context.Background(), l.ID, "done"); err != nil {
		t.Fatal(err)
	}
	if err := f.view("b").Put(l); err != nil { // the READY snapshot
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := stateOn(a, l.ID); got != StateReleased {
		t.Fatalf("after a stale READY record from another replica: %s, want RELEASED", got)
	}
	if _, ok := f.lockOf("", "c1"); ok {
		t.Fatal("the conversation lock came back")
	}
}

// stalePending leaves replica b with the PENDING record of a lease that a
// created and answered READY: b's feed lags from that record on (hold), as
// a watch may. It returns a's answer.
func stalePending(t *testing.T, f *memFleet, rt *fakeRuntime, a, b *replica) Lease {
	t.Helper()
	gate := make(chan struct{})
	rt.set(func(rt *fakeRuntime) { rt.createGate = gate })
	type answer struct {
		l   Lease
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		l, _, _, err := a.m.Acquire(context.Background(), AcquireRequest{ConversationID: "c1"})
		answered <- answer{l, err}
	}()
	var id string
	eventually(t, 2*time.Second, "b sees the lease PENDING", func() bool {
		f.mu.Lock()
		for rid, l := range f.records {
			if l.ConversationID == "c1" {
				id = rid
			}
		}
		f.mu.Unlock()
		return id != "" && stateOn(b, id) == StatePending
	})
	f.hold("b")
	close(gate)
	got := <-answered
	if got.err != nil || got.l.State != StateReady || got.l.ID != id {
		t.Fatalf("acquire on a: %v, %+v", got.err, got.l)
	}
	if st := stateOn(b, id); st != StatePending {
		t.Fatalf("b with its feed held: %s, want PENDING", st)
	}
	return got.l
}

// A request that reaches a replica whose record of the lease is still the
// PENDING one (the acquire was answered READY by another replica) waits
// for the READY record instead of being refused; when it does not come
// within remotePendingWait the lease is returned PENDING, for the caller
// to refuse.
func TestReplicasUseWaitsForLaggingRecord(t *testing.T) {
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("a")
	a, b := startReplica(t, f, rt, el, "a"), startReplica(t, f, rt, el, "b")
	l := stalePending(t, f, rt, a, b)

	old := remotePendingWait
	t.Cleanup(func() { remotePendingWait = old })
	remotePendingWait = 300 * time.Millisecond
	began := time.Now()
	r, h, err := b.m.Use(context.Background(), l.ID)
	if err != nil || h != nil || r.State != StatePending {
		t.Fatalf("Use with the record still lagging: %+v, hold %v, %v; want PENDING without a hold", r, h, err)
	}
	if took := time.Since(began); took < remotePendingWait {
		t.Fatalf("Use returned PENDING after %s, before waiting %s for the record", took, remotePendingWait)
	}

	remotePendingWait = 10 * time.Second
	done := useAsync(context.Background(), b.m, l.ID) // use_test.go
	f.release("b")
	u := <-done
	if u.err != nil || u.hold == nil || u.rt.State != StateReady || u.rt.Endpoint != l.Endpoint {
		t.Fatalf("Use once the READY record arrived: %+v, hold %v, %v; want READY at %s", u.rt, u.hold, u.err, l.Endpoint)
	}
	u.hold.Done()
}

// A release on a replica that holds only the PENDING record of another
// replica's lease (no container id in it) removes the sandbox, found by
// the labels of the lease and of its home, with the home gone.
func TestReplicasReleaseOfLaggingRecordRemovesSandbox(t *testing.T) {
	f, rt, el := newMemFleet(), newFakeRuntime(), newElection("b")
	a, b := startReplica(t, f, rt, el, "a"), startReplica(t, f, rt, el, "b")
	l := stalePending(t, f, rt, a, b)
	a.stop() // its home dies
	if rt.count() != 1 {
		t.Fatalf("%d sandboxes after a stopped, want its lease's 1", rt.count())
	}
	if _, err := b.m.Release(context.Background(), l.ID, "done"); err != nil {
		t.Fatalf("release on b: %v", err)
	}
	eventually(t, 3*time.Second, "b removes a's sandbox", func() bool { return rt.count() == 0 })
	eventually(t, 2*time.Second, "the lease RELEASED on b", func() bool { return stateOn(b, l.ID) == StateReleased })
}

// TestFleetConfigDefaults checks FleetConfig's defaults and the field its
// error names.
func TestFleetConfigDefaults(t *testing.T) {
	got, err := FleetConfig{}.withDefaults()
	if err != nil || got.Elect != nil || got.ActivityFlushInterval != DefaultFleetConfig().ActivityFlushInterval || got.ActivityFlushInterval != 5*time.Second {
		t.Fatalf("zero config = %+v, %v; want the defaults", got, err)
	}
	if got, _ := (FleetConfig{ActivityFlushInterval: time.Second}).withDefaults(); got.ActivityFlushInterval != time.Second {
		t.Fatalf("set interval = %+v, want kept", got)
	}
	if _, err := (FleetConfig{ActivityFlushInterval: -time.Second}).withDefaults(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "interval") {
		t.Errorf("negative interval: err = %v, want an invalid argument naming interval", err)
	}
}
