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
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/testsupport/k8sclaim"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease/kubestore"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime/kubernetes"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// The Kubernetes e2e tests run with BERTH_K8S=1 against the test cluster
// (docs/kubernetes.md): the orchestrator runs in process as the
// ServiceAccount of deploy/kubernetes (.berth/k8s/berth.kubeconfig).
// `make test` sets BERTH_K8S=1 and brings the cluster up when it is not
// running (scripts/k8s/test.sh). Without BERTH_K8S they skip, or fail under
// BERTH_REQUIRE_DOCKER=1 (CI); BERTH_K8S=0 is a run's own choice to leave
// them out: a plain skip.
const k8sNodeSock = "/run/berth-k8s/containerd.sock"

// k8sDir returns the directory of make k8s-up's kubeconfigs, or skips (see
// above).
func k8sDir(t *testing.T) string {
	t.Helper()
	dir := testenv.K8sDir(t)
	requireDocker(t)
	return dir
}

// k8sLoad copies a Docker image into the test cluster's node. Like
// scripts/k8s/lib.sh's node_import it tries three times: the node's
// containerd (1.6) fails an import now and then with "content digest ...:
// not found" while it unpacks.
func k8sLoad(t *testing.T, ref string) {
	t.Helper()
	var failures []string
	for attempt := 1; attempt <= 3; attempt++ {
		cmd := exec.Command("sh", "-c", `docker save "$1" | ctr --address "$2" --namespace k8s.io images import -`, "sh", ref, k8sNodeSock)
		out, err := cmd.CombinedOutput()
		if err == nil {
			if len(failures) > 0 {
				t.Logf("load %s into the node: failed before it worked: %s", ref, strings.Join(failures, "; "))
			}
			return
		}
		failures = append(failures, fmt.Sprintf("attempt %d: %v: %s", attempt, err, strings.TrimSpace(string(out))))
	}
	t.Fatalf("load %s into the node: %s", ref, strings.Join(failures, "; "))
}

