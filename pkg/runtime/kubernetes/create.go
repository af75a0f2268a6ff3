package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Create takes a spare workspace claim for the sandbox (spare.go) or
// creates its workspace claim (or, for a persistent workspace, its
// volume's claim when missing: volumes.go), then its Pod and Secret
// (its agent token and secrets), waits until its agent answers health, and
// returns it. A Pod that already exists for the lease is ErrAlreadyExists.
// On failure nothing is left behind but a persistent workspace's claim
// (a Create cut short between its claim and its Pod leaves the claim,
// labelled with the Pod, to ReconcileOrphans).
//
// The Pod is created before its Secret, and Remove deletes the Secret
// before the Pod, so that every Secret berth makes has its Pod: the lease
// manager's reconciliation of Pods (List and Remove) removes what an
// interrupted Create left, and the Role need not let the orchestrator list
// Secrets (which would read them all). The container reads the Secret
// only once the init container has copied the agent, long after the
// Secret exists.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return runtime.Sandbox{}, err
	}
	for i, m := range spec.Mounts {
		if m.Type == runtime.MountBind {
			return runtime.Sandbox{}, errdefs.FailedPrecondition("kubernetes: mounts[%d]: the kubernetes runtime cannot mount host paths (%s)", i, m.Source)
		}
	}
	tl := newTimeline()
	res := spec.Resources.WithDefaults(r.cfg.DefaultResources).WithDefaults(runtime.DefaultResources())
	secret, pod := r.buildObjects(spec, res)
	b := r.backend()
	c, ctx, cancel := b.BeginCreate(ctx, spec, r.cfg.ReadyTimeout)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return runtime.Sandbox{}, c.Err(fmt.Errorf("kubernetes: create pod %s: %w", pod.Name, err))
	}

	// Calls that create something are not cut short by the caller's
	// context (the object would exist without anyone knowing); the
	// context is checked after each.
	dctx, dcancel := runtime.Detached(ctx)
	defer dcancel()
	// The volumes' claims, kept when the Create fails.
	if err := r.ensureVolumeClaims(ctx, spec, res, tl); err != nil {
		return runtime.Sandbox{}, c.Err(err)
	}
	if workspaceMount(spec) != nil {
		// A persistent workspace: its claim is ensured above.
	} else if spare := r.spares.take(dctx, pod, r.claimSpec(res)); spare != "" {
		// A spare claim, bound already (spare.go).
		useClaim(pod, spare)
		tl.mark(stepSpareTaken)
	} else {
		// The sandbox's own workspace claim; one left by a Create of this
		// lease that failed half-way is used again.
		claims := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace)
		claim, err := claims.Create(dctx, r.buildClaim(pod.ObjectMeta, res), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			claim, err = claims.Get(dctx, claimName(pod.Name), metav1.GetOptions{})
		}
		if err != nil {
			return runtime.Sandbox{}, r.apiErr(err, "create persistentvolumeclaim", claimName(pod.Name))
		}
		tl.mark(stepClaimCreated)
		if err := r.waitBound(ctx, claim); err != nil {
			_ = r.deleteClaim(dctx, claim.Name)
			return runtime.Sandbox{}, c.Err(err)
		}
		tl.mark(stepClaimBound)
	}
	created, err := r.cs.CoreV1().Pods(r.cfg.Namespace).Create(dctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		if c := pod.Annotations[workspaceClaimAnnotation]; c != "" {
			// The spare taken for this Pod is no other Pod's.
			_ = r.deleteClaim(dctx, c)
		}
		return runtime.Sandbox{}, b.AlreadyExists(spec.LeaseID, pod.Name, err)
	}
	if err != nil {
		_ = r.deleteStorage(dctx, pod.Name, ownClaim(pod))
		return runtime.Sandbox{}, r.apiErr(err, "create pod", pod.Name)
	}
	tl.mark(stepPodCreated)
	secrets := r.cs.CoreV1().Secrets(r.cfg.Namespace)
	if _, err := secrets.Create(dctx, secret, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		// A Create of this lease that failed half-way left its Secret:
		// it is replaced (deleted and created again: the Role grants no
		// update) before the container reads it.
		if err := r.deleteSecret(dctx, secret.Name); err != nil {
			return runtime.Sandbox{}, c.Fail(pod.Name, spec.LeaseID, err)
		}
		if _, err := secrets.Create(dctx, secret, metav1.CreateOptions{}); err != nil {
			return runtime.Sandbox{}, c.Fail(pod.Name, spec.LeaseID, r.apiErr(err, "create secret again", secret.Name))
		}
	} else if err != nil {
		return runtime.Sandbox{}, c.Fail(pod.Name, spec.LeaseID, r.apiErr(err, "create secret", secret.Name))
	}
	tl.mark(stepSecretCreated)
	if err := ctx.Err(); err != nil {
		return runtime.Sandbox{}, c.Fail(pod.Name, spec.LeaseID, fmt.Errorf("kubernetes: create pod %s: %w", pod.Name, err))
	}
	sb, err := r.waitReady(ctx, created, tl)
	if err != nil {
		return runtime.Sandbox{}, c.Fail(pod.Name, spec.LeaseID, err)
	}
	r.log.Debug("kubernetes: create timeline", append([]any{"pod", pod.Name}, tl.attrs()...)...)
	return sb, nil
}

