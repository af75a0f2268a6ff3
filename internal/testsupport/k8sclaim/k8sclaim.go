// Package k8sclaim makes, for the tests of the Kubernetes backend, the
// claims an operator provides: the agent's (kubernetes.Config.AgentClaim).
package k8sclaim

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/berth-dev/berth/pkg/runtime"
)

// Agent makes a claim in namespace ns holding a freshly built static
// agent at its root, as an operator would for Config.AgentClaim: a
// directory on the (single) node, a PersistentVolume of it (ReadOnlyMany,
// no StorageClass) bound to the claim. Both go when t ends.
func Agent(t *testing.T, cs kubernetes.Interface, ns string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, runtime.AgentFile), "github.com/berth-dev/berth/cmd/sandbox-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	name := fmt.Sprintf("berth-agent-test-%d", time.Now().UnixNano()%1e6)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	size := resource.MustParse("64Mi")
	empty := ""
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: name},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany},
			StorageClassName: &empty,
			VolumeName:       name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Registered after the volume's: runs first.
	t.Cleanup(func() {
		_ = cs.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	// Bound before any Pod mounts it: a Pod created earlier waits for the
	// binder's next pass (up to its 15 s resync).
	w, err := cs.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if c, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && c.Status.Phase == corev1.ClaimBound {
			return name
		}
	}
	t.Fatalf("agent claim %s/%s not bound: %v", ns, name, ctx.Err())
	return ""
}
