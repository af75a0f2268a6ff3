package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime/kubernetes"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// The Kubernetes e2e tests run only with BERTH_K8S=1 against the cluster
// of `make k8s-up` (docs/kubernetes.md): the orchestrator runs in process
// as the ServiceAccount of deploy/kubernetes (.berth/k8s/berth.kubeconfig).
// They are not part of `make test` yet: without BERTH_K8S=1 they skip, also
// under BERTH_REQUIRE_DOCKER=1.
const k8sNodeSock = "/run/berth-k8s/containerd.sock"

// k8sDir returns the directory of make k8s-up's kubeconfigs, or skips.
func k8sDir(t *testing.T) string {
	t.Helper()
	if os.Getenv("BERTH_K8S") != "1" {
		t.Skip("set BERTH_K8S=1 (after make k8s-up) to run the Kubernetes e2e tests")
	}
	requireDocker(t)
	if d := os.Getenv("BERTH_K8S_DIR"); d != "" {
		return d
	}
	return filepath.Join("..", ".berth", "k8s")
}

// k8sLoad copies a Docker image into the test cluster's node.
func k8sLoad(t *testing.T, ref string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `docker save "$1" | ctr --address "$2" --namespace k8s.io images import -`, "sh", ref, k8sNodeSock)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("load %s into the node: %v\n%s", ref, err, out)
	}
}

// startK8sOrch starts an in-process orchestrator on the Kubernetes backend
// and returns its API and the runtime. Its leases are reaped when the test
// ends.
func startK8sOrch(t *testing.T) (*api, *kubernetes.Runtime) {
	t.Helper()
	dir := k8sDir(t)
	if out, err := exec.Command("../scripts/k8s/agent-image.sh").CombinedOutput(); err != nil {
		t.Fatalf("agent image: %v\n%s", err, out)
	}
	k8sLoad(t, minimalImage)
	cfg := orchestrator.Defaults()
	cfg.Runtime = "kubernetes"
	cfg.Kubeconfig = filepath.Join(dir, "berth.kubeconfig")
	cfg.KubernetesNode = "localhost"
	cfg.KubernetesPullPolicy = "Never"
	cfg.DataDir = t.TempDir()
	cfg.AgentBinary = agentBin
	cfg.OperatorToken = operatorToken
	cfg.DefaultImage = minimalImage
	log := testLogger(t, "inproc-k8s")
	ctx := context.Background()
	rt, err := kubernetes.New(ctx, kubernetes.Config{
		Kubeconfig: cfg.Kubeconfig, NodeName: cfg.KubernetesNode, NetworkPolicy: true,
		AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever,
		DefaultResources: cfg.DefaultResources(), Logger: log.With("component", "kubernetes"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Ping(ctx); err != nil {
		rt.Close()
		t.Fatalf("cluster unreachable (make k8s-up): %v", err)
	}
	srv, err := orchestrator.New(ctx, cfg, rt, log)
	if err != nil {
		rt.Close()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, ln) }()
	a := newAPI(ln.Addr().String())
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
		rt.Close()
	})
	t.Cleanup(func() {
		code, _, b, err := a.call(http.MethodPost, "/v1/leases:reap", `{"all":true}`)
		if err != nil || code != http.StatusOK {
			t.Errorf("cleanup: reap all: HTTP %d, %v: %s", code, err, b)
		}
	})
	return a, rt
}

// TestKubernetesLeaseLifecycle: acquire on the Kubernetes backend gives a
// READY lease whose sandbox is a Pod, a command runs in it through the
// proxy with the lease's token, and release removes the Pod.
func TestKubernetesLeaseLifecycle(t *testing.T) {
	a, rt := startK8sOrch(t)
	began := time.Now()
	r := a.mustAcquire(t, "k8s-"+randHex(4), minimalImage, "300s")
	t.Logf("acquire on kubernetes: %s (pod %s at %s)", time.Since(began).Round(time.Millisecond),
		r.GetLease().GetContainerId(), r.GetLease().GetEndpoint())
	id, pod := r.GetLease().GetId(), r.GetLease().GetContainerId()
	if !strings.HasPrefix(pod, "berth-") {
		t.Errorf("container id %q is not a berth Pod name", pod)
	}
	out := a.mustProxyExec(t, id, r.GetToken(), "sh", "-c", "echo hello from $(hostname)")
	if !strings.Contains(out.Stdout, "hello from "+pod) {
		t.Errorf("exec through the proxy: stdout %q, want the Pod's hostname %s", out.Stdout, pod)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, _, _ := a.proxyExecCode(ctx, t, id, "wrong-token")
	if code != http.StatusUnauthorized {
		t.Errorf("exec with a wrong token: HTTP %d, want 401", code)
	}
	// A cluster cannot freeze a Pod: pause in freeze mode is refused
	// with FAILED_PRECONDITION (HTTP 400) naming the reason.
	code, _, body := a.mustCall(t, http.MethodPost, "/v1/leases/"+id+":pause", map[string]any{"mode": "freeze"})
	if code != http.StatusBadRequest || !strings.Contains(string(body), `"code":9`) {
		t.Errorf("pause (freeze) on kubernetes: HTTP %d %s, want 400 FAILED_PRECONDITION", code, body)
	} else {
		t.Logf("pause (freeze) on kubernetes: %s", body)
	}
	// Hibernate maps to what a cluster can do: the Pod's processes end
	// (the Pod stays, exited), resume replaces the Pod (same name and
	// token, a new address); /workspace is the sandbox's
	// PersistentVolumeClaim, so its files are kept.
	a.mustProxyExec(t, id, r.GetToken(), "sh", "-c", "echo kept > /workspace/hibernate.txt")
	_, took := pauseCall(t, a, id, "hibernate")
	t.Logf("hibernate on kubernetes: %s", took.Round(time.Millisecond))
	if sb, err := rt.Get(ctx, pod); err != nil || sb.Endpoint != "" {
		t.Errorf("after hibernate: %+v %v, want the Pod exited", sb, err)
	}
	_, took = pauseCall(t, a, id, "")
	t.Logf("resume on kubernetes: %s", took.Round(time.Millisecond))
	if out := a.mustProxyExec(t, id, r.GetToken(), "cat", "/workspace/hibernate.txt"); out.Stdout != "kept\n" {
		t.Errorf("after hibernate and resume: /workspace/hibernate.txt = %q, want \"kept\\n\"", out.Stdout)
	}
	// The lease manager's reaper runs on the elected replica: this one,
	// named by its instance id in the coordination.k8s.io Lease.
	leader, err := rt.LeaderOf(ctx, kubernetes.DefaultLeaderLease)
	if err != nil || leader == "" {
		t.Errorf("leader of %s: %q, %v; want this orchestrator", kubernetes.DefaultLeaderLease, leader, err)
	} else {
		t.Logf("elected: %s", leader)
	}
	a.mustRelease(t, id)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := rt.Get(ctx, pod); errdefs.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still there 30 s after release", pod)
		}
	}
}

