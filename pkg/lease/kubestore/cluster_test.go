package kubestore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/lease/kubestore"
)

// The cluster tests run with BERTH_K8S=1, against the cluster of `make
// k8s-up` (or the one $BERTH_K8S_DIR describes: admin.kubeconfig,
// berth.kubeconfig), as pkg/runtime/kubernetes's do: the stores under test
// use the orchestrator's ServiceAccount (berth.kubeconfig), so the Role of
// deploy/kubernetes is tested too; the cleanup uses the admin's
// kubeconfig. They need the CRD (kubectl apply -f deploy/kubernetes/;
// make k8s-up applies it). Each test works in a fleet of its own, so it
// sees nothing of other BerthLeases of the namespace. Without BERTH_K8S
// they skip, or fail under BERTH_REQUIRE_DOCKER=1 (CI); BERTH_K8S=0 and
// -short are a plain skip.

// cluster is what a cluster test needs.
type cluster struct {
	berth *rest.Config // the orchestrator's ServiceAccount
	ns    string
	dyn   dynamic.ResourceInterface // admin: the namespace's BerthLeases
	kube  *kubernetes.Clientset     // admin
	tag   string                    // unique to this test: instance ids
	fleet string                    // the test's own fleet
}

// needCluster skips unless BERTH_K8S=1 (see above).
func needCluster(t *testing.T) *cluster {
	t.Helper()
	dir := testenv.K8sDir(t)
	admin, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		t.Fatalf("admin kubeconfig (make k8s-up; %s=1 needs the test cluster): %v", testenv.K8sEnv, err)
	}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: filepath.Join(dir, "berth.kubeconfig")}, &clientcmd.ConfigOverrides{})
	berth, err := loader.ClientConfig()
	if err != nil {
		t.Fatalf("berth kubeconfig (make k8s-up): %v", err)
	}
	ns, _, err := loader.Namespace()
	if err != nil || ns == "" || ns == "default" {
		ns = "berth"
	}
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &cluster{berth: berth, ns: ns, dyn: dyn.Resource(kubestore.GVR).Namespace(ns), kube: kube, tag: hex.EncodeToString(b[:]), fleet: "kubestore-test-" + hex.EncodeToString(b[:])}
}

// store returns a Store of instance name (made unique to the test),
// closed when the test ends.
func (c *cluster) store(t *testing.T, name string) *kubestore.Store {
	t.Helper()
	return c.storeWith(t, name, c.fleet, c.berth)
}

// storeWith is store in fleet with the REST config rc.
func (c *cluster) storeWith(t *testing.T, name, fleet string, rc *rest.Config) *kubestore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := kubestore.New(ctx, kubestore.Config{
		REST:      rc,
		Namespace: c.ns,
		Instance:  name + "-" + c.tag,
		Fleet:     fleet,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newID returns a fresh lease id whose BerthLease the test's cleanup
// deletes (as admin), also on failure.
func (c *cluster) newID(t *testing.T) string {
	t.Helper()
	id := kubestore.RandomID(t)
	t.Cleanup(func() {
		err := c.dyn.Delete(context.Background(), id, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup: delete BerthLease %s: %v", id, err)
		}
	})
	return id
}

// conversation returns a fresh conversation of owner, whose lock the
// test's cleanup deletes (as admin).
func (c *cluster) conversation(t *testing.T, owner string) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	conv := "conv-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		err := c.kube.CoordinationV1().Leases(c.ns).Delete(context.Background(), kubestore.FleetLockName(c.fleet, owner, conv), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup: delete lock of %s: %v", conv, err)
		}
	})
	return conv
}

// record returns a lease with every field set (times in UTC, without a
// monotonic reading, as JSON gives them back), created now.
func record(id string) lease.Lease {
	return kubestore.FullLeaseAt(id, time.Now().UTC().Round(0).Truncate(time.Microsecond).Add(123*time.Nanosecond))
}

