package kubernetes

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// podCache is the backend's one informer on the namespace's berth Pods
// (LabelManaged=true), started by New for the Runtime's lifetime: Get,
// List, the waits of Create, Restart and Stop, and every Watch read it
// instead of asking the API server (one watch for the whole backend, not
// one per Watch or per Create).
//
// Read-your-writes: the cache lags the API server by a watch event. A Pod
// berth just created may not be in it yet, so a name the cache does not
// hold is read from the API server (getPod); the waits match the Pod they
// wait for by UID, so that a replaced Pod's old object (Restart) is not
// taken for the new one. Before the informer has synced (the API server
// unreachable at start) reads go to the API server.
type podCache struct {
	factory informers.SharedInformerFactory
	inf     cache.SharedIndexInformer
	lister  corelisters.PodLister

	// seenRV is the highest resourceVersion of the Pods the informer's
	// events delivered: the cache holds every change up to it.
	seenRV atomic.Uint64

	mu sync.Mutex
	// answered are the Pods (by UID) whose agent answered Create's or
	// Restart's health check: running even while the kubelet has not
	// reported their container running yet (see Runtime.sandbox).
	answered map[types.UID]struct{}
	// waiters are the channels of the waits (waitPod) on each Pod name,
	// poked (without blocking) on every event of that name.
	waiters map[string]map[chan struct{}]struct{}
}

// newPodCache returns the cache of namespace ns's berth Pods; start runs it.
func newPodCache(cs kubernetes.Interface, ns string) (*podCache, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector(nil) }))
	pods := factory.Core().V1().Pods()
	c := &podCache{factory: factory, inf: pods.Informer(), lister: pods.Lister(),
		answered: map[types.UID]struct{}{}, waiters: map[string]map[chan struct{}]struct{}{}}
	poke := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok {
			if rv, ok := parseRV(p.ResourceVersion); ok {
				for cur := c.seenRV.Load(); rv > cur && !c.seenRV.CompareAndSwap(cur, rv); cur = c.seenRV.Load() {
				}
			}
			c.poke(p.Name)
		}
	}
	if _, err := c.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    poke,
		UpdateFunc: func(_, obj any) { poke(obj) },
		DeleteFunc: func(obj any) {
			poke(obj)
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				c.mu.Lock()
				delete(c.answered, p.UID)
				c.mu.Unlock()
			}
		},
	}); err != nil {
		return nil, errdefs.Internal("kubernetes: pod informer: %v", err)
	}
	return c, nil
}

// start runs the informer until stop closes.
func (c *podCache) start(stop <-chan struct{}) { c.factory.Start(stop) }

// shutdown waits for the informer's goroutines once stop has closed.
func (c *podCache) shutdown() { c.factory.Shutdown() }

// synced reports whether the informer holds the namespace's Pods.
func (c *podCache) synced() bool { return c.inf.HasSynced() }

// waitSynced waits until the informer has synced; false when ctx ended
// first.
func (c *podCache) waitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), c.inf.HasSynced)
}

// poke wakes the waits on Pod name.
func (c *podCache) poke(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ch := range c.waiters[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// markAnswered records that Pod uid's agent answered its health check.
func (c *podCache) markAnswered(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answered[uid] = struct{}{}
}

// hasAnswered reports whether Pod uid's agent answered its health check.
func (c *podCache) hasAnswered(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.answered[uid]
	return ok
}

// subscribe returns a channel poked on each event of Pod name, and the
// func that ends the subscription.
func (c *podCache) subscribe(name string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	if c.waiters[name] == nil {
		c.waiters[name] = map[chan struct{}]struct{}{}
	}
	c.waiters[name][ch] = struct{}{}
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.waiters[name], ch)
		if len(c.waiters[name]) == 0 {
			delete(c.waiters, name)
		}
	}
}

// cached returns Pod name as the informer holds it (not to be modified),
// nil when it holds none.
func (c *podCache) cached(ns, name string) *corev1.Pod {
	p, err := c.lister.Pods(ns).Get(name)
	if err != nil {
		return nil
	}
	return p
}

