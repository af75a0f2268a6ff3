package kubernetes

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// cachePod is a berth Pod (or, with managed false, a Pod berth did not
// create) of namespace ns, running.
func cachePod(name string, managed bool) *corev1.Pod {
	labels := map[string]string{"app": "other"}
	if managed {
		labels = map[string]string{runtime.LabelManaged: "true", runtime.LabelLease: name, "color": "blue"}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: containerName, Image: "img"}}},
		Status: corev1.PodStatus{PodIP: "10.0.0.1", ContainerStatuses: []corev1.ContainerStatus{{
			Name: containerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
}

// startFake starts a Runtime over a fake clientset holding objs, and
// waits until its informer has synced and its first reconciliation of
// orphans ran; then it forgets the requests made so far.
func startFake(t *testing.T, objs ...*corev1.Pod) (*Runtime, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset()
	for _, p := range objs {
		if _, err := cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Namespace: "ns", Logger: slog.New(slog.DiscardHandler), OrphanAge: time.Hour, ReadyTimeout: time.Minute}
	r, err := start(context.Background(), cfg, cs, &rest.Config{Host: "fake"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !r.pods.waitSynced(ctx) {
		t.Fatal("the informer did not sync")
	}
	for !hasAction(cs, "list", "persistentvolumeclaims") {
		select {
		case <-ctx.Done():
			t.Fatal("no reconciliation of orphans")
		case <-time.After(5 * time.Millisecond):
		}
	}
	cs.ClearActions()
	return r, cs
}

func hasAction(cs *fake.Clientset, verb, resource string) bool {
	return countActions(cs, verb, resource) > 0
}

func countActions(cs *fake.Clientset, verb, resource string) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// TestCacheReads: Get and List read the informer, not the API server; a
// Pod the informer does not hold (just created, or not berth's) is read
// from the API server.
func TestCacheReads(t *testing.T) {
	r, cs := startFake(t, cachePod("berth-a", true), cachePod("berth-b", true), cachePod("other", false))
	ctx := context.Background()
	for range 10 {
		sb, err := r.Get(ctx, "berth-a")
		if err != nil || sb.State != runtime.StateRunning || sb.Endpoint != "10.0.0.1:7000" {
			t.Fatalf("Get = %+v, %v", sb, err)
		}
		list, err := r.List(ctx, nil)
		if err != nil || len(list) != 2 {
			t.Fatalf("List = %d sandboxes, %v; want the 2 berth pods", len(list), err)
		}
		list, err = r.List(ctx, runtime.Selector{runtime.LabelLease: "berth-b"})
		if err != nil || len(list) != 1 || list[0].ID != "berth-b" {
			t.Fatalf("List(lease berth-b) = %+v, %v", list, err)
		}
	}
	if _, err := r.Usage(ctx, "berth-b"); err != nil {
		t.Fatal(err)
	}
	if got := countActions(cs, "get", "pods") + countActions(cs, "list", "pods"); got != 0 {
		t.Errorf("%d get/list requests for pods, want 0 (read from the informer): %v", got, cs.Actions())
	}

	// Not in the informer: asked of the API server.
	if _, err := r.Get(ctx, "other"); !errdefs.IsNotFound(err) {
		t.Errorf("Get of a pod berth did not create: %v, want NotFound", err)
	}
	if _, err := r.Get(ctx, "missing"); !errdefs.IsNotFound(err) {
		t.Errorf("Get of a missing pod: %v, want NotFound", err)
	}
	if got := countActions(cs, "get", "pods"); got != 2 {
		t.Errorf("%d get requests for pods, want 2 (the names the informer does not hold)", got)
	}

	// Read-your-writes: a Pod created a moment ago is found at once.
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, cachePod("berth-new", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if sb, err := r.Get(ctx, "berth-new"); err != nil || sb.ID != "berth-new" {
		t.Errorf("Get right after the Pod's creation = %+v, %v", sb, err)
	}
}

// TestCacheWaitPod: waitPod wakes on the informer's events, skips the
// object of a replaced Pod (another UID) and reports a deletion.
func TestCacheWaitPod(t *testing.T) {
	old := cachePod("berth-w", true)
	old.UID = "old"
	old.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}
	r, cs := startFake(t, old)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods := cs.CoreV1().Pods("ns")

	// A replacement (Restart): waiting on the new UID ignores the old,
	// exited object still in the cache.
	type result struct {
		p   *corev1.Pod
		err error
	}
	got := make(chan result, 1)
	next := cachePod("berth-w", true)
	next.UID = "new"
	next.Status = corev1.PodStatus{}
	go func() {
		p, err := r.waitPod(ctx, next, func(p *corev1.Pod) (bool, error) {
			if err := podProblem(p); err != nil {
				return false, err
			}
			return sandboxOf(p).Endpoint != "", nil
		})
		got <- result{p, err}
	}()
	if err := pods.Delete(ctx, "berth-w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, next, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := next.DeepCopy()
	running.Status = cachePod("berth-w", true).Status
	if _, err := pods.UpdateStatus(ctx, running, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.err != nil || res.p.UID != "new" {
		t.Fatalf("waitPod = %v, %v; want the new pod running", res.p, res.err)
	}

	// A deletion ends the wait with NotFound.
	observed := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := r.waitPod(ctx, next, func(*corev1.Pod) (bool, error) { once.Do(func() { close(observed) }); return false, nil })
		got <- result{nil, err}
	}()
	<-observed
	if err := pods.Delete(ctx, "berth-w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if res := <-got; !errdefs.IsNotFound(res.err) {
		t.Errorf("waitPod of a deleted pod: %v, want NotFound", res.err)
	}
	// A Pod deleted before the wait began: once the informer is past the
	// Pod's resourceVersion, its absence is a deletion (the fake
	// clientset keeps the versions it is given).
	gone := cachePod("berth-gone", true)
	gone.ResourceVersion = "5"
	later := cachePod("berth-later", true)
	later.ResourceVersion = "9"
	for _, p := range []*corev1.Pod{gone, later} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pods.Delete(ctx, "berth-gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for r.pods.cached("ns", "berth-later") == nil || r.pods.cached("ns", "berth-gone") != nil {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := r.waitPod(ctx, gone, func(*corev1.Pod) (bool, error) { return false, nil }); !errdefs.IsNotFound(err) {
		t.Errorf("waitPod of a pod deleted before the wait: %v, want NotFound", err)
	}
	if n := countActions(cs, "get", "pods") + countActions(cs, "watch", "pods"); n != 0 {
		t.Errorf("waitPod made %d get/watch requests for pods, want 0 (the informer's events)", n)
	}
}

// TestCacheWatch: every Watch is fed by the one informer (no watch
// request of its own), and each subscriber gets the events.
func TestCacheWatch(t *testing.T) {
	r, cs := startFake(t, cachePod("berth-x", true))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w1, err := r.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	w2, err := r.Watch(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	pods := cs.CoreV1().Pods("ns")
	dead := cachePod("berth-x", true)
	dead.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3}}
	if _, err := pods.UpdateStatus(ctx, dead, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(30 * time.Second)
	for i, w := range []<-chan runtime.Event{w1, w2} {
		select {
		case ev := <-w:
			if ev.Kind != runtime.EventDied || ev.ID != "berth-x" || ev.ExitCode != 3 {
				t.Errorf("watch %d: %+v, want berth-x died with 3", i, ev)
			}
		case <-timeout:
			t.Fatalf("watch %d: no event", i)
		}
	}
	// A Watch that ends closes its channel; the others go on.
	cancel2()
	for range w2 {
	}
	if err := pods.Delete(ctx, "berth-x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w1:
		if ev.Kind != runtime.EventRemoved || ev.ID != "berth-x" {
			t.Errorf("after delete: %+v, want berth-x removed", ev)
		}
	case <-timeout:
		t.Fatal("no removal event")
	}
	if n := countActions(cs, "watch", "pods") + countActions(cs, "list", "pods"); n != 0 {
		t.Errorf("the Watches made %d list/watch requests for pods, want 0 (the informer's)", n)
	}
	// Close ends the remaining Watch.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for range w1 {
	}
}

// TestCacheAnswered: a Pod whose agent answered Create's health check is
// running (with its endpoint) although the kubelet still reports its
// container waiting; another such Pod is only created.
func TestCacheAnswered(t *testing.T) {
	waiting := func(name string) *corev1.Pod {
		p := cachePod(name, true)
		p.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
		return p
	}
	r, _ := startFake(t, waiting("berth-answered"), waiting("berth-waiting"))
	r.pods.markAnswered("uid-berth-answered")
	ctx := context.Background()
	if sb, err := r.Get(ctx, "berth-answered"); err != nil || sb.State != runtime.StateRunning || sb.Endpoint != "10.0.0.1:7000" {
		t.Errorf("Get of a pod whose agent answered = %+v, %v; want running at 10.0.0.1:7000", sb, err)
	}
	if sb, err := r.Get(ctx, "berth-waiting"); err != nil || sb.State != runtime.StateCreated || sb.Endpoint != "" {
		t.Errorf("Get of a pod whose container waits = %+v, %v; want created, no endpoint", sb, err)
	}
}