// TestClusterRoundTrip puts a lease with every field set, reads it back
// equal (times and Transitions included), replaces it, and checks the
// object's labels and writer annotation.
func TestClusterRoundTrip(t *testing.T) {
	c := needCluster(t)
	s := c.store(t, "a")
	l := record(c.newID(t))
	if err := s.Put(l); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, l) {
		t.Fatalf("Get after Put:\n%+v\nwant\n%+v", got, l)
	}
	// Replace: an update, at once (the informer may not have the first
	// version yet) and once more.
	for i := range 2 {
		l.State, l.Reason = lease.StateReady, "resumed"
		l.Transitions = append(l.Transitions, lease.Transition{From: lease.StatePaused, To: lease.StateReady, Reason: "resumed", At: l.UpdatedAt.Add(time.Duration(i+1) * time.Minute)})
		l.Warnings, l.Paused, l.PausedAt = nil, "", time.Time{}
		if err := s.Put(l); err != nil {
			t.Fatal(err)
		}
	}
	got, err = s.Get(l.ID)
	if err != nil || !reflect.DeepEqual(got, l) {
		t.Fatalf("Get after the replacement: %v\n%+v\nwant\n%+v", err, got, l)
	}
	u, err := c.dyn.Get(context.Background(), l.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{kubestore.LabelManagedBy: "berth", kubestore.LabelState: "READY", kubestore.LabelInstance: "replica-1", kubestore.LabelFleet: c.fleet}
	if !reflect.DeepEqual(u.GetLabels(), want) {
		t.Errorf("labels %v, want %v", u.GetLabels(), want)
	}
	if w := u.GetAnnotations()[kubestore.AnnotationWriter]; w != s.Instance() {
		t.Errorf("writer %q, want %q", w, s.Instance())
	}
	if _, err := s.Get(c.newID(t)); !errdefs.IsNotFound(err) {
		t.Errorf("Get of a missing lease: %v, want not found", err)
	}
}

