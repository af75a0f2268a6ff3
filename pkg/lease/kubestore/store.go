package kubestore

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// Config configures a Store.
type Config struct {
	// REST is how to reach the API server (a kubeconfig's, or the
	// in-cluster config). It is copied; QPS and Burst default to 100 and
	// 200 when zero (client-go's 5 and 10 would throttle a busy replica).
	REST *rest.Config
	// Namespace holds the BerthLeases and the conversation locks: the
	// orchestrator's namespace. Required.
	Namespace string
	// Instance is this replica's instance id: it is written in the
	// AnnotationWriter of every record the Store puts, and Subscribe
	// leaves out the records it wrote last. Required.
	Instance string
	// Fleet names the replicas that share leases (orchestrator --fleet):
	// the Store labels its records and locks with it (LabelFleet), reads
	// and feeds only its fleet's records, and puts it in the names of its
	// conversation locks (FleetLockName), so that two fleets share a
	// namespace without seeing each other. "" is DefaultFleet. It must be
	// a valid label value.
	Fleet string
	// Logger receives the records Subscribe skips; slog.Default() if nil.
	Logger *slog.Logger
}

// Store is the lease.SharedStore held in a Kubernetes cluster (see the
// package documentation for the objects). It is safe for concurrent use.
// Close it when done.
type Store struct {
	cfg  Config
	log  *slog.Logger
	host string
	dyn  dynamic.ResourceInterface // the namespace's BerthLeases
	cs   kubernetes.Interface
	inf  cache.SharedIndexInformer

	bg     context.Context // ends with Close
	stop   context.CancelFunc
	wg     sync.WaitGroup
	closer sync.Once

	// dmu guards deleted: the ids this Store deleted recently, whose
	// deletion events Subscribe leaves out, with when (pruned after
	// deletedMemory).
	dmu     sync.Mutex
	deleted map[string]time.Time

	// wmu guards written: the resourceVersion of this Store's last write
	// of a record, kept until the informer shows that version (or another
	// replica's write, or the deletion), so that a Put right after a Put
	// updates over the version it wrote instead of the cache's older one
	// (a Conflict, and a read, saved).
	wmu     sync.Mutex
	written map[string]string
}

var _ lease.SharedStore = (*Store)(nil)

// Timeouts and limits; variables so that tests can shorten them.
var (
	// syncTimeout bounds New's first list and the informer's sync.
	syncTimeout = 30 * time.Second
	// callTimeout bounds each call of the methods that take no context.
	callTimeout = 30 * time.Second
	// deletedMemory is how long a deletion of this Store's is remembered
	// (its event is expected within milliseconds; a watch that broke may
	// take a relist to deliver it).
	deletedMemory = 10 * time.Minute
)

const (
	// putAttempts bounds Put's attempts when the record changes under it
	// (Conflict) or appears or vanishes between a read and a write.
	putAttempts = 10
	// listPage is the page size of ForEach's list.
	listPage = 500
	// fieldManager names the store's writes in managedFields.
	fieldManager = "berth-orchestrator"
)

// New connects to the cluster, checks that the CRD is installed (an error
// wrapping errdefs.ErrFailedPrecondition that says "CRD
// berthleases.berth.dev is not installed: kubectl apply -f
// deploy/kubernetes/" otherwise), and starts an informer on the
// namespace's BerthLeases, waiting for its first sync (at most 30 s, and
// ctx). ctx bounds only New: the informer runs until Close.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.REST == nil {
		return nil, errdefs.InvalidArgument("rest", "kubestore: no REST config")
	}
	rc := rest.CopyConfig(cfg.REST)
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 100, 200
	}
	if rc.UserAgent == "" {
		rc.UserAgent = "berth-orchestrator"
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, errdefs.InvalidArgument("rest", "kubestore: %v", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, errdefs.InvalidArgument("rest", "kubestore: %v", err)
	}
	return newStore(ctx, cfg, dyn, cs, rc.Host)
}

