package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// K8sEnv is the variable that turns the Kubernetes cluster tests on:
// "1" runs them (make test sets it and brings the test cluster up,
// scripts/k8s/test.sh), "0" leaves them out (a plain skip), unset skips
// them, or fails them under BERTH_REQUIRE_DOCKER=1 (CI).
const K8sEnv = "BERTH_K8S"

// K8sDir skips tb unless the Kubernetes cluster tests are on (K8sEnv; also
// a plain skip with -short) and returns the directory of the test
// cluster's kubeconfigs (admin.kubeconfig, berth.kubeconfig):
// $BERTH_K8S_DIR, else the module's .berth/k8s (make k8s-up).
func K8sDir(tb testing.TB) string {
	tb.Helper()
	if testing.Short() {
		tb.Skip("the Kubernetes cluster tests need the test cluster: skipped with -short")
	}
	switch os.Getenv(K8sEnv) {
	case "1":
	case "0":
		tb.Skip(K8sEnv + "=0: the Kubernetes cluster tests are left out of this run")
	default:
		SkipOrFailf(tb, "the Kubernetes cluster tests need %s=1 and the test cluster (make test sets both up; or make k8s-up)", K8sEnv)
	}
	if d := os.Getenv("BERTH_K8S_DIR"); d != "" {
		return d
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		tb.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), ".berth", "k8s")
}
