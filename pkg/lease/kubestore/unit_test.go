package kubestore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/runtime"
)

// RandomID returns a random lease id (26 chars of [0-9a-v]). Like
// FullLeaseAt it is exported to the external cluster tests.
func RandomID(t *testing.T) string {
	t.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	id := strings.ToLower(base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
	if !lease.ValidID(id) {
		t.Fatalf("random id %q is not a lease id", id)
	}
	return id
}

// fullLease returns a lease with every field set (times in UTC, without a
// monotonic reading, as they come back from JSON).
func fullLease(id string) lease.Lease {
	return FullLeaseAt(id, time.Date(2026, 12, 1, 6, 30, 15, 123456789, time.UTC))
}

// FullLeaseAt returns a lease with every field set, its times counted from
// at. It is exported to the external cluster tests (kubestore_test), which
// build their records the same way.
func FullLeaseAt(id string, at time.Time) lease.Lease {
	return lease.Lease{
		ID:             id,
		ConversationID: "conv-" + id,
		Owner:          "alice@example.com",
		Labels:         map[string]string{"team": "core", "x/y": "with space"},
		Image:          "berth/minimal:latest",
		User:           "1000:1000",
		Env:            map[string]string{"A": "1", "EMPTY": ""},
		SecretNames:    []string{"gh", "npm"},
		Resources:      runtime.Resources{NanoCPUs: 1_500_000_000, MemoryBytes: 512 << 20, PidsLimit: 256, DiskBytes: 1<<60 + 1},
		PublicPorts:    []int{3000, 8080},
		Network:        lease.NetworkPolicy{Mode: "allowlist", Allow: []string{"github.com"}, Deny: []string{"10.0.0.0/8"}},
		Volume:         "berth-ws-abc",
		Mounts:         []runtime.Mount{{Type: runtime.MountBind, Source: "/srv/data", Target: "/data", ReadOnly: true, VolumeLabels: map[string]string{"k": "v"}}},
		State:          lease.StatePaused,
		Reason:         "idle for 10m0s",
		CreatedAt:      at,
		UpdatedAt:      at.Add(time.Minute),
		ExpiresAt:      at.Add(time.Hour),
		LastActivityAt: at.Add(30 * time.Second),
		TTL:            time.Hour,
		IdleTimeout:    10 * time.Minute,
		Paused:         lease.PauseHibernate,
		PausedAt:       at.Add(time.Minute),
		IdlePolicy:     lease.IdleHibernate,
		Pool:           "warm",
		Phase:          lease.PhaseClaiming, // READY/claiming: cycled (transitions_test.go) moves it on like READY
		Instance:       "replica-1",
		ContainerID:    "berth-" + id,
		Endpoint:       "10.214.0.7:7000",
		Transitions: []lease.Transition{
			{From: lease.StateUnspecified, To: lease.StatePending, Reason: "acquired", At: at},
			{From: lease.StatePending, To: lease.StateReady, Reason: "agent ready", At: at.Add(5 * time.Second)},
			{From: lease.StateReady, To: lease.StatePaused, Reason: "idle for 10m0s", At: at.Add(time.Minute)},
		},
		EndedAt:         at.Add(2 * time.Hour),
		Restarts:        2,
		Cleaned:         true,
		DiskEnforcement: runtime.DiskEnforcementEngine,
		Usage:           lease.Usage{DiskBytes: 12345, MeasuredAt: at.Add(3 * time.Second)},
		Warnings:        []string{"disk limit exceeded: 2 of 1 bytes"},
	}
}

// TestLockName checks the lock's name: the prefix, the first 40 hex digits
// of sha256(owner NUL conversation), a DNS label, distinct per pair.
func TestLockName(t *testing.T) {
	sum := sha256.Sum256([]byte("alice\x00c1"))
	if got, want := LockName("alice", "c1"), "berth-conv-"+hex.EncodeToString(sum[:])[:40]; got != want {
		t.Fatalf("LockName = %q, want %q", got, want)
	}
	long := strings.Repeat("ü", 500)
	for _, n := range []string{LockName("", ""), LockName(long, long), LockName("alice", "c1")} {
		if len(n) != 51 || len(validation.IsDNS1123Label(n)) > 0 {
			t.Errorf("%q: not a 51-char DNS label", n)
		}
	}
	if LockName("alice", "c1") == LockName("alice", "c2") || LockName("alice", "c1") == LockName("bob", "c1") {
		t.Error("two conversations share a lock name")
	}
	if FleetLockName("", "alice", "c1") != LockName("alice", "c1") || FleetLockName("default", "alice", "c1") != LockName("alice", "c1") {
		t.Error("the default fleet's lock name is not LockName")
	}
	sum = sha256.Sum256([]byte("f1\x00alice\x00c1"))
	if got, want := FleetLockName("f1", "alice", "c1"), "berth-conv-"+hex.EncodeToString(sum[:])[:40]; got != want {
		t.Errorf("FleetLockName = %q, want %q", got, want)
	}
}

// TestLabels checks the labels of a record: managed-by always, state and
// instance only as valid label values.
func TestLabels(t *testing.T) {
	for _, tc := range []struct {
		instance string
		state    lease.State
		want     map[string]string
	}{
		{"replica-1", lease.StateReady, map[string]string{LabelFleet: "f1", LabelManagedBy: "berth", LabelState: "READY", LabelInstance: "replica-1"}},
		{"", lease.StatePending, map[string]string{LabelFleet: "f1", LabelManagedBy: "berth", LabelState: "PENDING"}},
		{"host name/with space", lease.StateFailed, map[string]string{LabelFleet: "f1", LabelManagedBy: "berth", LabelState: "FAILED"}},
		{strings.Repeat("a", 64), lease.StateExpired, map[string]string{LabelFleet: "f1", LabelManagedBy: "berth", LabelState: "EXPIRED"}},
		{strings.Repeat("a", 63), lease.StateUnspecified, map[string]string{LabelFleet: "f1", LabelManagedBy: "berth", LabelInstance: strings.Repeat("a", 63)}},
		{"-leading", lease.StateReleased, map[string]string{LabelFleet: "f1", LabelManagedBy: "berth", LabelState: "RELEASED"}},
	} {
		if got := labelsOf(lease.Lease{Instance: tc.instance, State: tc.state}, "f1"); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("labelsOf(instance %q, state %q) = %v, want %v", tc.instance, tc.state, got, tc.want)
		}
	}
}