// startK8sOrch starts an in-process orchestrator on the Kubernetes backend
// and returns its API, the runtime and its fleet. The fleet is the test's
// own (e2e-RANDOM): the lease records in the cluster (kubestore), the
// leader Lease and the "reap all" of the cleanup are the fleet's, so that
// other orchestrators on the cluster (a developer's, another test run's)
// see nothing of this one. Its leases are reaped when the test ends.
// mutate, when given, change the orchestrator's configuration.
func startK8sOrch(t *testing.T, mutate ...func(*orchestrator.Config)) (*api, *kubernetes.Runtime, string) {
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
	cfg.Fleet = "e2e-" + randHex(4)
	// The instance id names the egress rules the orchestrator installs on
	// the node for its Pods: removed when the test ends, as newDataDir does
	// on Docker (registered first, so it runs after the server stops).
	cfg.InstanceID = "e2e-" + runID + "-" + randHex(4)
	for _, m := range mutate {
		m(&cfg)
	}
	t.Cleanup(func() {
		if err := egress.RemoveInstance(context.Background(), cfg.InstanceID); err != nil {
			t.Errorf("cleanup: egress rules of instance %s: %v", cfg.InstanceID, err)
		}
		k8sForgetFleet(t, dir, cfg.Fleet)
	})
	log := testLogger(t, "inproc-k8s")
	ctx := context.Background()
	rt, err := kubernetes.New(ctx, kubernetes.Config{
		Kubeconfig: cfg.Kubeconfig, NodeName: cfg.KubernetesNode, NetworkPolicy: true, AgentClaim: cfg.KubernetesAgentClaim,
		AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever,
		LeaderLease:      kubernetes.LeaderLeaseOf(cfg.Fleet),
		DefaultResources: cfg.DefaultResources(), Logger: log.With("component", "kubernetes"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Ping(ctx); err != nil {
		rt.Close()
		t.Fatalf("cluster unreachable (make k8s-up): %v", err)
	}
	srv, err := orchestrator.New(ctx, cfg, orchestrator.Platform{Runtime: rt, Cluster: rt}, log)
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
		// Its warm pools' members (a pool in mutate) outlive it by design.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		removePoolMembers(ctx, t, rt, cfg.InstanceID)
		rt.Close()
	})
	t.Cleanup(func() {
		code, _, b, err := a.call(http.MethodPost, "/v1/leases:reap", `{"all":true}`)
		if err != nil || code != http.StatusOK {
			t.Errorf("cleanup: reap all: HTTP %d, %v: %s", code, err, b)
		}
	})
	return a, rt, cfg.Fleet
}

// k8sForgetFleet deletes fleet's lease records (BerthLeases), leader
// Lease, spare claims and their refill's Lease from the cluster, once its
// orchestrators are gone: ended records would otherwise wait for a leader
// of the fleet to purge them, and a replica killed by a test leaves the
// spares it refilled (one stopped deletes them).
func k8sForgetFleet(t *testing.T, dir, fleet string) {
	t.Helper()
	kubectl := filepath.Join(dir, "bin", "kubectl")
	for _, args := range [][]string{
		{"delete", "berthleases", "-l", kubestore.LabelFleet + "=" + fleet, "--ignore-not-found"},
		{"delete", "leases.coordination.k8s.io", kubernetes.LeaderLeaseOf(fleet), "--ignore-not-found"},
		{"delete", "persistentvolumeclaims", "-l", kubernetes.SpareSelector(kubernetes.LeaderLeaseOf(fleet)), "--ignore-not-found"},
		{"delete", "leases.coordination.k8s.io", kubernetes.SpareLeaseOf(kubernetes.LeaderLeaseOf(fleet)), "--ignore-not-found"},
	} {
		args = append([]string{"--kubeconfig", filepath.Join(dir, "berth.kubeconfig"), "--request-timeout", "30s"}, args...)
		if out, err := exec.Command(kubectl, args...).CombinedOutput(); err != nil {
			t.Errorf("cleanup: kubectl %v: %v\n%s", args, err, out)
		}
	}
}

// TestKubernetesLeaseLifecycle: acquire on the Kubernetes backend gives a
// READY lease whose sandbox is a Pod, a command runs in it through the
// proxy with the lease's token, and release removes the Pod.
func TestKubernetesLeaseLifecycle(t *testing.T) {
	a, rt, fleet := startK8sOrch(t)
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
	leader, err := rt.LeaderOf(ctx, kubernetes.LeaderLeaseOf(fleet))
	if err != nil || leader == "" {
		t.Errorf("leader of %s: %q, %v; want this orchestrator", kubernetes.LeaderLeaseOf(fleet), leader, err)
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

// TestKubernetesBench (BERTH_BENCH=1, make bench) measures on the test
// cluster what make bench reports for the other backends, beside the same
// operations on Docker in the same run (in-process orchestrators, REST,
// berth/minimal on both):
//
//   - cold acquire (request to READY) and release, interleaved, 5 each;
//   - re-acquire of a persisted conversation (its volume exists, the
//     sandbox is new; workspace.persist), 3 conversations;
//   - exec of `true` through the proxy (REST, one keep-alive client), 50
//     calls after 5 warm-ups: p50 and p95;
//   - 20 parallel acquires: the wall time until all are READY, and each
//     one's p50 and max.
//
// It prints K8S-BENCH lines (make bench greps them) and asserts nothing
// about the figures.
func TestKubernetesBench(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("a figure for make bench (BERTH_BENCH=1)")
	}
	k, krt, _ := startK8sOrch(t)
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	d := startOrch(t, dir).api
	type backend struct {
		name string
		a    *api
	}
	backends := []backend{{"kubernetes", k}, {"docker", d}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// Cold acquire and release, interleaved (the order alternates).
	const rounds = 5
	acq, rel := map[string][]time.Duration{}, map[string][]time.Duration{}
	for i := range rounds {
		for j := range backends {
			b := backends[(i+j)%len(backends)]
			t0 := time.Now()
			r := b.a.mustAcquire(t, fmt.Sprintf("bench-cold-%s-%d", randHex(3), i), minimalImage, "600s")
			acq[b.name] = append(acq[b.name], time.Since(t0))
			t0 = time.Now()
			b.a.mustRelease(t, r.GetLease().GetId())
			rel[b.name] = append(rel[b.name], time.Since(t0))
		}
	}
	// The same cold acquires with the agent mounted from a claim
	// (--k8s-agent-claim: no init container), interleaved with Docker's.
	claimed := map[string][]time.Duration{}
	{
		rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(k8sDir(t), "admin.kubeconfig"))
		if err != nil {
			t.Fatal(err)
		}
		admin, err := k8sclient.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		claim := k8sclaim.Agent(t, admin, krt.Namespace())
		kc, _, _ := startK8sOrch(t, func(c *orchestrator.Config) { c.KubernetesAgentClaim = claim })
		for i := range rounds {
			order := []backend{{"kubernetes", kc}, {"docker", d}}
			if i%2 == 1 {
				slices.Reverse(order)
			}
			for _, b := range order {
				t0 := time.Now()
				r := b.a.mustAcquire(t, fmt.Sprintf("bench-claim-%s-%d", randHex(3), i), minimalImage, "600s")
				claimed[b.name] = append(claimed[b.name], time.Since(t0))
				b.a.mustRelease(t, r.GetLease().GetId())
			}
		}
	}
	p := func(ds []time.Duration, q float64) time.Duration { return percentile(ds, q).Round(time.Millisecond) }
	fmt.Printf("K8S-BENCH %-48s kubernetes p50 %8s max %8s | docker p50 %8s max %8s | kubernetes/docker p50 %5.2fx (target: kubernetes p50 <= 2s)\n",
		fmt.Sprintf("cold acquire, agent from a claim (n=%d):", len(claimed["kubernetes"])), p(claimed["kubernetes"], 50), p(claimed["kubernetes"], 100),
		p(claimed["docker"], 50), p(claimed["docker"], 100), ms(percentile(claimed["kubernetes"], 50))/ms(percentile(claimed["docker"], 50)))
	fmt.Printf("K8S-BENCH %-48s kubernetes p50 %8s max %8s | docker p50 %8s max %8s | kubernetes/docker p50 %5.2fx\n",
		fmt.Sprintf("cold acquire (REST, to READY; n=%d):", rounds), p(acq["kubernetes"], 50), p(acq["kubernetes"], 100), p(acq["docker"], 50), p(acq["docker"], 100),
		ms(percentile(acq["kubernetes"], 50))/ms(percentile(acq["docker"], 50)))
	fmt.Printf("K8S-BENCH %-48s kubernetes p50 %8s max %8s | docker p50 %8s max %8s | kubernetes/docker p50 %5.2fx\n",
		fmt.Sprintf("release (to RELEASED; n=%d):", rounds), p(rel["kubernetes"], 50), p(rel["kubernetes"], 100), p(rel["docker"], 50), p(rel["docker"], 100),
		ms(percentile(rel["kubernetes"], 50))/ms(percentile(rel["docker"], 50)))

	// Re-acquire of a persisted conversation: its volume exists (Docker's
	// named volume, the cluster's claim, bound), the sandbox is new.
	const reRounds = 3
	reacq := map[string][]time.Duration{}
	for _, b := range backends {
		for i := range reRounds {
			conv := fmt.Sprintf("bench-persist-%s-%d", randHex(3), i)
			body := map[string]any{"conversationId": conv, "ttl": "600s", "workspace": map[string]any{"persist": true}}
			var vol string
			for j := range 2 {
				t0 := time.Now()
				code, _, raw := b.a.mustCall(t, http.MethodPost, "/v1/leases", body)
				took := time.Since(t0)
				var r orchv1.AcquireResponse
				if code != http.StatusOK || decode(raw, &r) != nil {
					t.Fatalf("%s: acquire %s with workspace.persist: HTTP %d: %s", b.name, conv, code, raw)
				}
				if j == 1 {
					reacq[b.name] = append(reacq[b.name], took)
				}
				vol = r.GetLease().GetWorkspace().GetVolume()
				b.a.mustRelease(t, r.GetLease().GetId())
				waitUnused(t, b.a, vol)
			}
			if code, _, raw := b.a.mustCall(t, http.MethodDelete, "/v1/volumes/"+vol, nil); code != http.StatusOK {
				t.Errorf("%s: remove volume %s: HTTP %d: %s", b.name, vol, code, raw)
			}
		}
	}
	fmt.Printf("K8S-BENCH %-48s kubernetes p50 %8s max %8s | docker p50 %8s max %8s | kubernetes/docker p50 %5.2fx\n",
		fmt.Sprintf("re-acquire a persisted conversation (n=%d):", reRounds), p(reacq["kubernetes"], 50), p(reacq["kubernetes"], 100), p(reacq["docker"], 50), p(reacq["docker"], 100),
		ms(percentile(reacq["kubernetes"], 50))/ms(percentile(reacq["docker"], 50)))

	// exec true through the proxy, 50 calls on one lease of each.
	const calls = 50
	execs := map[string][]time.Duration{}
	for _, b := range backends {
		r := b.a.mustAcquire(t, "bench-exec-"+randHex(3), minimalImage, "600s")
		c := keepAliveClient()
		url := b.a.base + sandboxPath(r.GetLease().GetId(), "/v1/exec")
		for i := range calls + 5 {
			t0 := time.Now()
			if err := restExecTrue(c, url, r.GetToken()); err != nil {
				t.Fatalf("%s: exec true through the proxy: %v", b.name, err)
			}
			if i >= 5 {
				execs[b.name] = append(execs[b.name], time.Since(t0))
			}
		}
		c.CloseIdleConnections()
		b.a.mustRelease(t, r.GetLease().GetId())
	}
	pu := func(ds []time.Duration, q float64) time.Duration {
		return percentile(ds, q).Round(10 * time.Microsecond)
	}
	fmt.Printf("K8S-BENCH %-48s kubernetes p50 %8s p95 %8s | docker p50 %8s p95 %8s | kubernetes/docker p50 %5.2fx\n",
		fmt.Sprintf("exec true through the proxy (REST; n=%d):", calls), pu(execs["kubernetes"], 50), pu(execs["kubernetes"], 95), pu(execs["docker"], 50), pu(execs["docker"], 95),
		ms(percentile(execs["kubernetes"], 50))/ms(percentile(execs["docker"], 50)))

	// 20 parallel acquires, then 20 parallel releases.
	const n = 20
	walls := map[string]time.Duration{}
	each := map[string][]time.Duration{}
	for _, b := range backends {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		ids := make([]string, n)
		durs := make([]time.Duration, n)
		began := time.Now()
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				r, err := b.a.acquire(fmt.Sprintf("bench-par-%s-%d", randHex(3), i), minimalImage, "600s")
				durs[i] = time.Since(t0)
				if err != nil {
					errs <- fmt.Errorf("%s: acquire %d: %w", b.name, i, err)
					return
				}
				ids[i] = r.GetLease().GetId()
			}()
		}
		wg.Wait()
		walls[b.name], each[b.name] = time.Since(began), durs
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		for _, id := range ids {
			if id == "" {
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); b.a.mustRelease(t, id) }()
		}
		wg.Wait()
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
	fmt.Printf("K8S-BENCH %-48s kubernetes %8s (each p50 %8s max %8s) | docker %8s (each p50 %8s max %8s) | kubernetes/docker wall %5.2fx\n",
		fmt.Sprintf("%d parallel acquires (wall to all READY):", n), walls["kubernetes"].Round(time.Millisecond), p(each["kubernetes"], 50), p(each["kubernetes"], 100),
		walls["docker"].Round(time.Millisecond), p(each["docker"], 50), p(each["docker"], 100),
		ms(walls["kubernetes"])/ms(walls["docker"]))
}

// TestKubernetesProxy: the proxy reaches a Pod's agent over gRPC (lease in
// the metadata) and a server inside the Pod through its preview URL (path
// form), with the lease's token only.
func TestKubernetesProxy(t *testing.T) {
	a, _, _ := startK8sOrch(t)
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
