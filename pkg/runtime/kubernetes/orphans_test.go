package kubernetes_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/berth-dev/berth/pkg/runtime"
	k8s "github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// orphanAge is the OrphanAge of the orphan tests' runtimes: 2 s, not less,
// as this runtime's reconciler also runs in the background while other
// tests may be between a Create's claim and its Pod.
const orphanAge = 2 * time.Second

// newOrphanRuntime returns a runtime on the test cluster with OrphanAge
// orphanAge, closed when the test ends.
func newOrphanRuntime(t *testing.T, dir string) *k8s.Runtime {
	t.Helper()
	rt, err := k8s.New(context.Background(), k8s.Config{Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), OrphanAge: orphanAge})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	return rt
}

// TestReconcileOrphans: a sandbox's Secret and workspace claim whose Pod
// is gone (a Create or Remove cut short) are removed once old enough; a
// live sandbox's are kept; what berth did not create is never touched.
// The orchestrator may not list Secrets: it finds the orphaned ones from
// the claims (Create makes the claim first).
func TestReconcileOrphans(t *testing.T) {
	admin, dir := needCluster(t)
	ctx := context.Background()
	rt := newOrphanRuntime(t, dir)
	ns := rt.Namespace()
	suffix := time.Now().Format("150405")
	pod := "berth-orphan-" + suffix
	managed := map[string]string{runtime.LabelManaged: "true", k8s.LabelSandbox: pod}
	secret := func(name string, labels map[string]string) {
		t.Helper()
		_, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	orphan, foreign, claim := pod+"-agent", "not-berth-"+suffix, pod+"-workspace"
	// A class no provisioner serves: the claim stays Pending, no volume.
	class := "berth-test-none"
	_, err := admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Labels: managed},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim, metav1.DeleteOptions{}) })
	secret(orphan, managed)
	secret(foreign, map[string]string{k8s.LabelSandbox: pod})
	time.Sleep(orphanAge + 100*time.Millisecond)
	n, err := rt.ReconcileOrphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Get(ctx, orphan, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("orphaned secret still there (removed %d): %v", n, err)
	}
	if c, err := admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{}); err == nil && c.DeletionTimestamp == nil {
		t.Errorf("orphaned claim not deleted (removed %d)", n)
	} else if err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Get(ctx, foreign, metav1.GetOptions{}); err != nil {
		t.Errorf("a secret berth did not create was touched: %v", err)
	}
}

// TestReconcileSpareClaims: a spare claim not taken is never an orphan,
// however old; a taken one whose Pod is gone is, once OrphanAge has passed
// since its take (not its creation: a Create between its take and its Pod
// keeps it); Remove of a sandbox whose Pod is gone deletes the spare it
// took.
func TestReconcileSpareClaims(t *testing.T) {
	admin, dir := needCluster(t)
	ctx := context.Background()
	rt := newOrphanRuntime(t, dir)
	ns := rt.Namespace()
	suffix := time.Now().Format("150405")
	claims := admin.CoreV1().PersistentVolumeClaims(ns)
	class := "berth-test-none" // no provisioner: Pending, no volume
	spare := func(name string) {
		t.Helper()
		_, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{runtime.LabelManaged: "true", k8s.LabelSpareClaim: "orphan-test-" + suffix}},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &class,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = claims.Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	// take does what Create's take does to a spare, for a Pod that
	// never came.
	take := func(name, pod string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null,%q:%q},"annotations":{"dev.berth/spare-taken":%q}}}`,
			k8s.LabelSpareClaim, k8s.LabelSandbox, pod, time.Now().UTC().Format(time.RFC3339))
		if _, err := claims.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(name string) bool {
		c, err := claims.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && c.DeletionTimestamp != nil)
	}
	a, b := "berth-spare-orphan-a-"+suffix, "berth-spare-orphan-b-"+suffix
	spare(a)
	spare(b)
	time.Sleep(orphanAge + 100*time.Millisecond) // both older than OrphanAge
	if _, err := rt.ReconcileOrphans(ctx); err != nil {
		t.Fatal(err)
	}
	if gone(a) || gone(b) {
		t.Fatalf("the sweep deleted a spare not taken (a gone %v, b gone %v)", gone(a), gone(b))
	}
	podA, podB := "berth-gone-a-"+suffix, "berth-gone-b-"+suffix
	take(a, podA)
	take(b, podB)
	if _, err := rt.ReconcileOrphans(ctx); err != nil {
		t.Fatal(err)
	}
	if gone(a) {
		t.Fatal("the sweep deleted a spare taken a moment ago (its Create may be about to make the Pod)")
	}
	if err := rt.Remove(ctx, podB); err != nil {
		t.Fatal(err)
	}
	if !gone(b) {
		t.Error("Remove of a sandbox whose Pod is gone left the spare it took")
	}
	// The take's time has a resolution of a second.
	time.Sleep(orphanAge + 1100*time.Millisecond)
	if _, err := rt.ReconcileOrphans(ctx); err != nil {
		t.Fatal(err)
	}
	if !gone(a) {
		t.Error("the sweep left a taken spare whose Pod never came")
	}
}
