package kubernetes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/berth-dev/berth/pkg/runtime"
	k8s "github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// spareFleet is a runtime keeping spare claims for a fleet of its own.
type spareFleet struct {
	rt       *k8s.Runtime
	admin    kubernetes.Interface
	lease    string // the fleet's leader Lease name: LabelSpareClaim's value
	instance string
}

// newSpareFleet returns a runtime keeping n spare claims (of class, ""
// for the default) for a fleet of its own, with the orchestrator's token.
// When t ends the runtime closes, which must leave no spare of the fleet
// (a leftover is reported, then removed), and the refill's Lease goes.
// log, when not nil, receives the runtime's logs.
func newSpareFleet(t *testing.T, admin kubernetes.Interface, dir string, n int, class string, log *slog.Logger) *spareFleet {
	t.Helper()
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	f := &spareFleet{admin: admin, lease: "berth-leader-spare-" + suffix, instance: "spare-test-" + suffix}
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	rt, err := k8s.New(context.Background(), k8s.Config{
		Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), NodeName: nodeName,
		AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever,
		SpareClaims: n, StorageClass: class, InstanceID: f.instance, LeaderLease: f.lease, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
	ns := rt.Namespace()
	t.Cleanup(func() { // after Close (cleanups run last first)
		ctx := context.Background()
		list, err := admin.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{LabelSelector: f.selector()})
		if err != nil {
			t.Errorf("cleanup: list spares: %v", err)
		}
		for _, c := range list.Items {
			if c.DeletionTimestamp == nil {
				t.Errorf("leak: Close left spare claim %s", c.Name)
			}
			_ = admin.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, c.Name, metav1.DeleteOptions{})
		}
		if err := admin.CoordinationV1().Leases(ns).Delete(ctx, k8s.SpareLeaseOf(f.lease), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup: refill lease: %v", err)
		}
	})
	t.Cleanup(func() { rt.Close() })
	return f
}

// selector selects the fleet's spares.
func (f *spareFleet) selector() string {
	return k8s.SpareSelector(f.lease)
}