// waitReady waits until pod's agent answers health, and returns its
// sandbox; a Pod that cannot get there fails at once (see podProblem). It
// probes the agent as soon as the Pod has an IP, not once the kubelet
// reports the container running: the kubelet writes that only at its next
// sync of the Pod, after its PLEG's relist (every second) noticed the
// start, while the agent listens a few milliseconds after it (a probe
// before is refused at once, and retried within milliseconds). tl, when
// not nil, records the steps it sees.
func (r *Runtime) waitReady(ctx context.Context, pod *corev1.Pod, tl *timeline) (runtime.Sandbox, error) {
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go r.watchFailureEvents(wctx, pod, stop)
	placed, err := r.waitPod(wctx, pod, func(p *corev1.Pod) (bool, error) {
		tl.observe(p)
		if err := podProblem(p); err != nil {
			return false, err
		}
		return p.Status.PodIP != "", nil
	})
	if cause := context.Cause(wctx); err != nil && ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	if err != nil {
		return runtime.Sandbox{}, err
	}
	// The informer's copy: no request per check.
	alive := func(ctx context.Context) error {
		p, err := r.getPod(ctx, pod.Name)
		if err != nil {
			return r.apiErr(err, "get pod", pod.Name)
		}
		if p.UID != pod.UID {
			return errdefs.NotFound("kubernetes: pod %s was replaced", pod.Name)
		}
		tl.observe(p)
		return podProblem(p)
	}
	if err := r.health.WaitReady(wctx, podEndpoint(placed), alive); err != nil {
		if cause := context.Cause(wctx); ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
		return runtime.Sandbox{}, err
	}
	tl.mark(stepAgentReady)
	r.pods.markAnswered(pod.UID)
	latest := placed
	if p := r.pods.cached(r.cfg.Namespace, pod.Name); p != nil && p.UID == pod.UID {
		latest = p
	}
	return r.sandbox(latest), nil
}

// podProblem returns the error of a Pod whose sandbox cannot become ready:
// an image that is not there or cannot be pulled (NotFound, naming the
// image), a container the runtime cannot create or start (a user the image
// lacks: FailedPrecondition), the agent's installer failing, or the
// sandbox's container exiting. nil while the Pod may still get there.
func podProblem(pod *corev1.Pod) error {
	for _, st := range pod.Status.InitContainerStatuses {
		if w := st.State.Waiting; w != nil {
			if err := waitingErr(pod, st.Name, st.Image, w); err != nil {
				return fmt.Errorf("%w (the agent image: build and load it with scripts/k8s/agent-image.sh, docs/kubernetes.md)", err)
			}
		}
		if t := st.State.Terminated; t != nil && t.ExitCode != 0 {
			return errdefs.FailedPrecondition("kubernetes: pod %s: the agent installer exited with code %d: %s %s", pod.Name, t.ExitCode, t.Reason, t.Message)
		}
	}
	st := mainStatus(pod)
	if st != nil {
		if w := st.State.Waiting; w != nil {
			if err := waitingErr(pod, st.Name, specImage(pod), w); err != nil {
				return err
			}
		}
		if t := st.State.Terminated; t != nil {
			return runtime.Backend{Name: "kubernetes", Noun: "pod"}.ExitedErr(pod.Name, int(t.ExitCode), t.Reason == "OOMKilled", strings.TrimSpace(t.Reason+" "+t.Message))
		}
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return errdefs.FailedPrecondition("kubernetes: pod %s ended (%s) before the agent was ready: %s %s", pod.Name, pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
	}
	if pod.DeletionTimestamp != nil {
		return errdefs.FailedPrecondition("kubernetes: pod %s is being deleted", pod.Name)
	}
	return nil
}

// specImage is the image of the sandbox's container as the Pod names it.
func specImage(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == containerName {
			return c.Image
		}
	}
	return ""
}

