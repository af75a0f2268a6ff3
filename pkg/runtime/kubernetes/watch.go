package kubernetes

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// watchBuffer is how many events a Watch channel holds.
const watchBuffer = 64

// Watch delivers the sandboxes' deaths (a container that terminated, with
// its exit code; an OOM kill also as EventOOM) and removals (the Pod
// deleted) from the backend's one informer on the namespace's berth Pods
// (cache.go) — the API server's watch, not polling; each Watch is a
// handler of that informer, not a watch of its own. The channel closes
// when ctx ends.
func (r *Runtime) Watch(ctx context.Context) (<-chan runtime.Event, error) {
	if !r.pods.waitSynced(ctx) {
		if err := r.Ping(context.WithoutCancel(ctx)); err != nil {
			return nil, err
		}
		return nil, errdefs.Unavailable("kubernetes: watch pods: the informer did not sync: %v", ctx.Err())
	}
	ctx, cancel := context.WithCancel(ctx)
	// The Runtime's Close ends every Watch.
	stopAfter := context.AfterFunc(r.bg, cancel)
	out := make(chan runtime.Event, watchBuffer)
	// The informer gives each handler its own goroutine and unbounded
	// queue: a slow subscriber holds back neither the cache nor the other
	// subscribers.
	send := func(ev runtime.Event) {
		select {
		case out <- ev:
		case <-ctx.Done():
		}
	}
	reg, err := r.pods.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			old, ok1 := oldObj.(*corev1.Pod)
			cur, ok2 := newObj.(*corev1.Pod)
			if !ok1 || !ok2 {
				return
			}
			for _, ev := range died(old, cur) {
				send(ev)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			pod, ok := obj.(*corev1.Pod)
			if !ok {
				return
			}
			sb := sandboxOf(pod)
			send(runtime.Event{Kind: runtime.EventRemoved, ID: pod.Name, LeaseID: sb.LeaseID, At: time.Now()})
		},
	})
	if err != nil {
		stopAfter()
		cancel()
		return nil, errdefs.Unavailable("kubernetes: watch pods: %v", err)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer stopAfter()
		<-ctx.Done()
		// Once the handler has stopped (its pending calls return at
		// once: ctx has ended), nothing sends on out.
		_ = cache.ShutDownEventHandler(r.pods.inf, reg)
		close(out)
	}()
	return out, nil
}

// died returns the events of a Pod update in which the sandbox's container
// terminated: EventOOM when the kernel killed it, then EventDied.
func died(old, cur *corev1.Pod) []runtime.Event {
	was, is := mainStatus(old), mainStatus(cur)
	if is == nil || is.State.Terminated == nil || (was != nil && was.State.Terminated != nil) {
		return nil
	}
	sb := sandboxOf(cur)
	at := is.State.Terminated.FinishedAt.Time
	if at.IsZero() {
		at = time.Now()
	}
	ev := runtime.Event{Kind: runtime.EventDied, ID: cur.Name, LeaseID: sb.LeaseID, ExitCode: int(is.State.Terminated.ExitCode), At: at}
	if sb.OOMKilled {
		oom := ev
		oom.Kind = runtime.EventOOM
		return []runtime.Event{oom, ev}
	}
	return []runtime.Event{ev}
}
