package kubernetes

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/berth-dev/berth/pkg/runtime"
)

// Spare workspace claims (Config.SpareClaims; docs/kubernetes.md, "The
// workspace"): a sandbox without a persistent workspace needs a claim at
// /workspace (Restart and hibernate replace its Pod and keep the files),
// and with a StorageClass that binds at once Create would wait for that
// claim's binding before it creates the Pod. The backend therefore keeps
// a few claims made ahead, bound, of the default size and class: Create
// takes one (one patch, no wait) when one of its size is there, and
// creates a claim as before when none is.
//
//   - A spare carries LabelManaged, the instance label of the replica that
//     made it and LabelSpareClaim, whose value is the fleet's (spareValue of
//     Config.LeaderLease): fleets sharing a namespace keep their own.
//   - Create takes one with a JSON merge patch carrying the claim's
//     resourceVersion: the API server applies one patch per version, so
//     two Creates (on one replica or two) never take the same spare; the
//     loser gets a Conflict and tries another, at most spareTakeAttempts,
//     then creates a claim as before. The patch makes the claim the
//     sandbox's: the Pod's labels (LabelSandbox among them) replace the
//     spare's, takenAnnotation records when. The Pod mounts it by its name
//     and names it in workspaceClaimAnnotation, so Remove deletes it, and
//     the orphan sweep deletes it once its Pod is gone (its age counted
//     from the take), as it does the claims Create makes.
//   - One replica refills: the one elected over the Lease
//     Config.LeaderLease+"-spares", after every take, at start and every
//     spareRefillEvery. It counts the fleet's spares (a List: the
//     informer lags its own creations), creates what is missing, and
//     deletes those of another size or class (the configuration changed)
//     and those beyond Config.SpareClaims (two replicas refilled at once
//     during a change of leader), each delete with the claim's
//     resourceVersion as precondition, so that a spare taken meanwhile is
//     not deleted.
//   - Close of the refilling replica deletes the fleet's spares (the same
//     precondition): an orchestrator stopped leaves none. One killed leaves
//     them, and the next elected replica counts them as its own.

// Names of the spare claims' labels and annotations.
const (
	// LabelSpareClaim marks a spare workspace claim not taken yet; its
	// value names the fleet (spareValue).
	LabelSpareClaim = "dev.berth.spare-claim"
	// workspaceClaimAnnotation on a sandbox Pod names the claim mounted at
	// /workspace when Create took a spare (else it is claimName).
	workspaceClaimAnnotation = "dev.berth/workspace-claim"
	// takenAnnotation on a taken spare is when Create took it (RFC 3339).
	takenAnnotation = "dev.berth/spare-taken"
	// spareNamePrefix prefixes the spares' generated names.
	spareNamePrefix = "berth-spare-"
	// spareTakeAttempts bounds the spares a Create tries to take before it
	// creates a claim of its own.
	spareTakeAttempts = 3
	// spareRefillEvery is how often the refilling replica looks at the
	// spares without a take to prompt it.
	spareRefillEvery = 30 * time.Second
	// spareCloseTimeout bounds Close's deletion of the spares.
	spareCloseTimeout = 10 * time.Second
)

// spareSet is a Runtime's part of the spare claims: the informer Create
// picks from, and the refill.
type spareSet struct {
	r *Runtime
	// n is Config.SpareClaims.
	n int
	// value is LabelSpareClaim's value for this fleet; identity this
	// replica's in the refill election and the instance label of the
	// spares it makes: Config.InstanceID, else the host's name and a
	// random suffix.
	value, identity string
	factory         informers.SharedInformerFactory
	lister          corelisters.PersistentVolumeClaimLister
	synced          cache.InformerSynced
	// leading is set while this replica refills (it stays set when Close
	// ends the election: Close then deletes the spares).
	leading atomic.Bool
	// kick asks the refill loop to look now.
	kick chan struct{}
	// wffcLogged is set once the refill logged that the class binds
	// late.
	wffcLogged atomic.Bool
}

