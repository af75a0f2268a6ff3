package kubernetes

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// watchBuffer is how many events a Watch channel holds.
const watchBuffer = 64

// Watch delivers the sandboxes' deaths (a container that terminated, with
// its exit code; an OOM kill also as EventOOM) and removals (the Pod
// deleted) from an informer on the namespace's berth Pods — the API
// server's watch, not polling. The channel closes when ctx ends.
func (r *Runtime) Watch(ctx context.Context) (<-chan runtime.Event, error) {
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(r.cs, 0,
		informers.WithNamespace(r.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector(nil) }))
	inf := factory.Core().V1().Pods().Informer()
	raw := make(chan runtime.Event, watchBuffer)
	send := func(ev runtime.Event) {
		select {
		case raw <- ev:
		case <-ctx.Done():
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
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
		cancel()
		return nil, errdefs.Internal("kubernetes: watch pods: %v", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		cancel()
		factory.Shutdown()
		if err := r.Ping(context.WithoutCancel(ctx)); err != nil {
			return nil, err
		}
		return nil, errdefs.Unavailable("kubernetes: watch pods: the informer did not sync")
	}
	out := make(chan runtime.Event, watchBuffer)
	go func() {
		defer close(out)
		defer factory.Shutdown()
		defer cancel()
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-raw:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
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
