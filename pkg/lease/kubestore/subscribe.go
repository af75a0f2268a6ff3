package kubestore

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// Subscribe implements lease.SharedStore from the Store's informer: it
// adds an event handler, which first replays the BerthLeases the cache
// holds (as the informer does for every handler it is given), then
// delivers each add, update and delete, in the order of the API server's
// watch, from the one goroutine of that handler. It leaves out:
//
//   - adds and updates of records whose AnnotationWriter is this Store's
//     Instance (this replica wrote them last);
//   - deletions this Store made (Delete); every other deletion is
//     delivered, whoever wrote the record last, as lease.Lease{ID: name}
//     with deleted true (also when the informer lost the object's last
//     state: cache.DeletedFinalStateUnknown).
//
// A record that does not decode is logged and skipped. Subscribe returns
// ctx's error when ctx ends, or an error wrapping errdefs.ErrUnavailable
// once the Store is closed; fn is not called after it returns.
func (s *Store) Subscribe(ctx context.Context, fn func(l lease.Lease, deleted bool)) error {
	if s.inf == nil || s.bg == nil {
		return errdefs.Unavailable("kubestore: store not started")
	}
	if err := s.bg.Err(); err != nil {
		return errdefs.Unavailable("kubestore: store closed")
	}
	var (
		mu      sync.Mutex
		stopped bool
	)
	deliver := func(l lease.Lease, deleted bool) {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			fn(l, deleted)
		}
	}
	reg, err := s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.changed(obj, deliver) },
		UpdateFunc: func(_, obj any) { s.changed(obj, deliver) },
		DeleteFunc: func(obj any) { s.removed(obj, deliver) },
	})
	if err != nil {
		return errdefs.Unavailable("kubestore: subscribe: %v", err)
	}
	defer func() {
		_ = s.inf.RemoveEventHandler(reg)
		mu.Lock()
		stopped = true
		mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.bg.Done():
		return errdefs.Unavailable("kubestore: store closed")
	}
}

// changed delivers an added or updated BerthLease another replica wrote.
func (s *Store) changed(obj any, deliver func(lease.Lease, bool)) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || writerOf(u) == s.cfg.Instance || !s.inFleet(u) {
		return
	}
	l, err := decode(u)
	if err != nil {
		s.log.Warn("skipping a lease record that does not decode", "name", u.GetName(), "writer", writerOf(u), "err", err)
		return
	}
	deliver(l, false)
}

// removed delivers the deletion of a BerthLease, unless this Store
// deleted it.
func (s *Store) removed(obj any, deliver func(lease.Lease, bool)) {
	name := deletedName(obj)
	if name == "" || s.deletedHere(name) {
		return
	}
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if u, ok := obj.(*unstructured.Unstructured); ok && !s.inFleet(u) {
		return
	}
	deliver(lease.Lease{ID: name}, true)
}

// inFleet reports whether a BerthLease is of the Store's fleet (the
// informer's label selector already says so; this holds without it too).
func (s *Store) inFleet(u *unstructured.Unstructured) bool {
	return u.GetLabels()[LabelFleet] == s.cfg.Fleet
}

// deletedName returns the name of the object of a delete event: the
// object's, or, for a cache.DeletedFinalStateUnknown, its last known
// object's or its key's.
func deletedName(obj any) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		if u, ok := t.Obj.(*unstructured.Unstructured); ok {
			return u.GetName()
		}
		_, name, err := cache.SplitMetaNamespaceKey(t.Key)
		if err != nil {
			return ""
		}
		return name
	}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.GetName()
	}
	return ""
}