// SpareLeaseOf is the coordination.k8s.io Lease over which the replicas
// of the fleet electing their leader over leaderLease elect the one that
// refills the spare claims.
func SpareLeaseOf(leaderLease string) string { return leaderLease + "-spares" }

// SpareSelector is the label selector of the spare claims (not taken) of
// the fleet electing its leader over leaderLease.
func SpareSelector(leaderLease string) string {
	return labels.SelectorFromSet(labels.Set{runtime.LabelManaged: "true", LabelSpareClaim: spareValue(leaderLease)}).String()
}

// spareValue returns LabelSpareClaim's value for the fleet electing over
// the Lease named lease: the name when it is a label value, else a hash.
func spareValue(lease string) string {
	if len(validation.IsValidLabelValue(lease)) == 0 {
		return lease
	}
	sum := sha256.Sum256([]byte(lease))
	return "h-" + hex.EncodeToString(sum[:8])
}

// newSpareSet returns r's spare set, nil when Config.SpareClaims is 0.
func newSpareSet(r *Runtime) *spareSet {
	if r.cfg.SpareClaims <= 0 {
		return nil
	}
	s := &spareSet{r: r, n: r.cfg.SpareClaims, value: spareValue(r.cfg.LeaderLease), identity: r.cfg.InstanceID,
		kick: make(chan struct{}, 1)}
	if s.identity == "" {
		// Unique per replica: the host's name (a StatefulSet's Pod name)
		// and a random suffix.
		b := make([]byte, 4)
		_, _ = crand.Read(b)
		host, _ := os.Hostname()
		if host == "" || len(host) > 40 || len(validation.IsValidLabelValue(host)) != 0 {
			host = "berth"
		}
		s.identity = host + "-" + hex.EncodeToString(b)
	}
	s.factory = informers.NewSharedInformerFactoryWithOptions(r.cs, 0,
		informers.WithNamespace(r.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.selector() }))
	claims := s.factory.Core().V1().PersistentVolumeClaims()
	s.synced = claims.Informer().HasSynced
	s.lister = claims.Lister()
	return s
}

// selector selects the fleet's spares.
func (s *spareSet) selector() string {
	return SpareSelector(s.r.cfg.LeaderLease)
}

// start runs the informer, the refill election and the refill loop until
// ctx ends (the Runtime's wait group counts them).
func (s *spareSet) start(ctx context.Context) {
	s.factory.Start(ctx.Done())
	r := s.r
	d := r.cfg.LeaderLeaseDuration
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		_ = r.RunElected(ctx, Election{Lease: SpareLeaseOf(r.cfg.LeaderLease), Identity: s.identity,
			LeaseDuration: d, RenewDeadline: d * 2 / 3, RetryPeriod: d / 7, Release: true}, func(lctx context.Context) {
			s.leading.Store(true)
			s.poke()
			<-lctx.Done()
			if ctx.Err() == nil { // leadership lost, not Close
				s.leading.Store(false)
			}
		})
	}()
	go func() { defer r.wg.Done(); s.loop(ctx) }()
}

// shutdown waits for the informer's goroutines once ctx has ended.
func (s *spareSet) shutdown() {
	if s != nil {
		s.factory.Shutdown()
	}
}

// poke asks the refill loop to look now (no wait).
func (s *spareSet) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// loop refills while this replica leads, until ctx ends; then, when it
// led, it deletes the spares.
func (s *spareSet) loop(ctx context.Context) {
	tick := time.NewTicker(spareRefillEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if s.leading.Load() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), spareCloseTimeout)
				n, err := s.removeAll(dctx)
				cancel()
				if err != nil {
					s.r.log.Warn("kubernetes: spare claims not all deleted at close", "deleted", n, "err", err)
				} else {
					s.r.log.Debug("kubernetes: spare claims deleted at close", "deleted", n)
				}
			}
			return
		case <-s.kick:
		case <-tick.C:
		}
		if !s.leading.Load() {
			continue
		}
		if err := s.refill(ctx); err != nil && ctx.Err() == nil {
			s.r.log.Warn("kubernetes: spare claims not refilled", "err", err)
		}
	}
}