// newStore is New with the clients given (fakes, in unit tests).
func newStore(ctx context.Context, cfg Config, dyn dynamic.Interface, cs kubernetes.Interface, host string) (*Store, error) {
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, errdefs.InvalidArgument("namespace", "kubestore: %q: %s", cfg.Namespace, errs[0])
	}
	if cfg.Instance == "" {
		return nil, errdefs.InvalidArgument("instance", "kubestore: the replica's instance id is required")
	}
	if cfg.Fleet == "" {
		cfg.Fleet = DefaultFleet
	}
	if errs := validation.IsValidLabelValue(cfg.Fleet); len(errs) > 0 {
		return nil, errdefs.InvalidArgument("fleet", "kubestore: %q: %s", cfg.Fleet, errs[0])
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "kubestore"),
		host:    host,
		dyn:     dyn.Resource(GVR).Namespace(cfg.Namespace),
		cs:      cs,
		deleted: map[string]time.Time{},
		written: map[string]string{},
	}
	wctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	// A list first: an informer on a missing resource retries forever,
	// where this says what is missing.
	if _, err := s.dyn.List(wctx, metav1.ListOptions{Limit: 1, LabelSelector: s.selector()}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: kubestore: %s (namespace %s: %v)", errdefs.ErrFailedPrecondition, installHint, cfg.Namespace, err)
		}
		return nil, s.apiErr(err, "list "+Resource, "")
	}
	s.inf = dynamicinformer.NewFilteredDynamicInformer(dyn, GVR, cfg.Namespace, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = s.selector() }).Informer()
	// The cache keeps what the store reads, not the managedFields.
	if err := s.inf.SetTransform(func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			u.SetManagedFields(nil)
		}
		return obj, nil
	}); err != nil {
		return nil, errdefs.Internal("kubestore: informer transform: %v", err)
	}
	if _, err := s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.seen,
		UpdateFunc: func(_, obj any) { s.seen(obj) },
		DeleteFunc: func(obj any) { s.forgetWritten(deletedName(obj)) },
	}); err != nil {
		return nil, errdefs.Internal("kubestore: informer handler: %v", err)
	}
	s.bg, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.inf.RunWithContext(s.bg)
	}()
	if !cache.WaitForCacheSync(wctx.Done(), s.inf.HasSynced) {
		s.Close()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("kubestore: sync %s: %w", Resource, err)
		}
		return nil, errdefs.Unavailable("kubestore: the informer of %s in namespace %s did not sync in %s (is the API server at %s reachable?)",
			Resource, cfg.Namespace, syncTimeout, host)
	}
	return s, nil
}

// Close stops the informer; Subscribe returns. The Store must not be
// used afterwards. It returns nil.
func (s *Store) Close() error {
	s.closer.Do(func() {
		if s.stop != nil {
			s.stop()
		}
		s.wg.Wait()
	})
	return nil
}

// selector selects the BerthLeases of the Store's fleet.
func (s *Store) selector() string { return LabelFleet + "=" + s.cfg.Fleet }

// Namespace returns the namespace of the store's objects.
func (s *Store) Namespace() string { return s.cfg.Namespace }

// Instance returns the instance id the store writes its records as.
func (s *Store) Instance() string { return s.cfg.Instance }

// callCtx is the context of one call of a method that takes none.
func (s *Store) callCtx() (context.Context, context.CancelFunc) {
	parent := s.bg
	if parent == nil {
		parent = context.Background()
	}
	return context.WithTimeout(parent, callTimeout)
}

// Put implements lease.Store: it creates the BerthLease l.ID, or replaces
// it whatever it holds (last writer wins: an update with the
// resourceVersion last seen, retried with the current one on Conflict),
// marked as written by this Store's Instance. It returns once the API
// server has stored it (etcd: durable).
func (s *Store) Put(l lease.Lease) error {
	ctx, cancel := s.callCtx()
	defer cancel()
	return s.put(ctx, l)
}