// TestEncodeDecode round-trips a full lease through the object, and
// through its JSON (what the API server stores), integers past 2^53
// included.
func TestEncodeDecode(t *testing.T) {
	l := fullLease(RandomID(t))
	u, err := encode(l, "berth", "f1", "replica-2")
	if err != nil {
		t.Fatal(err)
	}
	if u.GetName() != l.ID || u.GetNamespace() != "berth" || u.GetKind() != Kind || u.GetAPIVersion() != "berth.dev/v1alpha1" {
		t.Fatalf("object %s %s/%s %s", u.GetAPIVersion(), u.GetNamespace(), u.GetName(), u.GetKind())
	}
	if writerOf(u) != "replica-2" {
		t.Fatalf("writer %q", writerOf(u))
	}
	if got := u.GetLabels()[LabelState]; got != "PAUSED" {
		t.Fatalf("state label %q", got)
	}
	// DeepCopy panics on values an unstructured object may not hold
	// (float64 is allowed, but json's float64 would lose DiskBytes).
	back, err := decode(u.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, l) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", back, l)
	}
	b, err := json.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	var wire unstructured.Unstructured
	if err := wire.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	back, err = decode(&wire)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, l) {
		t.Fatalf("decoded from JSON\n%+v\nwant\n%+v", back, l)
	}
}

// TestEncodeBadName checks that an id that cannot name an object is an
// invalid argument (lease ids always can).
func TestEncodeBadName(t *testing.T) {
	for _, id := range []string{"", "Upper", "with space", "under_score", strings.Repeat("a", 254)} {
		if _, err := encode(lease.Lease{ID: id}, "berth", "f1", "a"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("encode(id %q) = %v, want invalid argument", id, err)
		}
	}
}

