package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// TestKubernetesSandboxNoServiceAccount: a tenant's code in a sandbox Pod
// finds no ServiceAccount token to talk to the API server with (none
// mounted, none in its environment), and the Pod runs as the sandboxes'
// own ServiceAccount (deploy/kubernetes: no RoleBinding, no automounted
// token), not the namespace's default one, read back as the admin.
func TestKubernetesSandboxNoServiceAccount(t *testing.T) {
	a, _, _ := startK8sOrch(t)
	r := a.mustAcquire(t, "k8s-sa-"+randHex(4), minimalImage, "300s")
	id, pod := r.GetLease().GetId(), r.GetLease().GetContainerId()

	// As the tenant: look for the token where client libraries look.
	out := a.mustProxyExec(t, id, r.GetToken(), "sh", "-c", `
for d in /var/run/secrets/kubernetes.io/serviceaccount /run/secrets/kubernetes.io/serviceaccount /var/run/secrets/tokens; do
	[ -e "$d" ] && { echo "PRESENT $d"; ls -la "$d"; }
done
cat /var/run/secrets/kubernetes.io/serviceaccount/token 2>/dev/null && echo TOKEN-READ
env | grep -i -E 'token|serviceaccount' | grep -v BERTH_ || true
echo done`)
	if !strings.HasSuffix(out.Stdout, "done\n") || strings.Contains(out.Stdout, "PRESENT") || strings.Contains(out.Stdout, "TOKEN-READ") ||
		strings.TrimSuffix(out.Stdout, "done\n") != "" {
		t.Errorf("the sandbox holds ServiceAccount credentials:\n%s", out.Stdout)
	}

	dir := k8sDir(t)
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := k8sclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := admin.CoreV1().Pods(kubernetes.DefaultNamespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.ServiceAccountName != kubernetes.DefaultSandboxServiceAccount {
		t.Errorf("pod %s runs as ServiceAccount %q, want %q", pod, p.Spec.ServiceAccountName, kubernetes.DefaultSandboxServiceAccount)
	}
	if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
		t.Errorf("pod %s: automountServiceAccountToken %v, want false", pod, p.Spec.AutomountServiceAccountToken)
	}
	for _, v := range p.Spec.Volumes {
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ServiceAccountToken != nil {
					t.Errorf("pod %s projects a ServiceAccount token (volume %s)", pod, v.Name)
				}
			}
		}
	}
	a.mustRelease(t, id)
}