func (s *Store) put(ctx context.Context, l lease.Lease) error {
	u, err := encode(l, s.cfg.Namespace, s.cfg.Fleet, s.cfg.Instance)
	if err != nil {
		return err
	}
	s.forgetDeleted(l.ID)
	if cur := s.cached(l.ID); cur != nil && s.stale(l, cur) {
		return nil
	}
	rv, exists := s.knownRV(l.ID)
	for attempt := 1; ; attempt++ {
		var err error
		if !exists {
			u.SetResourceVersion("")
			var out *unstructured.Unstructured
			out, err = s.dyn.Create(ctx, u, metav1.CreateOptions{FieldManager: fieldManager})
			s.noteWritten(l.ID, out, err)
			if err == nil || !apierrors.IsAlreadyExists(err) || attempt >= putAttempts {
				return s.apiErr(err, "create "+Kind, l.ID)
			}
		} else {
			u.SetResourceVersion(rv)
			var out *unstructured.Unstructured
			out, err = s.dyn.Update(ctx, u, metav1.UpdateOptions{FieldManager: fieldManager})
			s.noteWritten(l.ID, out, err)
			switch {
			case err == nil || attempt >= putAttempts:
				return s.apiErr(err, "update "+Kind, l.ID)
			case apierrors.IsNotFound(err): // deleted since: create it
				exists = false
				continue
			case !apierrors.IsConflict(err):
				return s.apiErr(err, "update "+Kind, l.ID)
			}
		}
		// Exists with another version than we knew: read it, write over
		// it. Past the first retry another writer is busy on the record:
		// a jittered pause lets one of us through.
		if attempt > 1 {
			select {
			case <-ctx.Done():
				return s.apiErr(ctx.Err(), "put "+Kind, l.ID)
			case <-time.After(time.Duration(rand.Int64N(int64(attempt) * int64(5*time.Millisecond)))):
			}
		}
		cur, gerr := s.dyn.Get(ctx, l.ID, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			exists = false
		case gerr != nil:
			return s.apiErr(gerr, "get "+Kind, l.ID)
		default:
			if s.stale(l, cur) {
				return nil
			}
			rv, exists = cur.GetResourceVersion(), true
		}
	}
}

// stale reports whether the record l is older than the stored cur: cur
// has made more transitions (kept and dropped; the count only grows).
// Writing l would move the lease back (a replica's activity write,
// snapshotted before the release another replica wrote reached it); it is
// dropped instead, and the writer's memory catches up through Subscribe.
// Records with as many transitions are last-writer-wins.
func (s *Store) stale(l lease.Lease, cur *unstructured.Unstructured) bool {
	ts, found, err := unstructured.NestedSlice(cur.Object, "spec", "record", "transitions")
	if err != nil || !found {
		return false
	}
	stored := len(ts) + storedDropped(cur)
	if stored <= l.TransitionCount() {
		return false
	}
	s.log.Debug("dropping a stale write: the stored record has moved on", "lease_id", l.ID,
		"state", string(l.State), "transitions", l.TransitionCount(), "stored_transitions", stored)
	return true
}

// storedDropped returns the stored record's transitions_dropped (0 when
// absent). JSON numbers decode as int64, or float64 from some decoders.
func storedDropped(cur *unstructured.Unstructured) int {
	v, found, err := unstructured.NestedFieldNoCopy(cur.Object, "spec", "record", "transitions_dropped")
	if err != nil || !found {
		return 0
	}
	switch n := v.(type) {
	case int64:
		return int(n)
	case float64:
		return int(n)
	}
	return 0
}

// cached returns the informer's copy of BerthLease id, nil when it has none.
func (s *Store) cached(id string) *unstructured.Unstructured {
	if s.inf == nil {
		return nil
	}
	obj, ok, err := s.inf.GetStore().GetByKey(s.cfg.Namespace + "/" + id)
	if err != nil || !ok {
		return nil
	}
	u, _ := obj.(*unstructured.Unstructured)
	return u
}

// knownRV returns the resourceVersion to update BerthLease id over, and
// whether it exists as far as this Store knows: the version of its own
// last write the informer has not shown yet, else the informer's cache's.
func (s *Store) knownRV(id string) (string, bool) {
	s.wmu.Lock()
	rv, ok := s.written[id]
	s.wmu.Unlock()
	if ok {
		return rv, true
	}
	if u := s.cached(id); u != nil {
		return u.GetResourceVersion(), true
	}
	return "", false
}

// noteWritten records the version of a write of this Store's (out, after
// a create or update that returned err).
func (s *Store) noteWritten(id string, out *unstructured.Unstructured, err error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err == nil && out != nil && out.GetResourceVersion() != "" {
		s.written[id] = out.GetResourceVersion()
	} else {
		delete(s.written, id)
	}
}

// seen is the informer's news of a BerthLease: once it shows this Store's
// last write, or another replica's, the cache is as new as written.
func (s *Store) seen(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if rv, ok := s.written[u.GetName()]; ok && (rv == u.GetResourceVersion() || writerOf(u) != s.cfg.Instance) {
		delete(s.written, u.GetName())
	}
}