// spareSize returns the storage a workspace claim of spec requests.
func spareSize(spec corev1.PersistentVolumeClaimSpec) int64 {
	q := spec.Resources.Requests[corev1.ResourceStorage]
	return q.Value()
}

// spareFits reports whether claim c can stand for a workspace claim of
// spec want: the same size, the same class when want names one (a claim
// of the default class holds its name once created), ReadWriteOnce.
func spareFits(c *corev1.PersistentVolumeClaim, want corev1.PersistentVolumeClaimSpec) bool {
	if spareSize(c.Spec) != spareSize(want) || !slices.Contains(c.Spec.AccessModes, corev1.ReadWriteOnce) {
		return false
	}
	if want.StorageClassName != nil && (c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != *want.StorageClassName) {
		return false
	}
	return true
}

// takeable reports whether spare c of the fleet value may be taken by a
// Create of spec want: still spare, not being deleted, bound, fitting.
func takeable(c *corev1.PersistentVolumeClaim, value string, want corev1.PersistentVolumeClaimSpec) bool {
	return c.Labels[LabelSpareClaim] == value && c.DeletionTimestamp == nil && c.Status.Phase == corev1.ClaimBound && spareFits(c, want)
}

// takePatch returns the JSON merge patch that makes spare c the workspace
// claim of pod: c's resourceVersion (the precondition), pod's labels in
// place of the spare's (null removes those pod has not), berth's labels in
// labelsAnnotation, and takenAnnotation at now.
func takePatch(c *corev1.PersistentVolumeClaim, pod *corev1.Pod, now time.Time) ([]byte, error) {
	kube := map[string]any{}
	for k := range c.Labels {
		kube[k] = nil
	}
	for k, v := range pod.Labels {
		kube[k] = v
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": c.ResourceVersion,
		"labels":          kube,
		"annotations": map[string]string{
			labelsAnnotation: pod.Annotations[labelsAnnotation],
			takenAnnotation:  now.UTC().Format(time.RFC3339),
		},
	}})
}

// take makes a bound spare of spec want the workspace claim of pod (not
// created yet) and returns its name; "" when none could be taken (none
// fits, the informer has not synced, spareTakeAttempts were taken by
// others, an error): Create then makes a claim as before. It asks for a
// refill after a take. A nil set takes nothing.
func (s *spareSet) take(ctx context.Context, pod *corev1.Pod, want corev1.PersistentVolumeClaimSpec) string {
	if s == nil || !s.synced() {
		return ""
	}
	all, err := s.lister.PersistentVolumeClaims(s.r.cfg.Namespace).List(labels.Everything())
	if err != nil {
		return ""
	}
	var fit []*corev1.PersistentVolumeClaim
	for _, c := range all {
		if takeable(c, s.value, want) {
			fit = append(fit, c)
		}
	}
	// In another order for each Create: concurrent ones rarely try the
	// same spare first.
	rand.Shuffle(len(fit), func(i, j int) { fit[i], fit[j] = fit[j], fit[i] })
	claims := s.r.cs.CoreV1().PersistentVolumeClaims(s.r.cfg.Namespace)
	for i, c := range fit {
		if i == spareTakeAttempts {
			break
		}
		patch, err := takePatch(c, pod, time.Now())
		if err != nil {
			return ""
		}
		_, err = claims.Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			s.poke()
			return c.Name
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			continue // taken or deleted since the informer's copy
		default:
			s.r.log.Warn("kubernetes: spare claim not taken; creating a claim", "claim", c.Name, "pod", pod.Name, "err", err)
			return ""
		}
	}
	if len(fit) > 0 {
		s.poke()
	}
	return ""
}

// spec is the spec of a spare: a workspace claim of the backend's default
// resources.
func (s *spareSet) spec() corev1.PersistentVolumeClaimSpec {
	return s.r.claimSpec(runtime.Resources{}.WithDefaults(s.r.cfg.DefaultResources).WithDefaults(runtime.DefaultResources()))
}