// TestDecodeErrors checks that objects that do not hold a record are
// internal errors naming the object.
func TestDecodeErrors(t *testing.T) {
	obj := func(spec any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "berth.dev/v1alpha1", "kind": Kind}}
		if spec != nil {
			u.Object["spec"] = spec
		}
		u.SetName("l1")
		u.SetNamespace("berth")
		return u
	}
	for name, u := range map[string]*unstructured.Unstructured{
		"no spec":       obj(nil),
		"no record":     obj(map[string]any{}),
		"record string": obj(map[string]any{"record": "x"}),
		"bad field":     obj(map[string]any{"record": map[string]any{"id": "l1", "created_at": "yesterday"}}),
		"bad ttl":       obj(map[string]any{"record": map[string]any{"id": "l1", "ttl": "1h"}}),
		"other id":      obj(map[string]any{"record": map[string]any{"id": "l2"}}),
	} {
		_, err := decode(u)
		if !errdefs.IsInternal(err) || !strings.Contains(err.Error(), "berth/l1") {
			t.Errorf("%s: decode = %v, want an internal error naming berth/l1", name, err)
		}
	}
	l, err := decode(obj(map[string]any{"record": map[string]any{"state": "READY"}}))
	if err != nil || l.ID != "l1" || l.State != lease.StateReady {
		t.Errorf("record without id: %+v, %v; want id l1 from the name", l, err)
	}
}