// getPod returns Pod name: from the informer once it has synced, else,
// and when the informer does not hold it (a Pod created a moment ago),
// from the API server. The Pod is shared with the cache: not to be
// modified.
func (r *Runtime) getPod(ctx context.Context, name string) (*corev1.Pod, error) {
	if r.pods.synced() {
		if p := r.pods.cached(r.cfg.Namespace, name); p != nil {
			return p, nil
		}
	}
	return r.cs.CoreV1().Pods(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
}

// listPods returns the berth Pods (LabelManaged=true) matching the
// Kubernetes label selector sel: from the informer once it has synced,
// else from the API server. The Pods are shared with the cache: not to be
// modified.
func (r *Runtime) listPods(ctx context.Context, sel string) ([]*corev1.Pod, error) {
	if r.pods.synced() {
		s, err := labels.Parse(sel)
		if err != nil {
			return nil, errdefs.Internal("kubernetes: label selector %q: %v", sel, err)
		}
		return r.pods.lister.Pods(r.cfg.Namespace).List(s)
	}
	list, err := r.cs.CoreV1().Pods(r.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// parseRV reads a resourceVersion as the number etcd makes it; ok is
// false for another storage's (opaque) versions.
func parseRV(rv string) (uint64, bool) {
	n, err := strconv.ParseUint(rv, 10, 64)
	return n, err == nil
}

// waitPod waits, on the informer, until done says Pod ref (its name and
// UID; as of its resourceVersion) is done or fails, ctx ends, or the Pod
// is deleted (NotFound). An object of another UID (the Pod a Restart
// replaced, still in the cache) is skipped; the Pod's absence is waited
// through until the informer has caught up with ref's resourceVersion
// (a Pod created a moment ago), then it is a deletion.
func (r *Runtime) waitPod(ctx context.Context, ref *corev1.Pod, done func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	name := ref.Name
	poked, unsubscribe := r.pods.subscribe(name)
	defer unsubscribe()
	if !r.pods.waitSynced(ctx) {
		return nil, ctx.Err()
	}
	refRV, known := parseRV(ref.ResourceVersion)
	seen := false
	for {
		// The version first: the cache then holds every change up to it.
		upTo := r.pods.seenRV.Load()
		p := r.pods.cached(r.cfg.Namespace, name)
		switch {
		case p != nil && p.UID == ref.UID:
			seen = true
			if ok, err := done(p); err != nil || ok {
				return p, err
			}
		case seen, known && upTo >= refRV:
			return nil, errdefs.NotFound("kubernetes: pod %s was deleted", name)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-poked:
		}
	}
}

// managedPod returns sandbox id's Pod (getPod); NotFound also for a Pod
// berth did not create.
func (r *Runtime) managedPod(ctx context.Context, id string) (*corev1.Pod, error) {
	pod, err := r.getPod(ctx, id)
	if err != nil {
		return nil, r.apiErr(err, "get pod", id)
	}
	if err := runtime.CheckManaged("kubernetes", id, pod.Labels); err != nil {
		return nil, err
	}
	return pod, nil
}

// sandbox translates pod into a Sandbox (sandboxOf). A Pod whose agent
// answered this backend's health check is running, with its endpoint,
// even before the kubelet reports its container running: the kubelet
// writes that at its next sync of the Pod, up to a second later (its
// PLEG's relist period), and the lease manager would take a READY lease's
// sandbox that is not running for a dead one.
func (r *Runtime) sandbox(pod *corev1.Pod) runtime.Sandbox {
	sb := sandboxOf(pod)
	if sb.State == runtime.StateCreated && pod.Status.PodIP != "" && pod.DeletionTimestamp == nil && r.pods.hasAnswered(pod.UID) {
		sb.State = runtime.StateRunning
		sb.Endpoint = podEndpoint(pod)
	}
	return sb
}