// proxyExecCode runs `true` through the proxy with token and returns the
// HTTP status.
func (a *api) proxyExecCode(ctx context.Context, t *testing.T, id, token string) (int, execResult, error) {
	t.Helper()
	return a.proxyExec(ctx, id, token, map[string]any{"argv": []string{"true"}})
}

// TestKubernetesFigures measures, on the test cluster, what `make bench`
// reports for the other backends: a cold acquire, exec of `true` through
// the proxy (p50 and p95 of 50), and 20 parallel acquires. It logs the
// figures and asserts nothing about them (run with -v).
func TestKubernetesFigures(t *testing.T) {
	a, _ := startK8sOrch(t)
	began := time.Now()
	r := a.mustAcquire(t, "k8s-fig-"+randHex(4), minimalImage, "300s")
	t.Logf("figure: cold acquire %s", time.Since(began).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var took []time.Duration
	for range 50 {
		t0 := time.Now()
		code, res, err := a.proxyExec(ctx, r.GetLease().GetId(), r.GetToken(), map[string]any{"argv": []string{"true"}})
		if err != nil || code != http.StatusOK || res.ExitCode != 0 {
			t.Fatalf("exec: HTTP %d %v %+v", code, err, res)
		}
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)
	t.Logf("figure: exec true through the proxy: p50 %s, p95 %s (50 calls)", took[len(took)/2].Round(time.Microsecond), took[len(took)*95/100].Round(time.Microsecond))
	a.mustRelease(t, r.GetLease().GetId())

	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	durs := make([]time.Duration, n)
	began = time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			if _, err := a.acquire(fmt.Sprintf("k8s-par-%s-%d", randHex(3), i), minimalImage, "300s"); err != nil {
				errs <- err
			}
			durs[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	wall := time.Since(began)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	slices.Sort(durs)
	t.Logf("figure: %d parallel acquires: wall %s, each p50 %s, max %s", n, wall.Round(time.Millisecond), durs[n/2].Round(time.Millisecond), durs[n-1].Round(time.Millisecond))
}

// TestKubernetesProxy: the proxy reaches a Pod's agent over gRPC (lease in
// the metadata) and a server inside the Pod through its preview URL (path
// form), with the lease's token only.
func TestKubernetesProxy(t *testing.T) {
	a, _ := startK8sOrch(t)
	r := a.mustAcquire(t, "k8s-proxy-"+randHex(4), minimalImage, "300s")
	id, tok := r.GetLease().GetId(), r.GetToken()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	res, err := agentv1.NewProcessServiceClient(a.grpcConn(t)).Exec(leaseCtx(ctx, id, tok), &agentv1.ExecRequest{Argv: []string{"uname", "-n"}})
	if err != nil || strings.TrimSpace(string(res.GetStdout())) != r.GetLease().GetContainerId() {
		t.Fatalf("gRPC exec through the proxy: %v %q, want the Pod's name %s", err, res.GetStdout(), r.GetLease().GetContainerId())
	}

	page := "<html>hello from a pod " + randHex(6) + "</html>\n"
	a.putFile(t, id, tok, "/workspace/www/index.html", []byte(page))
	code, _, b := a.mustCall(t, http.MethodPost, sandboxPath(id, "/v1/processes"),
		map[string]any{"argv": []string{"busybox", "httpd", "-f", "-p", "8000", "-h", "/workspace/www"}}, tok)
	if code != http.StatusOK {
		t.Fatalf("start httpd: HTTP %d: %s", code, b)
	}
	url := "/v1/sandboxes/" + id + "/ports/8000/index.html"
	var lastCode int
	var lastBody string
	if !eventually(20*time.Second, 100*time.Millisecond, func() bool {
		c, _, body, err := a.httpGet("", url, bearerHeader(tok))
		lastCode, lastBody = c, body
		return err == nil && c == http.StatusOK
	}) {
		t.Fatalf("preview never answered 200: last HTTP %d: %s", lastCode, lastBody)
	}
	if lastBody != page {
		t.Errorf("preview body %q, want %q", lastBody, page)
	}
	if c, _, _, err := a.httpGet("", url, nil); err != nil || c != http.StatusUnauthorized {
		t.Errorf("preview without a token: HTTP %d %v, want 401", c, err)
	}
	a.mustRelease(t, id)
}