// TestClusterForEachOrder checks that ForEach gives the records in id
// order (the test's among whatever else the namespace holds).
func TestClusterForEachOrder(t *testing.T) {
	c := needCluster(t)
	s := c.store(t, "a")
	var ids []string
	for range 5 {
		ids = append(ids, c.newID(t))
	}
	if err := s.PutAll([]lease.Lease{record(ids[3]), record(ids[0]), record(ids[4])}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{ids[2], ids[1]} {
		if err := s.Put(record(id)); err != nil {
			t.Fatal(err)
		}
	}
	var all, mine []string
	err := s.ForEach(func(l lease.Lease) error {
		all = append(all, l.ID)
		if slices.Contains(ids, l.ID) {
			mine = append(mine, l.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	if !slices.Equal(mine, ids) {
		t.Fatalf("ForEach gave %v, want %v", mine, ids)
	}
	if !slices.IsSorted(all) {
		t.Fatalf("ForEach is not in id order: %v", all)
	}
	// fn's error stops it.
	n := 0
	stop := io.EOF
	if err := s.ForEach(func(lease.Lease) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("ForEach with an error: %v after %d calls", err, n)
	}
}

// TestClusterDelete checks that deleting a missing record is success and
// that a deleted record is gone.
func TestClusterDelete(t *testing.T) {
	c := needCluster(t)
	s := c.store(t, "a")
	id := c.newID(t)
	if err := s.Delete(c.newID(t)); err != nil {
		t.Fatalf("Delete of a missing record: %v", err)
	}
	if err := s.Put(record(id)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(id, c.newID(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(id); !errdefs.IsNotFound(err) {
		t.Fatalf("Get after Delete: %v", err)
	}
	// Put after Delete creates it again.
	if err := s.Put(record(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(id); err != nil {
		t.Fatal(err)
	}
}

// TestClusterSubscribe runs two stores, instances a and b, on the
// namespace: the replay of records on Subscribe, a's Put reaching b and
// not a, b's Delete reaching a and not b.
func TestClusterSubscribe(t *testing.T) {
	c := needCluster(t)
	a, b := c.store(t, "a"), c.store(t, "b")
	old, id1, id2 := c.newID(t), c.newID(t), c.newID(t)
	ids := []string{old, id1, id2}
	// A record of a's before anyone subscribes: b's replay has it, a's
	// does not.
	l0 := record(old)
	if err := a.Put(l0); err != nil {
		t.Fatal(err)
	}
	// The informer of b may see it a little later than the Put returns.
	time.Sleep(500 * time.Millisecond)
	subA, subB := kubestore.Collect(t, a, ids...), kubestore.Collect(t, b, ids...)
	if ev := kubestore.Expect(t, "b (replay)", subB, old, false); !reflect.DeepEqual(ev.L, l0) {
		t.Fatalf("replayed\n%+v\nwant\n%+v", ev.L, l0)
	}

	l1 := record(id1)
	start := time.Now()
	if err := a.Put(l1); err != nil {
		t.Fatal(err)
	}
	ev := kubestore.Expect(t, "b", subB, id1, false)
	t.Logf("a's Put reached b after %v", ev.At.Sub(start).Round(time.Millisecond))
	if !reflect.DeepEqual(ev.L, l1) {
		t.Fatalf("b got\n%+v\nwant\n%+v", ev.L, l1)
	}
	l1.State = lease.StateReady
	if err := a.Put(l1); err != nil {
		t.Fatal(err)
	}
	if ev := kubestore.Expect(t, "b", subB, id1, false); ev.L.State != lease.StateReady {
		t.Fatalf("b got state %s, want READY", ev.L.State)
	}

	start = time.Now()
	if err := b.Delete(id1); err != nil {
		t.Fatal(err)
	}
	ev = kubestore.Expect(t, "a", subA, id1, true)
	t.Logf("b's Delete reached a after %v", ev.At.Sub(start).Round(time.Millisecond))
	if ev.L.ID != id1 || ev.L.State != "" {
		t.Fatalf("a's deletion event carries %+v, want only the id", ev.L)
	}

	// b writes: a sees it, b does not.
	if err := b.Put(record(id2)); err != nil {
		t.Fatal(err)
	}
	kubestore.Expect(t, "a", subA, id2, false)
	// Nothing else reaches either: a's own writes, b's own write and
	// deletion (give the watch a second to show them if it would).
	kubestore.ExpectNone(t, "a", subA, time.Second)
	kubestore.ExpectNone(t, "b", subB, 0)
}

// TestClusterLockConcurrent locks one fresh conversation from two stores
// at once, 10 times: exactly one wins, and both report the same holder.
func TestClusterLockConcurrent(t *testing.T) {
	c := needCluster(t)
	a, b := c.store(t, "a"), c.store(t, "b")
	ctx := context.Background()
	for i := range 10 {
		conv := c.conversation(t, "alice")
		idA, idB := c.newID(t), c.newID(t)
		var ha, hb string
		var ea, eb error
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() { defer wg.Done(); <-start; ha, ea = a.LockConversation(ctx, "alice", conv, idA) }()
		go func() { defer wg.Done(); <-start; hb, eb = b.LockConversation(ctx, "alice", conv, idB) }()
		close(start)
		wg.Wait()
		if ea != nil || eb != nil {
			t.Fatalf("round %d: %v, %v", i, ea, eb)
		}
		if ha != hb {
			t.Fatalf("round %d: a says %s holds it, b says %s", i, ha, hb)
		}
		if (ha == idA) == (hb == idB) {
			t.Fatalf("round %d: holder %s: winners a=%v b=%v, want exactly one", i, ha, ha == idA, hb == idB)
		}
		l, err := c.kube.CoordinationV1().Leases(c.ns).Get(ctx, kubestore.FleetLockName(c.fleet, "alice", conv), metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != ha {
			t.Fatalf("round %d: the lock object: %v, %v", i, l, err)
		}
		if l.Labels[kubestore.LabelKind] != kubestore.KindConversationLock || l.Labels[kubestore.LabelManagedBy] != "berth" || l.Labels[kubestore.LabelFleet] != c.fleet {
			t.Fatalf("round %d: lock labels %v", i, l.Labels)
		}
	}
}

// TestClusterTakeUnlock checks TakeConversation (the wrong old holder
// fails, the right one succeeds) and UnlockConversation (a non-holder's
// keeps the lock, the holder's removes it).
func TestClusterTakeUnlock(t *testing.T) {
	c := needCluster(t)
	a, b := c.store(t, "a"), c.store(t, "b")
	ctx := context.Background()
	conv := c.conversation(t, "bob")
	id1, id2, id3 := c.newID(t), c.newID(t), c.newID(t)
	if h, err := a.LockConversation(ctx, "bob", conv, id1); err != nil || h != id1 {
		t.Fatalf("lock: %s, %v", h, err)
	}
	if ok, err := b.TakeConversation(ctx, "bob", conv, id3, id2); err != nil || ok {
		t.Fatalf("take from the wrong holder: %v, %v; want false", ok, err)
	}
	if ok, err := b.TakeConversation(ctx, "bob", conv, id1, id2); err != nil || !ok {
		t.Fatalf("take from the holder: %v, %v; want true", ok, err)
	}
	if h, err := a.LockConversation(ctx, "bob", conv, id3); err != nil || h != id2 {
		t.Fatalf("holder after the take: %s, %v; want %s", h, err, id2)
	}
	if ok, err := a.TakeConversation(ctx, "bob", c.conversation(t, "bob"), id1, id2); err != nil || ok {
		t.Fatalf("take of a missing lock: %v, %v; want false", ok, err)
	}
	if err := a.UnlockConversation(ctx, "bob", conv, id1); err != nil {
		t.Fatal(err)
	}
	if h, err := a.LockConversation(ctx, "bob", conv, id3); err != nil || h != id2 {
		t.Fatalf("holder after a non-holder's unlock: %s, %v; want %s", h, err, id2)
	}
	if err := b.UnlockConversation(ctx, "bob", conv, id2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.kube.CoordinationV1().Leases(c.ns).Get(ctx, kubestore.FleetLockName(c.fleet, "bob", conv), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the lock after the holder's unlock: %v, want not found", err)
	}
	if err := b.UnlockConversation(ctx, "bob", conv, id2); err != nil {
		t.Fatalf("unlock of a missing lock: %v", err)
	}
}

// TestClusterPutRace writes one record from two stores at once, 10 times
// each: every Put succeeds (a Conflict is retried over the current
// version: last writer wins) and the record is one of the writes. It
// logs the time of a Put.
func TestClusterPutRace(t *testing.T) {
	c := needCluster(t)
	a, b := c.store(t, "a"), c.store(t, "b")
	id := c.newID(t)
	const n = 10
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	var mu sync.Mutex
	var took []time.Duration
	for _, s := range []*kubestore.Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				l := record(id)
				l.Reason = s.Instance()
				l.Restarts = i
				start := time.Now()
				errs <- s.Put(l)
				mu.Lock()
				took = append(took, time.Since(start))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := a.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if (got.Reason != a.Instance() && got.Reason != b.Instance()) || got.Restarts < 0 || got.Restarts >= n {
		t.Fatalf("the record after the race: reason %q restarts %d", got.Reason, got.Restarts)
	}
	slices.Sort(took)
	t.Logf("%d racing Puts: p50 %v, max %v", len(took), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	// Sequential Puts of one record, as a lease's transitions are: one
	// request each (an update over the version the last one wrote, not
	// a Conflict and a read).
	rc := rest.CopyConfig(c.berth)
	var calls sync.Map // "VERB" -> *atomic.Int64
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if strings.Contains(r.URL.Path, "/"+kubestore.Resource+"/") && r.URL.Query().Get("watch") == "" {
				v, _ := calls.LoadOrStore(r.Method, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	seq := c.storeWith(t, "a", c.fleet, rc)
	took = took[:0]
	for i := range n {
		l := record(id)
		l.Restarts = i
		start := time.Now()
		if err := seq.Put(l); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	count := func(verb string) int64 {
		if v, ok := calls.Load(verb); ok {
			return v.(*atomic.Int64).Load()
		}
		return 0
	}
	t.Logf("%d sequential Puts: p50 %v, max %v; requests: %d PUT, %d GET", n, took[n/2].Round(time.Millisecond), took[n-1].Round(time.Millisecond), count("PUT"), count("GET"))
	if count("PUT") > n+1 || count("GET") > 1 {
		t.Errorf("%d sequential Puts made %d PUT and %d GET requests, want about %d PUT and no GET", n, count("PUT"), count("GET"), n)
	}
}

// roundTripper is an http.RoundTripper of a function.
type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClusterFleets checks that two fleets in the namespace see nothing
// of each other (records, feed, conversation locks), and that the default
// fleet's lock has the plain LockName.
func TestClusterFleets(t *testing.T) {
	c := needCluster(t)
	a := c.store(t, "a")
	other := c.storeWith(t, "b", "kubestore-other-"+c.tag, c.berth)
	sub := kubestore.Collect(t, other)
	id := c.newID(t)
	if err := a.Put(record(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Get(id); !errdefs.IsNotFound(err) {
		t.Fatalf("another fleet's Get: %v, want not found", err)
	}
	err := other.ForEach(func(l lease.Lease) error {
		if l.ID == id {
			t.Errorf("another fleet's ForEach has %s", id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conv := c.conversation(t, "carol")
	otherLock := kubestore.FleetLockName("kubestore-other-"+c.tag, "carol", conv)
	defaultLock := kubestore.LockName("carol", conv)
	t.Cleanup(func() {
		for _, n := range []string{otherLock, defaultLock} {
			_ = c.kube.CoordinationV1().Leases(c.ns).Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	id1, id2, id3 := c.newID(t), c.newID(t), c.newID(t)
	if h, err := a.LockConversation(ctx, "carol", conv, id1); err != nil || h != id1 {
		t.Fatal(h, err)
	}
	if h, err := other.LockConversation(ctx, "carol", conv, id2); err != nil || h != id2 {
		t.Fatalf("another fleet's lock of the conversation: %s, %v; want its own", h, err)
	}
	def := c.storeWith(t, "d", "", c.berth)
	if h, err := def.LockConversation(ctx, "carol", conv, id3); err != nil || h != id3 {
		t.Fatal(h, err)
	}
	if _, err := c.kube.CoordinationV1().Leases(c.ns).Get(ctx, defaultLock, metav1.GetOptions{}); err != nil {
		t.Fatalf("the default fleet's lock is not LockName: %v", err)
	}
	kubestore.ExpectNone(t, "the other fleet", sub, time.Second)
}

// TestClusterStaleWrite: a Put whose record has fewer transitions than the
// stored one (a snapshot older than another replica's transition) is
// dropped, from the informer's copy or after a Conflict; one with as many
// or more is written.
func TestClusterStaleWrite(t *testing.T) {
	c := needCluster(t)
	a, b := c.store(t, "a"), c.store(t, "b")
	id := c.newID(t)
	older := record(id)
	older.Transitions = older.Transitions[:2]
	older.State, older.Reason = lease.StateReady, "agent ready"
	if err := b.Put(older); err != nil {
		t.Fatal(err)
	}
	newer := record(id) // PAUSED: one transition more
	if err := a.Put(newer); err != nil {
		t.Fatal(err)
	}
	// b writes its old snapshot again, with and without having seen a's write.
	for range 2 {
		if err := b.Put(older); err != nil {
			t.Fatal(err)
		}
		got, err := a.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != lease.StatePaused || len(got.Transitions) != 3 {
			t.Fatalf("after a stale Put: %s with %d transitions, want PAUSED with 3", got.State, len(got.Transitions))
		}
		time.Sleep(200 * time.Millisecond) // b's informer has a's write now
	}
	same := record(id)
	same.Reason = "renewed elsewhere"
	if err := b.Put(same); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(id); err != nil || got.Reason != "renewed elsewhere" {
		t.Fatalf("a Put with as many transitions: %q, %v; want it written", got.Reason, err)
	}
}