// refill brings the fleet's spares to n: it creates the missing ones and
// deletes those that do not fit the configuration and those beyond n.
// With a StorageClass that binds claims only for a Pod
// (WaitForFirstConsumer) it makes none: a spare would never be bound, and
// Create does not wait for such a claim anyway. (The cluster's default
// class is not read: its spares stay Pending, never taken, when it binds
// late.)
func (s *spareSet) refill(ctx context.Context) error {
	r := s.r
	if class := r.cfg.StorageClass; class != "" && !r.bindsAtOnce(ctx, class) {
		if !s.wffcLogged.Swap(true) {
			r.log.Info("kubernetes: no spare claims: the storage class binds claims only for a Pod, or cannot be read", "class", class)
		}
		return nil
	}
	claims := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace)
	list, err := claims.List(ctx, metav1.ListOptions{LabelSelector: s.selector()})
	if err != nil {
		return r.apiErr(err, "list spare persistentvolumeclaims", "")
	}
	want := s.spec()
	have := 0
	for i := range list.Items {
		c := &list.Items[i]
		if c.DeletionTimestamp != nil {
			continue
		}
		if spareFits(c, want) && have < s.n {
			have++
			continue
		}
		if err := s.deleteSpare(ctx, c); err != nil {
			return err
		}
	}
	for ; have < s.n; have++ {
		c := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{GenerateName: spareNamePrefix, Namespace: r.cfg.Namespace, Labels: map[string]string{
				runtime.LabelManaged: "true", runtime.LabelInstance: s.identity, LabelSpareClaim: s.value}},
			Spec: want,
		}
		if len(validation.IsValidLabelValue(s.identity)) != 0 {
			delete(c.Labels, runtime.LabelInstance)
		}
		created, err := claims.Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			return r.apiErr(err, "create spare persistentvolumeclaim", spareNamePrefix)
		}
		r.log.Debug("kubernetes: spare claim created", "claim", created.Name)
	}
	return nil
}

// deleteSpare deletes spare c unless it changed since (a take: the
// precondition fails, and the claim is a sandbox's now).
func (s *spareSet) deleteSpare(ctx context.Context, c *corev1.PersistentVolumeClaim) error {
	rv := c.ResourceVersion
	err := s.r.cs.CoreV1().PersistentVolumeClaims(s.r.cfg.Namespace).Delete(ctx, c.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID, ResourceVersion: &rv}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return s.r.apiErr(err, "delete spare persistentvolumeclaim", c.Name)
	}
	return nil
}

// removeAll deletes the fleet's spares (Close of the refilling replica)
// and returns how many.
func (s *spareSet) removeAll(ctx context.Context) (int, error) {
	list, err := s.r.cs.CoreV1().PersistentVolumeClaims(s.r.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: s.selector()})
	if err != nil {
		return 0, s.r.apiErr(err, "list spare persistentvolumeclaims", "")
	}
	n := 0
	for i := range list.Items {
		c := &list.Items[i]
		if c.DeletionTimestamp != nil {
			continue
		}
		if err := s.deleteSpare(ctx, c); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// useClaim makes pod mount claim (a taken spare) at /workspace and name it
// in workspaceClaimAnnotation.
func useClaim(pod *corev1.Pod, claim string) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[workspaceClaimAnnotation] = claim
	for i := range pod.Spec.Volumes {
		if v := &pod.Spec.Volumes[i]; v.Name == workspaceVolume && v.PersistentVolumeClaim != nil {
			v.PersistentVolumeClaim.ClaimName = claim
		}
	}
}

// ownClaim returns the name of pod's own workspace claim (the one Remove
// deletes): the spare it took, else claimName. A Pod on a persistent
// workspace has none; its claimName does not exist.
func ownClaim(pod *corev1.Pod) string {
	if c := pod.Annotations[workspaceClaimAnnotation]; c != "" {
		return c
	}
	return claimName(pod.Name)
}

// claimAge returns how long ago claim c became what it is: created, or,
// for a taken spare, taken.
func claimAge(c *corev1.PersistentVolumeClaim, now time.Time) time.Duration {
	since := c.CreationTimestamp.Time
	if t, err := time.Parse(time.RFC3339, c.Annotations[takenAnnotation]); err == nil && t.After(since) {
		since = t
	}
	return now.Sub(since)
}
