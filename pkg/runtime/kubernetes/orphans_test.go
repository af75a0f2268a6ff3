package kubernetes_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/pkg/runtime"
	k8s "github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// TestReconcileOrphans: a sandbox Secret whose Pod is gone (a Create or
// Remove cut short) is removed once old enough; a live sandbox's is kept;
// what berth did not create is never touched.
func TestReconcileOrphans(t *testing.T) {
	admin, dir := needCluster(t)
	ctx := context.Background()
	// 2 s, not less: this runtime's reconciler also runs in the background
	// while other tests may be between a Create's Secret and its Pod.
	const age = 2 * time.Second
	rt, err := k8s.New(ctx, k8s.Config{Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), OrphanAge: age})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ns := rt.Namespace()
	secret := func(name string, labels map[string]string) {
		t.Helper()
		_, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	suffix := time.Now().Format("150405")
	orphan, foreign := "berth-orphan-"+suffix+"-agent", "not-berth-"+suffix
	secret(orphan, map[string]string{runtime.LabelManaged: "true", k8s.LabelSandbox: "berth-orphan-" + suffix})
	secret(foreign, map[string]string{k8s.LabelSandbox: "berth-orphan-" + suffix})
	time.Sleep(age + 100*time.Millisecond)
	n, err := rt.ReconcileOrphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Get(ctx, orphan, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("orphaned secret still there (removed %d): %v", n, err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Get(ctx, foreign, metav1.GetOptions{}); err != nil {
		t.Errorf("a secret berth did not create was touched: %v", err)
	}
}