// Failure events: the kubelet publishes a container's failure to start in
// the Pod's status only at its next sync of the Pod (10 s or more later),
// but records an Event at once. After eventsAfter, the Pod's Warning events
// are read every eventsEvery (a List per second per pending create: cheap
// next to the Pod watch, and bounded by the client's rate limit).
const (
	eventsAfter = 1500 * time.Millisecond
	eventsEvery = time.Second
)

// watchFailureEvents reads pod's Warning events until ctx ends, and stops
// ctx with the error of the first one that says the sandbox cannot start
// (see eventErr).
func (r *Runtime) watchFailureEvents(ctx context.Context, pod *corev1.Pod, stop context.CancelCauseFunc) {
	sel := fields.Set{"involvedObject.name": pod.Name, "involvedObject.uid": string(pod.UID), "type": corev1.EventTypeWarning}.AsSelector().String()
	timer := time.NewTimer(eventsAfter)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		list, err := r.cs.CoreV1().Events(r.cfg.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return // no access to events (an older Role): the Pod's status still tells, later
		}
		for _, ev := range list.Items {
			if err := eventErr(pod, &ev); err != nil {
				stop(err)
				return
			}
		}
		timer.Reset(eventsEvery)
	}
}

// eventErr maps a kubelet Warning event of pod to the error of a sandbox
// that cannot start, nil for an event that does not mean that.
func eventErr(pod *corev1.Pod, ev *corev1.Event) error {
	container := ev.InvolvedObject.FieldPath // spec.containers{NAME}
	if _, name, ok := strings.Cut(container, "{"); ok {
		container = strings.TrimSuffix(name, "}")
	}
	image := specImage(pod)
	if container == installName {
		image = ""
		for _, c := range pod.Spec.InitContainers {
			image = c.Image
		}
	}
	var err error
	switch {
	case ev.Reason == "ErrImageNeverPull" || strings.Contains(ev.Message, "ErrImageNeverPull"):
		err = waitingErr(pod, container, image, &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull", Message: ev.Message})
	case ev.Reason == "Failed" && (strings.Contains(ev.Message, "ErrImagePull") || strings.HasPrefix(ev.Message, "Failed to pull image")):
		err = waitingErr(pod, container, image, &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: ev.Message})
	case ev.Reason == "InspectFailed" || ev.Reason == "InvalidImageName":
		err = waitingErr(pod, container, image, &corev1.ContainerStateWaiting{Reason: "InvalidImageName", Message: ev.Message})
	case ev.Reason == "Failed" && strings.HasPrefix(ev.Message, "Error: "):
		err = waitingErr(pod, container, image, &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: strings.TrimPrefix(ev.Message, "Error: ")})
	}
	if err != nil && container == installName {
		return fmt.Errorf("%w (the agent image: build and load it with scripts/k8s/agent-image.sh, docs/kubernetes.md)", err)
	}
	return err
}

// ownSecretMissing reports whether msg says that pod's own Secret is not
// found.
func ownSecretMissing(pod *corev1.Pod, msg string) bool {
	return strings.Contains(msg, `secret "`+secretName(pod.Name)+`" not found`)
}

// waitingErr maps the reason a container waits to an error, nil for a
// reason that passes (ContainerCreating, PodInitializing).
func waitingErr(pod *corev1.Pod, container, image string, w *corev1.ContainerStateWaiting) error {
	if ownSecretMissing(pod, w.Message) {
		// Create makes the Secret right after the Pod: the kubelet, had
		// it been that fast, retries.
		return nil
	}
	switch w.Reason {
	case "ErrImageNeverPull":
		return errdefs.NotFound("kubernetes: image %s is not present on the node of pod %s (build it with make images and load it into the node, docs/kubernetes.md): %s",
			image, pod.Name, w.Message)
	case "ErrImagePull", "ImagePullBackOff":
		return errdefs.NotFound("kubernetes: image %s cannot be pulled for pod %s (build it with make images and push or load it, docs/kubernetes.md): %s",
			image, pod.Name, w.Message)
	case "InvalidImageName":
		return errdefs.InvalidArgument("image", "%s: %s", image, w.Message)
	case "CreateContainerError", "RunContainerError", "CrashLoopBackOff", "CreateContainerConfigError":
		return errdefs.FailedPrecondition("kubernetes: pod %s: container %s cannot start: %s: %s", pod.Name, container, w.Reason, w.Message)
	}
	return nil
}