// waitSpares waits (on a watch) until the fleet has exactly n spares, all
// bound, and returns their names.
func (f *spareFleet) waitSpares(t *testing.T, n int) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := f.rt.Namespace()
	lw := cache.NewFilteredListWatchFromClient(f.admin.CoreV1().RESTClient(), "persistentvolumeclaims", ns,
		func(o *metav1.ListOptions) { o.LabelSelector = f.selector() })
	var store cache.Store
	bound := func() map[string]bool {
		names := map[string]bool{}
		for _, o := range store.List() {
			c := o.(*corev1.PersistentVolumeClaim)
			if c.DeletionTimestamp == nil {
				names[c.Name] = c.Status.Phase == corev1.ClaimBound
			}
		}
		return names
	}
	done := func() bool {
		names := bound()
		for _, b := range names {
			if !b {
				return false
			}
		}
		return len(names) == n
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.PersistentVolumeClaim{},
		func(s cache.Store) (bool, error) { store = s; return done(), nil },
		func(watch.Event) (bool, error) { return done(), nil })
	if err != nil {
		t.Fatalf("waiting for %d bound spares of %s: %v (have %v)", n, f.lease, err, bound())
	}
	// The runtime's informer delivers the same events a moment later.
	for f.rt.SparesBound() != n {
		if ctx.Err() != nil {
			t.Fatalf("the runtime's informer shows %d bound spares, the API server %d", f.rt.SparesBound(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return bound()
}

// workspaceClaim returns the claim Pod id mounts at /workspace.
func workspaceClaim(t *testing.T, admin kubernetes.Interface, ns, id string) string {
	t.Helper()
	pod, err := admin.CoreV1().Pods(ns).Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == "workspace" && v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	t.Fatalf("pod %s mounts no workspace claim", id)
	return ""
}

// claimGone reports whether claim name is deleted or being deleted.
func claimGone(t *testing.T, admin kubernetes.Interface, ns, name string) bool {
	t.Helper()
	c, err := admin.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	return c.DeletionTimestamp != nil
}

// agentSh runs a shell line in sb through its agent and returns its
// stdout; it fails t unless the line exits 0.
func agentSh(t *testing.T, sb runtime.Sandbox, token, line string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": line, "timeout": "30s"})
	req, err := http.NewRequest(http.MethodPost, "http://"+sb.Endpoint+"/v1/exec", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: time.Minute, Transport: &http.Transport{Proxy: nil}}).Do(req)
	if err != nil {
		t.Fatalf("exec %q: %v", line, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var res struct {
		ExitCode int    `json:"exitCode"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &res) != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: HTTP %d: %s", line, resp.StatusCode, b)
	}
	return res.Stdout
}

// TestSpareClaims: with spare claims, Create takes a bound spare (no claim
// of its own is made), the Pod mounts it and /workspace is writable; the
// refill brings the spares back; a Restart after a kill keeps the file on
// the taken spare; Remove deletes it; a Create of another size takes
// none; and Close deletes the spares (newSpareFleet's cleanup).
func TestSpareClaims(t *testing.T) {
	admin, dir := needCluster(t)
	loadImage(t, "berth/minimal:latest")
	f := newSpareFleet(t, admin, dir, 2, "", nil)
	rt, ns := f.rt, f.rt.Namespace()
	ctx := context.Background()
	spares := f.waitSpares(t, 2)

	const token = "tok-spare"
	spec := runtime.Spec{Image: "berth/minimal:latest", AgentToken: token, ReadyTimeout: time.Minute,
		LeaseID: fmt.Sprintf("spare-a-%d", time.Now().UnixNano()%1e6)}
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			_ = rt.Remove(context.Background(), sb.ID)
		}
	})
	claim := workspaceClaim(t, admin, ns, sb.ID)
	if !spares[claim] {
		t.Fatalf("pod %s mounts %s, want one of the spares %v", sb.ID, claim, spares)
	}
	if _, err := admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx, sb.ID+"-workspace", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Create made a claim of its own besides taking %s: %v", claim, err)
	}
	c, err := admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Labels[k8s.LabelSandbox] != sb.ID || c.Labels[k8s.LabelSpareClaim] != "" || c.Labels[runtime.LabelManaged] != "true" {
		t.Errorf("taken spare's labels: %v, want the sandbox's and no %s", c.Labels, k8s.LabelSpareClaim)
	}
	agentSh(t, sb, token, "echo kept > /workspace/spare.txt")

	// The refill makes another spare.
	refilled := f.waitSpares(t, 2)
	if refilled[claim] {
		t.Errorf("the taken claim %s still counts as a spare", claim)
	}

	// Restart after a kill: a new Pod on the same claim, the file kept.
	if err := killSandbox(ctx, admin, ns, sb.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := rt.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == runtime.StateExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s 30s after the kill", got.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sb, err = rt.Restart(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := workspaceClaim(t, admin, ns, sb.ID); got != claim {
		t.Errorf("restarted pod mounts %s, want %s", got, claim)
	}
	if out := agentSh(t, sb, token, "cat /workspace/spare.txt"); out != "kept\n" {
		t.Errorf("after Restart: /workspace/spare.txt = %q, want \"kept\\n\"", out)
	}

	// Remove deletes the taken claim.
	if err := rt.Remove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	removed = true
	if !claimGone(t, admin, ns, claim) {
		t.Errorf("Remove left the taken claim %s", claim)
	}

	// Another size: no spare fits, Create makes its own claim.
	spares = f.waitSpares(t, 2)
	spec.LeaseID += "-big"
	spec.Resources.DiskBytes = 2 << 30
	big, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Remove(context.Background(), big.ID) })
	if got := workspaceClaim(t, admin, ns, big.ID); got != big.ID+"-workspace" {
		t.Errorf("a 2 GiB sandbox mounts %s, want its own %s-workspace (the spares are 1 GiB)", got, big.ID)
	}
	if now := f.waitSpares(t, 2); fmt.Sprint(now) != fmt.Sprint(spares) {
		t.Errorf("spares changed by a Create of another size: %v, then %v", spares, now)
	}
	if err := rt.Remove(ctx, big.ID); err != nil {
		t.Fatal(err)
	}
	if !claimGone(t, admin, ns, big.ID+"-workspace") {
		t.Errorf("Remove left %s-workspace", big.ID)
	}
}

// TestSpareClaimsConcurrent: 6 concurrent Creates with 2 spares: every
// Create succeeds, no claim is mounted by two Pods, at least one spare is
// taken, and Remove deletes every claim.
func TestSpareClaimsConcurrent(t *testing.T) {
	admin, dir := needCluster(t)
	loadImage(t, "berth/minimal:latest")
	f := newSpareFleet(t, admin, dir, 2, "", nil)
	rt, ns := f.rt, f.rt.Namespace()
	spares := f.waitSpares(t, 2)

	const n = 6
	base := fmt.Sprintf("spare-c-%d", time.Now().UnixNano()%1e6)
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := rt.Create(context.Background(), runtime.Spec{Image: "berth/minimal:latest", AgentToken: "tok",
				ReadyTimeout: 2 * time.Minute, LeaseID: fmt.Sprintf("%s-%d", base, i)})
			ids[i], errs[i] = sb.ID, err
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, id := range ids {
			if id != "" {
				_ = rt.Remove(context.Background(), id)
			}
		}
	})
	mounted := map[string]string{} // claim: pod
	taken := 0
	for i, id := range ids {
		if errs[i] != nil {
			t.Errorf("Create %d: %v", i, errs[i])
			continue
		}
		claim := workspaceClaim(t, admin, ns, id)
		if other, ok := mounted[claim]; ok {
			t.Errorf("claim %s mounted by pods %s and %s", claim, other, id)
		}
		mounted[claim] = id
		if claim != id+"-workspace" {
			taken++
			if !spares[claim] {
				t.Logf("pod %s took %s, a spare made during the test", id, claim)
			}
		}
	}
	t.Logf("%d of %d concurrent Creates took a spare (%d spares at the start)", taken, n, len(spares))
	if taken == 0 {
		t.Errorf("no Create took one of the spares %v", spares)
	}
	for claim, id := range mounted {
		if err := rt.Remove(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if !claimGone(t, admin, ns, claim) {
			t.Errorf("Remove of %s left its claim %s", id, claim)
		}
	}
	f.waitSpares(t, 2)
}