// TestCategory checks the mapping of API errors to berth's categories.
func TestCategory(t *testing.T) {
	gr := GVR.GroupResource()
	for _, tc := range []struct {
		err  error
		want error
	}{
		{apierrors.NewNotFound(gr, "x"), errdefs.ErrNotFound},
		{apierrors.NewAlreadyExists(gr, "x"), errdefs.ErrAlreadyExists},
		{apierrors.NewConflict(gr, "x", errors.New("rv")), errdefs.ErrFailedPrecondition},
		{apierrors.NewForbidden(gr, "x", errors.New("rbac")), errdefs.ErrPermissionDenied},
		{apierrors.NewUnauthorized("token"), errdefs.ErrUnauthenticated},
		{apierrors.NewTooManyRequests("slow down", 1), errdefs.ErrUnavailable},
		{apierrors.NewBadRequest("bad"), errdefs.ErrInvalidArgument},
		{errors.New("odd"), errdefs.ErrInternal},
	} {
		if got := category(tc.err); got != tc.want {
			t.Errorf("category(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	s := &Store{cfg: Config{Namespace: "berth"}, host: "https://h"}
	err := s.apiErr(apierrors.NewForbidden(gr, "x", errors.New("rbac")), "list", "")
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "Role of deploy/kubernetes") {
		t.Errorf("forbidden: %v", err)
	}
	if err := s.apiErr(context.DeadlineExceeded, "get", "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline: %v", err)
	}
}

// fakeClients are the fake API server's clients of the unit tests.
type fakeClients struct {
	dyn  *dynamicfake.FakeDynamicClient
	kube *kubefake.Clientset
}

func newFakeClients() fakeClients {
	return fakeClients{
		dyn:  dynamicfake.NewSimpleDynamicClientWithCustomListKinds(k8sruntime.NewScheme(), map[schema.GroupVersionResource]string{GVR: Kind + "List"}),
		kube: kubefake.NewClientset(),
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (f fakeClients) store(t *testing.T, instance string) *Store {
	t.Helper()
	s, err := newStore(context.Background(), Config{Namespace: "berth", Instance: instance, Logger: quietLogger()}, f.dyn, f.kube, "fake")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestNewValidates checks New's arguments.
func TestNewValidates(t *testing.T) {
	f := newFakeClients()
	for name, cfg := range map[string]Config{
		"no namespace":  {Instance: "a"},
		"bad namespace": {Namespace: "Berth", Instance: "a"},
		"no instance":   {Namespace: "berth"},
	} {
		if _, err := newStore(context.Background(), cfg, f.dyn, f.kube, "fake"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	if _, err := New(context.Background(), Config{Namespace: "berth", Instance: "a"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no REST config: %v", err)
	}
}

// TestNewNoCRD checks the error when the resource is not served.
func TestNewNoCRD(t *testing.T) {
	f := newFakeClients()
	f.dyn.PrependReactor("list", Resource, func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		return true, nil, apierrors.NewNotFound(GVR.GroupResource(), "")
	})
	_, err := newStore(context.Background(), Config{Namespace: "berth", Instance: "a"}, f.dyn, f.kube, "fake")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRD berthleases.berth.dev is not installed: kubectl apply -f deploy/kubernetes/") {
		t.Fatalf("New without the CRD: %v", err)
	}
}

// Event is one call of a Subscribe callback and when it came.
type Event struct {
	L       lease.Lease
	Deleted bool
	At      time.Time
}

// Collect runs s.Subscribe until the test ends, sending its calls about ids
// (every call, when no id is given) to the returned channel. Collect,
// Expect and ExpectNone are exported to the cluster tests, like
// FullLeaseAt.
func Collect(t *testing.T, s *Store, ids ...string) <-chan Event {
	t.Helper()
	ch := make(chan Event, 100)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := s.Subscribe(ctx, func(l lease.Lease, deleted bool) {
			if len(ids) == 0 || slices.Contains(ids, l.ID) {
				ch <- Event{l, deleted, time.Now()}
			}
		})
		if ctx.Err() == nil {
			t.Errorf("Subscribe ended: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return ch
}

// Expect waits up to 10 s for the next event on ch and fails unless it is
// id's (deleted or not). who names the subscriber in the failure.
func Expect(t *testing.T, who string, ch <-chan Event, id string, deleted bool) Event {
	t.Helper()
	select {
	case ev := <-ch:
		if ev.L.ID != id || ev.Deleted != deleted {
			t.Fatalf("%s got %s deleted=%v, want %s deleted=%v", who, ev.L.ID, ev.Deleted, id, deleted)
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no event %s deleted=%v in 10s", who, id, deleted)
	}
	panic("unreachable")
}

// ExpectNone fails on any event on ch within wait.
func ExpectNone(t *testing.T, who string, ch <-chan Event, wait time.Duration) {
	t.Helper()
	select {
	case ev := <-ch:
		t.Fatalf("%s got %s deleted=%v, want nothing", who, ev.L.ID, ev.Deleted)
	case <-time.After(wait):
	}
}

// TestFakeStore runs the store's methods and its feed on the fake API
// server: writes, reads, the writer filter, skipped records.
func TestFakeStore(t *testing.T) {
	f := newFakeClients()
	a, b := f.store(t, "a"), f.store(t, "b")
	l1 := fullLease(RandomID(t))
	if err := a.Put(l1); err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(l1.ID)
	if err != nil || !reflect.DeepEqual(got, l1) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := b.Get(RandomID(t)); !errdefs.IsNotFound(err) {
		t.Fatalf("Get missing: %v", err)
	}
	if _, err := b.Get("Not A Name"); !errdefs.IsNotFound(err) {
		t.Fatalf("Get of an invalid name: %v", err)
	}
	subA, subB := Collect(t, a), Collect(t, b)
	Expect(t, "b (replay)", subB, l1.ID, false)
	// a's feed replays nothing of its own writes, and the fake API server
	// does not replay what a watch opened late missed: a write of b's
	// that a sees says a's watch is open before the events checked below.
	l2 := fullLease(RandomID(t))
	if err := b.Put(l2); err != nil {
		t.Fatal(err)
	}
	Expect(t, "a (live)", subA, l2.ID, false)
	l1.State = lease.StateReady
	if err := a.Put(l1); err != nil {
		t.Fatal(err)
	}
	if ev := Expect(t, "b", subB, l1.ID, false); ev.L.State != lease.StateReady {
		t.Fatalf("update delivered state %s", ev.L.State)
	}
	// A record that does not decode is skipped.
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "berth.dev/v1alpha1", "kind": Kind, "spec": map[string]any{"record": map[string]any{"ttl": "x"}}}}
	bad.SetName("bad")
	bad.SetNamespace("berth")
	bad.SetLabels(map[string]string{LabelFleet: DefaultFleet})
	if _, err := f.dyn.Resource(GVR).Namespace("berth").Create(context.Background(), bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(l1.ID, "missing", "Not A Name"); err != nil {
		t.Fatal(err)
	}
	Expect(t, "a", subA, l1.ID, true)
	ExpectNone(t, "b", subB, 300*time.Millisecond)
	ExpectNone(t, "a", subA, 0)
	if err := a.ForEach(func(lease.Lease) error { return nil }); !errdefs.IsInternal(err) {
		t.Fatalf("ForEach over a record that does not decode: %v", err)
	}
}

// TestDeletedName checks the name of a delete event's object.
func TestDeletedName(t *testing.T) {
	u := &unstructured.Unstructured{}
	u.SetName("l1")
	for _, tc := range []struct {
		obj  any
		want string
	}{
		{u, "l1"},
		{cache.DeletedFinalStateUnknown{Key: "berth/l2", Obj: u}, "l1"},
		{cache.DeletedFinalStateUnknown{Key: "berth/l2"}, "l2"},
		{"junk", ""},
	} {
		if got := deletedName(tc.obj); got != tc.want {
			t.Errorf("deletedName(%#v) = %q, want %q", tc.obj, got, tc.want)
		}
	}
}

// TestFakeLock runs the conversation lock on the fake API server.
func TestFakeLock(t *testing.T) {
	f := newFakeClients()
	a, b := f.store(t, "a"), f.store(t, "b")
	ctx := context.Background()
	if h, err := a.LockConversation(ctx, "alice", "c1", "id1"); err != nil || h != "id1" {
		t.Fatalf("lock: %q, %v", h, err)
	}
	if h, err := b.LockConversation(ctx, "alice", "c1", "id2"); err != nil || h != "id1" {
		t.Fatalf("second lock: %q, %v", h, err)
	}
	obj, err := f.kube.CoordinationV1().Leases("berth").Get(ctx, LockName("alice", "c1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if obj.Labels[LabelKind] != KindConversationLock || obj.Labels[LabelManagedBy] != ManagedBy {
		t.Fatalf("lock labels %v", obj.Labels)
	}
	if ok, err := b.TakeConversation(ctx, "alice", "c1", "wrong", "id2"); err != nil || ok {
		t.Fatalf("take from the wrong holder: %v, %v", ok, err)
	}
	if ok, err := b.TakeConversation(ctx, "alice", "c1", "id1", "id2"); err != nil || !ok {
		t.Fatalf("take: %v, %v", ok, err)
	}
	if ok, err := b.TakeConversation(ctx, "alice", "nope", "id1", "id2"); err != nil || ok {
		t.Fatalf("take a missing lock: %v, %v", ok, err)
	}
	if err := a.UnlockConversation(ctx, "alice", "c1", "id1"); err != nil {
		t.Fatal(err)
	}
	if h, _ := a.LockConversation(ctx, "alice", "c1", "id3"); h != "id2" {
		t.Fatalf("after a non-holder's unlock the holder is %q", h)
	}
	if err := b.UnlockConversation(ctx, "alice", "c1", "id2"); err != nil {
		t.Fatal(err)
	}
	if h, _ := a.LockConversation(ctx, "alice", "c1", "id3"); h != "id3" {
		t.Fatalf("after the holder's unlock the holder is %q", h)
	}
	if err := a.UnlockConversation(ctx, "alice", "missing", "id3"); err != nil {
		t.Fatal(err)
	}
}

// TestSubscribeClose checks that Close ends a Subscribe, and that a
// Subscribe on a closed Store fails at once.
func TestSubscribeClose(t *testing.T) {
	f := newFakeClients()
	s, err := newStore(context.Background(), Config{Namespace: "berth", Instance: "a", Logger: quietLogger()}, f.dyn, f.kube, "fake")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Subscribe(context.Background(), func(lease.Lease, bool) {}) }()
	time.Sleep(50 * time.Millisecond)
	s.Close()
	select {
	case err := <-done:
		if !errdefs.IsUnavailable(err) {
			t.Fatalf("Subscribe after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Subscribe still running after Close")
	}
	if err := s.Subscribe(context.Background(), func(lease.Lease, bool) {}); !errdefs.IsUnavailable(err) {
		t.Fatalf("Subscribe on a closed store: %v", err)
	}
	s.Close() // twice is fine
}

// TestFakeFleets checks that two fleets on one namespace see nothing of
// each other: records (Get, ForEach, Subscribe) and conversation locks.
func TestFakeFleets(t *testing.T) {
	f := newFakeClients()
	a := f.store(t, "a") // the default fleet
	other, err := newStore(context.Background(), Config{Namespace: "berth", Instance: "b", Fleet: "f2", Logger: quietLogger()}, f.dyn, f.kube, "fake")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	sub := Collect(t, other)
	l := fullLease(RandomID(t))
	if err := a.Put(l); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Get(l.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("another fleet's Get: %v, want not found", err)
	}
	n := 0
	if err := other.ForEach(func(lease.Lease) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("another fleet's ForEach: %d records, %v", n, err)
	}
	ExpectNone(t, "the other fleet", sub, 300*time.Millisecond)
	ctx := context.Background()
	if h, err := a.LockConversation(ctx, "alice", "c1", "id1"); err != nil || h != "id1" {
		t.Fatal(h, err)
	}
	if h, err := other.LockConversation(ctx, "alice", "c1", "id2"); err != nil || h != "id2" {
		t.Fatalf("another fleet's lock of the conversation: %q, %v; want its own", h, err)
	}
	if _, err := newStore(ctx, Config{Namespace: "berth", Instance: "c", Fleet: "not a label"}, f.dyn, f.kube, "fake"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad fleet: %v", err)
	}
}