// forgetWritten drops what this Store knows of its writes of id.
func (s *Store) forgetWritten(id string) {
	s.wmu.Lock()
	delete(s.written, id)
	s.wmu.Unlock()
}

// PutAll implements lease.Store with one Put per record, in order. It is
// NOT atomic on this store (the API server has no multi-object
// transaction): on an error, the records before the failing one are
// written and the rest are not; putting them all again is safe.
func (s *Store) PutAll(ls []lease.Lease) error {
	for i, l := range ls {
		if err := s.Put(l); err != nil {
			if len(ls) > 1 {
				return fmt.Errorf("kubestore: put %d leases: %d written before: %w", len(ls), i, err)
			}
			return err
		}
	}
	return nil
}

// Get implements lease.Store, reading from the API server (not the
// informer's cache), so it sees every Put that returned, of any replica.
// A record of another fleet is not found.
func (s *Store) Get(id string) (lease.Lease, error) {
	if checkName(id) != nil {
		return lease.Lease{}, errdefs.NotFound("lease %s", id)
	}
	ctx, cancel := s.callCtx()
	defer cancel()
	u, err := s.dyn.Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && u.GetLabels()[LabelFleet] != s.cfg.Fleet) {
		return lease.Lease{}, errdefs.NotFound("lease %s", id)
	}
	if err != nil {
		return lease.Lease{}, s.apiErr(err, "get "+Kind, id)
	}
	return decode(u)
}

// Delete implements lease.Store with one delete per record, in order: it
// is NOT atomic on this store (on an error, the records before the failing
// one are deleted; deleting them again is success). A missing record, or
// an id that cannot name one, is success.
func (s *Store) Delete(ids ...string) error {
	ctx, cancel := s.callCtx()
	defer cancel()
	for _, id := range ids {
		if checkName(id) != nil {
			continue
		}
		s.rememberDeleted(id)
		s.forgetWritten(id)
		err := s.dyn.Delete(ctx, id, metav1.DeleteOptions{})
		switch {
		case err == nil:
		case apierrors.IsNotFound(err):
			s.forgetDeleted(id) // someone else's deletion, if any
		default:
			s.forgetDeleted(id)
			return s.apiErr(err, "delete "+Kind, id)
		}
	}
	return nil
}

// ForEach implements lease.Store, in id order, reading the fleet's
// records from the API server (a paginated list, not the informer's
// cache), so it sees every Put that returned. A record that does not decode stops it with an error
// wrapping errdefs.ErrInternal (as the bbolt store does): skipping it
// would make its sandbox an orphan.
func (s *Store) ForEach(fn func(lease.Lease) error) error {
	var all []unstructured.Unstructured
	ctx, cancel := s.callCtx()
	cont := ""
	for {
		list, err := s.dyn.List(ctx, metav1.ListOptions{Limit: listPage, Continue: cont, LabelSelector: s.selector()})
		if err != nil {
			cancel()
			return s.apiErr(err, "list "+Resource, "")
		}
		all = append(all, list.Items...)
		if cont = list.GetContinue(); cont == "" {
			break
		}
	}
	cancel()
	slices.SortFunc(all, func(a, b unstructured.Unstructured) int { return strings.Compare(a.GetName(), b.GetName()) })
	for i := range all {
		l, err := decode(&all[i])
		if err != nil {
			return err
		}
		if err := fn(l); err != nil {
			return err
		}
	}
	return nil
}

// rememberDeleted notes that this Store deletes id, and forgets the
// deletions older than deletedMemory.
func (s *Store) rememberDeleted(id string) {
	now := time.Now()
	s.dmu.Lock()
	defer s.dmu.Unlock()
	for k, at := range s.deleted {
		if now.Sub(at) > deletedMemory {
			delete(s.deleted, k)
		}
	}
	s.deleted[id] = now
}

// forgetDeleted drops id from the deletions of this Store.
func (s *Store) forgetDeleted(id string) {
	s.dmu.Lock()
	delete(s.deleted, id)
	s.dmu.Unlock()
}

// deletedHere reports whether this Store deleted id recently.
func (s *Store) deletedHere(id string) bool {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	at, ok := s.deleted[id]
	return ok && time.Since(at) <= deletedMemory
}
