package e2e

// End-to-end tests of the containerd backend: an in-process orchestrator
// whose runtime is the containerd backend built from its configuration (as
// `orchestrator serve --runtime containerd` builds it), driven through the
// lease API and the proxy exactly as the Docker-backed tests drive theirs,
// with checks against containerd itself (its containers, tasks and the
// sandboxes' network namespaces).
//
// They need root and a containerd socket (BERTH_CONTAINERD_ADDRESS, else
// /run/containerd/containerd.sock, else the Docker Engine's own containerd);
// otherwise they skip saying why. berth/minimal and berth/base are imported
// once from the Docker Engine (make images); a test needing an image that is
// neither there nor in the namespace skips naming `make images`.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/containerd"
	"github.com/berth-dev/berth/pkg/workspace"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// ctrd is the containerd set-up shared by the tests of this file, made
// once by the first of them (requireContainerd).
var ctrd struct {
	once sync.Once
	// skip is why the containerd tests cannot run here ("" when they can).
	skip string
	// rt is a runtime of its own for direct checks (Get, List, Remove,
	// the client); never closed (it lives as long as the test binary).
	rt *containerd.Runtime
	// images holds the refs present in the namespace; missing says why
	// one is not.
	images  map[string]bool
	missing map[string]string
}

func setupContainerd() {
	if os.Geteuid() != 0 {
		ctrd.skip = "the containerd backend needs root (network namespaces, CNI, mounts): run the e2e tests as root"
		return
	}
	addr := testenv.ContainerdSocket(containerd.DefaultAddress, containerd.DockerAddress)
	if addr == "" {
		if env := os.Getenv("BERTH_CONTAINERD_ADDRESS"); env != "" {
			ctrd.skip = fmt.Sprintf("BERTH_CONTAINERD_ADDRESS=%s is not a containerd socket: skipping the containerd e2e tests", env)
		} else {
			ctrd.skip = fmt.Sprintf("no containerd socket found (%s, %s; or set BERTH_CONTAINERD_ADDRESS): skipping the containerd e2e tests",
				containerd.DefaultAddress, containerd.DockerAddress)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rt, err := containerd.New(ctx, containerd.Config{AgentBinary: agentBin, Address: addr, Logger: discardLogger()})
	if err != nil {
		ctrd.skip = fmt.Sprintf("containerd.New(%s): %v", addr, err)
		return
	}
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	err = rt.Ping(pctx)
	pcancel()
	if err != nil {
		rt.Close()
		ctrd.skip = fmt.Sprintf("containerd at %s does not answer: %v", addr, err)
		return
	}
	ctrd.rt = rt
	ctrd.images, ctrd.missing = map[string]bool{}, map[string]string{}
	nsCtx := namespaces.WithNamespace(ctx, rt.Namespace())
	for _, ref := range []string{minimalImage, baseImage} {
		t0 := time.Now()
		_, err := rt.ImportFromDocker(ctx, ref)
		if err == nil {
			ctrd.images[ref] = true
			if testing.Verbose() {
				fmt.Fprintf(os.Stderr, "e2e: containerd: %s ready in namespace %s in %s\n", ref, rt.Namespace(), time.Since(t0).Round(time.Millisecond))
			}
			continue
		}
		// Not in Docker (or Docker failed): an earlier import may still be there.
		if _, gerr := rt.Client().ImageService().Get(nsCtx, "docker.io/"+ref); gerr == nil {
			ctrd.images[ref] = true
			fmt.Fprintf(os.Stderr, "e2e: containerd: %s not imported from Docker (%v); using the copy already in namespace %s\n", ref, err, rt.Namespace())
			continue
		}
		ctrd.missing[ref] = err.Error()
	}
}

// requireContainerd skips unless the containerd tests can run, and returns
// the shared runtime for direct checks.
func requireContainerd(tb testing.TB) *containerd.Runtime {
	tb.Helper()
	requireDocker(tb) // TestMain builds the agent only when Docker answers
	ctrd.once.Do(setupContainerd)
	if ctrd.skip != "" {
		testenv.SkipOrFail(tb, ctrd.skip)
	}
	return ctrd.rt
}

// ctrdHasImage reports whether ref is in the containerd namespace.
func ctrdHasImage(ref string) bool { return ctrd.images[ref] }

// requireCtrdImage skips unless ref is in the containerd namespace.
func requireCtrdImage(tb testing.TB, ref string) {
	tb.Helper()
	requireContainerd(tb)
	if !ctrdHasImage(ref) {
		testenv.SkipOrFailf(tb, "image %s is neither in the Docker Engine nor in containerd namespace %q (%s): run `make images` first",
			ref, ctrd.rt.Namespace(), ctrd.missing[ref])
	}
}

// ctrdEnv is one test's orchestrator identity: a data dir with its
// instance id, and every sandbox (container id) the test saw, for the
// final leftover check.
type ctrdEnv struct {
	dir, instance string
	mu            sync.Mutex
	seen          map[string]bool
}

func (e *ctrdEnv) track(containerID string) {
	if containerID == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen[containerID] = true
}

// newCtrdEnv returns a fresh data dir whose instance id is written ahead,
// and registers (before any server starts, so it runs after they stop) the
// final check: no containerd container with this instance's label is left,
// and no network namespace or host directory of any sandbox the test saw.
// Leftovers are removed and fail the test.
func newCtrdEnv(tb testing.TB) *ctrdEnv {
	tb.Helper()
	rt := requireContainerd(tb)
	e := &ctrdEnv{dir: tb.TempDir(), instance: "e2e-" + runID + "-ctrd-" + randHex(4), seen: map[string]bool{}}
	if err := os.WriteFile(filepath.Join(e.dir, instanceFile), []byte(e.instance+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		boxes, err := rt.List(ctx, runtime.Selector{runtime.LabelInstance: e.instance})
		if err != nil {
			tb.Errorf("cleanup: list containerd containers of instance %s: %v", e.instance, err)
		}
		for _, sb := range boxes {
			e.track(sb.ID)
			tb.Errorf("cleanup: containerd container %s (lease %s, %s) of instance %s was left behind; removing it", sb.ID, sb.LeaseID, sb.State, e.instance)
			if err := rt.Remove(ctx, sb.ID); err != nil {
				tb.Errorf("cleanup: remove %s: %v", sb.ID, err)
			}
		}
		if err := egress.RemoveInstance(ctx, e.instance); err != nil {
			tb.Errorf("cleanup: egress rules of instance %s: %v", e.instance, err)
		}
		e.mu.Lock()
		ids := make([]string, 0, len(e.seen))
		for id := range e.seen {
			ids = append(ids, id)
		}
		e.mu.Unlock()
		slices.Sort(ids)
		for _, id := range ids {
			if left := hostLeftovers(id); len(left) > 0 {
				tb.Errorf("cleanup: sandbox %s left %v behind; removing", id, left)
				// Remove of a missing container still clears what is left under its id.
				if err := rt.Remove(ctx, id); err != nil {
					tb.Errorf("cleanup: remove leftovers of %s: %v", id, err)
				}
			}
		}
	})
	return e
}

// hostLeftovers lists the host state of sandbox id that exists: its
// network namespace and its host directory.
func hostLeftovers(id string) []string {
	var left []string
	for _, p := range []string{netnsPath(id), filepath.Join(containerd.DefaultStateDir, "sandboxes", id)} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	return left
}

// netnsPath is where the backend bind-mounts sandbox id's network
// namespace (newCtrdRuntime, like serve, leaves NetnsDir at its default).
func netnsPath(id string) string { return filepath.Join(containerd.DefaultNetnsDir, id) }

// ipNetns returns the names `ip netns list` prints, and false when there
// is no ip command.
func ipNetns(tb testing.TB) (map[string]bool, bool) {
	tb.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, false
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		tb.Fatalf("ip netns list: %v: %s", err, out)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names[f[0]] = true
		}
	}
	return names, true
}

// ctrdOrch is an in-process orchestrator on 127.0.0.1:0 whose runtime is
// the containerd backend built by newCtrdRuntime.
type ctrdOrch struct {
	*api
	env      *ctrdEnv
	srv      *orchestrator.Server
	rt       *containerd.Runtime
	stopped  atomic.Bool
	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan error
}

// startCtrdOrch starts an orchestrator with cfg.Runtime "containerd" on
// env's data dir. When the test ends its live leases are reaped (so their
// sandboxes go), then it is stopped; stop may come earlier (sandboxes keep
// running, as after a Close). mutate adjusts the configuration.
func startCtrdOrch(tb testing.TB, env *ctrdEnv, mutate ...func(*orchestrator.Config)) *ctrdOrch {
	tb.Helper()
	cfg := orchestrator.Defaults()
	cfg.Runtime = "containerd"
	cfg.ContainerdAddress = ctrd.rt.Address()
	cfg.DataDir = env.dir
	cfg.AgentBinary = agentBin
	cfg.OperatorToken = operatorToken
	cfg.DefaultImage = minimalImage
	for _, f := range mutate {
		f(&cfg)
	}
	log := testLogger(tb, "inproc-ctrd:"+env.instance)
	ctx := context.Background()
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Minute)
	rt, err := newCtrdRuntime(rctx, cfg, log)
	rcancel()
	if err != nil {
		tb.Fatalf("containerd runtime: %v", err)
	}
	srv, err := orchestrator.New(ctx, cfg, orchestrator.Platform{Runtime: rt}, log)
	if err != nil {
		rt.Close()
		tb.Fatalf("orchestrator.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		rt.Close()
		tb.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	o := &ctrdOrch{api: newAPI(ln.Addr().String()), env: env, srv: srv, rt: rt, cancel: cancel, done: make(chan error, 1)}
	go func() { o.done <- srv.Serve(sctx, ln) }()
	tb.Cleanup(func() { o.stop(tb) })
	tb.Cleanup(func() { o.reapAll(tb) }) // runs first
	return o
}

// newCtrdRuntime builds the containerd backend from cfg's settings as
// `orchestrator serve` does (cmd/orchestrator/internal/backend, whose own
// tests check the mapping of every setting), through the public
// constructor: the settings these tests use, and a ping. The images are
// imported once by setupContainerd.
func newCtrdRuntime(ctx context.Context, cfg orchestrator.Config, log *slog.Logger) (*containerd.Runtime, error) {
	rt, err := containerd.New(ctx, containerd.Config{
		AgentBinary: cfg.AgentBinary, Address: cfg.ContainerdAddress, Namespace: cfg.ContainerdNamespace,
		DefaultResources: cfg.DefaultResources(), UserNamespaces: cfg.UserNamespaces, UserNSBase: cfg.UserNSBase,
		Output: cfg.SandboxOutput(), Logger: log.With("component", "containerd"),
	})
	if err != nil {
		return nil, err
	}
	if err := rt.Ping(ctx); err != nil {
		rt.Close()
		return nil, fmt.Errorf("containerd engine unreachable: %w", err)
	}
	return rt, nil
}

// stop shuts the server down and closes it and its runtime; sandboxes keep
// running.
func (o *ctrdOrch) stop(tb testing.TB) {
	o.stopOnce.Do(func() {
		o.stopped.Store(true)
		o.api.close()
		o.cancel()
		select {
		case err := <-o.done:
			if err != nil {
				tb.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			tb.Errorf("Serve did not return within 30s of shutdown")
		}
		if err := o.srv.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
		_ = o.rt.Close()
	})
}

// reapAll reaps every live lease of a running orchestrator (the release of
// what a failed test left).
func (o *ctrdOrch) reapAll(tb testing.TB) {
	if o.stopped.Load() {
		return
	}
	code, _, b, err := o.call(http.MethodPost, "/v1/leases:reap", `{"all":true}`)
	if err != nil || code != http.StatusOK {
		tb.Errorf("cleanup: reap all: HTTP %d, %v: %s", code, err, b)
		return
	}
	var rr orchv1.ReapResponse
	if err := decode(b, &rr); err == nil && len(rr.GetReaped()) > 0 {
		tb.Logf("cleanup: reaped %d lease(s) still live", len(rr.GetReaped()))
	}
}

// acq acquires a READY lease and tracks its sandbox.
func (o *ctrdOrch) acq(tb testing.TB, conv, image, ttl string) *orchv1.AcquireResponse {
	tb.Helper()
	r := o.mustAcquire(tb, conv, image, ttl)
	o.env.track(r.GetLease().GetContainerId())
	return r
}

// ctrdGone reports whether the runtime no longer finds container id.
func ctrdGone(ctx context.Context, rt *containerd.Runtime, id string) (bool, error) {
	_, err := rt.Get(ctx, id)
	if errdefs.IsNotFound(err) {
		return true, nil
	}
	return false, err
}

// requireCtrdGone fails unless container id is gone from containerd (Get
// and List) with its network namespace.
func requireCtrdGone(tb testing.TB, rt *containerd.Runtime, leaseID, id string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if gone, err := ctrdGone(ctx, rt, id); err != nil || !gone {
		tb.Errorf("containerd still has container %s of lease %s (Get: %v)", id, leaseID, err)
	}
	if boxes, err := rt.List(ctx, runtime.Selector{runtime.LabelLease: leaseID}); err != nil || len(boxes) != 0 {
		tb.Errorf("List by lease %s: %d sandbox(es), %v; want none", leaseID, len(boxes), err)
	}
	if left := hostLeftovers(id); len(left) != 0 {
		tb.Errorf("sandbox %s left %v", id, left)
	}
	if names, ok := ipNetns(tb); ok && names[id] {
		tb.Errorf("ip netns still lists %s", id)
	}
}

// grpcExec runs argv in lease id's sandbox over gRPC through the proxy
// (x-berth-lease) with token.
func grpcExec(tb testing.TB, proc agentv1.ProcessServiceClient, id, token string, argv ...string) *agentv1.ExecResponse {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := proc.Exec(leaseCtx(ctx, id, token), &agentv1.ExecRequest{Argv: argv})
	if err != nil {
		tb.Fatalf("gRPC exec %q in %s: %v", argv, id, err)
	}
	if r.GetExitCode() != 0 {
		tb.Fatalf("gRPC exec %q in %s: exit %d, stdout %q, stderr %q", argv, id, r.GetExitCode(), r.GetStdout(), r.GetStderr())
	}
	return r
}

// TestContainerdLeaseLifecycle: acquire a berth/minimal lease on the
// containerd backend → READY, with a running containerd container carrying
// berth's labels and a network namespace; exec through the proxy over REST
// and gRPC with the lease token; release → RELEASED, the container (Get,
// List) and its network namespace (NetnsDir, ip netns) are gone.
func TestContainerdLeaseLifecycle(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	rt := ctrd.rt
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t0 := time.Now()
	r := o.acq(t, "c-ctrd-life", minimalImage, "600s")
	l := r.GetLease()
	id, tok, cid := l.GetId(), r.GetToken(), l.GetContainerId()
	t.Logf("acquire (cold, containerd): %s; lease %s, container %s, endpoint %s", time.Since(t0).Round(time.Millisecond), id, cid, l.GetEndpoint())
	if !r.GetCreated() || cid != containerd.ContainerID(id) {
		t.Errorf("acquire: created %t, container %q; want a new lease in container %q", r.GetCreated(), cid, containerd.ContainerID(id))
	}

	sb, err := rt.Get(ctx, cid)
	if err != nil {
		t.Fatalf("containerd Get %s: %v", cid, err)
	}
	if sb.State != runtime.StateRunning || sb.Endpoint != l.GetEndpoint() {
		t.Errorf("containerd sandbox: state %s endpoint %q; want running at the lease's endpoint %q", sb.State, sb.Endpoint, l.GetEndpoint())
	}
	for k, v := range map[string]string{runtime.LabelManaged: "true", runtime.LabelInstance: env.instance, runtime.LabelLease: id, runtime.LabelConversation: "c-ctrd-life"} {
		if sb.Labels[k] != v {
			t.Errorf("container label %s = %q, want %q", k, sb.Labels[k], v)
		}
	}
	if _, err := os.Lstat(netnsPath(cid)); err != nil {
		t.Errorf("network namespace of a live sandbox: %v", err)
	}
	if names, ok := ipNetns(t); ok && !names[cid] {
		t.Errorf("ip netns does not list %s while it runs", cid)
	}

	// REST through the proxy.
	if res := o.mustProxyExec(t, id, tok, "sh", "-c", "echo hi from $(hostname)"); res.Stdout != "hi from "+cid+"\n" || res.Stderr != "" {
		t.Errorf("REST exec: stdout %q stderr %q, want \"hi from %s\\n\"", res.Stdout, res.Stderr, cid)
	}
	// No token, or another lease's id with this token: refused.
	if code, _, err := o.proxyExec(ctx, id, "", map[string]any{"argv": []string{"true"}}); err != nil || code != http.StatusUnauthorized {
		t.Errorf("REST exec without a token: HTTP %d, %v; want 401", code, err)
	}
	// gRPC through the proxy.
	proc := agentv1.NewProcessServiceClient(o.grpcConn(t))
	if res := grpcExec(t, proc, id, tok, "sh", "-c", "echo grpc; echo err >&2"); res.GetStdout() != "grpc\n" || res.GetStderr() != "err\n" {
		t.Errorf("gRPC exec: stdout %q stderr %q", res.GetStdout(), res.GetStderr())
	}
	if _, err := proc.Exec(leaseCtx(ctx, id, "not-a-token"), &agentv1.ExecRequest{Argv: []string{"true"}}); err == nil {
		t.Errorf("gRPC exec with a bad token succeeded")
	}

	rel := o.mustRelease(t, id)
	if rel.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED || rel.GetEndedAt() == nil {
		t.Fatalf("release: state %s ended_at %v, want RELEASED", rel.GetState(), rel.GetEndedAt())
	}
	requireCtrdGone(t, rt, id, cid)
	if got := o.mustGet(t, id); got.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
		t.Errorf("GET after release: %s", got.GetState())
	}
}

// TestContainerdConcurrentAcquire: 10 acquires of one conversation at once
// share one lease and one containerd container; 10 conversations at once
// get 10 distinct READY leases in 10 containers; reaping all removes every
// container and network namespace.
func TestContainerdConcurrentAcquire(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	rt := ctrd.rt
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sel := runtime.Selector{runtime.LabelInstance: env.instance}

	const m = 10
	same := make([]*orchv1.AcquireResponse, m)
	serrs := make([]error, m)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range m {
		wg.Add(1)
		go func() {
			defer wg.Done()
			same[i], serrs[i] = o.acquire("c-ctrd-same", minimalImage, "600s")
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent acquires of one conversation: %s", m, time.Since(t0).Round(time.Millisecond))
	created := 0
	for i := range m {
		if serrs[i] != nil {
			t.Fatalf("acquire c-ctrd-same %d: %v", i, serrs[i])
		}
		o.env.track(same[i].GetLease().GetContainerId())
		if same[i].GetLease().GetId() != same[0].GetLease().GetId() || same[i].GetToken() != same[0].GetToken() ||
			same[i].GetLease().GetState() != orchv1.LeaseState_LEASE_STATE_READY {
			t.Errorf("acquire c-ctrd-same %d: lease %s (%s), want READY %s with the same token", i, same[i].GetLease().GetId(), same[i].GetLease().GetState(), same[0].GetLease().GetId())
		}
		if same[i].GetCreated() {
			created++
		}
	}
	if created != 1 {
		t.Errorf("%d of %d concurrent acquires say created, want 1", created, m)
	}
	boxes, err := rt.List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(boxes) != 1 || boxes[0].ID != same[0].GetLease().GetContainerId() || boxes[0].ConversationID != "c-ctrd-same" {
		t.Fatalf("containerd holds %d containers of this instance (%v), want 1: %s", len(boxes), boxes, same[0].GetLease().GetContainerId())
	}

	const n = 10
	resps := make([]*orchv1.AcquireResponse, n)
	errs := make([]error, n)
	t0 = time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resps[i], errs[i] = o.acquire(fmt.Sprintf("c-ctrd-par-%02d", i), minimalImage, "600s")
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent acquires of %d conversations: %s", n, n, time.Since(t0).Round(time.Millisecond))
	ids, cids, eps := map[string]bool{}, map[string]bool{same[0].GetLease().GetContainerId(): true}, map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("acquire %d: %v", i, errs[i])
		}
		l := resps[i].GetLease()
		o.env.track(l.GetContainerId())
		if l.GetState() != orchv1.LeaseState_LEASE_STATE_READY || l.GetConversationId() != fmt.Sprintf("c-ctrd-par-%02d", i) || !resps[i].GetCreated() {
			t.Errorf("acquire %d: %s for %q, created %t", i, l.GetState(), l.GetConversationId(), resps[i].GetCreated())
		}
		ids[l.GetId()], cids[l.GetContainerId()], eps[l.GetEndpoint()] = true, true, true
	}
	if len(ids) != n || len(cids) != n+1 || len(eps) != n {
		t.Fatalf("%d distinct leases, %d containers (with c-ctrd-same's), %d endpoints; want %d, %d, %d", len(ids), len(cids), len(eps), n, n+1, n)
	}
	if boxes, err = rt.List(ctx, sel); err != nil {
		t.Fatal(err)
	}
	if len(boxes) != n+1 {
		t.Errorf("containerd holds %d containers of this instance, want %d", len(boxes), n+1)
	}
	for _, sb := range boxes {
		if !cids[sb.ID] || sb.State != runtime.StateRunning {
			t.Errorf("containerd container %s (%s) belongs to no lease or is not running", sb.ID, sb.State)
		}
	}
	// Each sandbox answers through the proxy (a few, to keep it short).
	for i := range 3 {
		l := resps[i].GetLease()
		if res := o.mustProxyExec(t, l.GetId(), resps[i].GetToken(), "hostname"); res.Stdout != l.GetContainerId()+"\n" {
			t.Errorf("hostname in lease %s: %q, want %s", l.GetId(), res.Stdout, l.GetContainerId())
		}
	}

	t0 = time.Now()
	code, _, b := o.mustCall(t, http.MethodPost, "/v1/leases:reap", `{"all":true}`)
	if code != http.StatusOK {
		t.Fatalf("reap: HTTP %d: %s", code, b)
	}
	var rr orchv1.ReapResponse
	if err := decode(b, &rr); err != nil {
		t.Fatal(err)
	}
	t.Logf("reap of %d leases: %s", len(rr.GetReaped()), time.Since(t0).Round(time.Millisecond))
	if len(rr.GetReaped()) != n+1 {
		t.Errorf("reaped %d leases, want %d", len(rr.GetReaped()), n+1)
	}
	if boxes, err = rt.List(ctx, sel); err != nil || len(boxes) != 0 {
		t.Errorf("after reap: %d containerd container(s) of this instance, %v; want none", len(boxes), err)
	}
	for cid := range cids {
		if left := hostLeftovers(cid); len(left) != 0 {
			t.Errorf("after reap: sandbox %s left %v", cid, left)
		}
	}
}

// TestContainerdExpiry: a lease with ttl 2s becomes EXPIRED and its
// containerd container is gone within 2s of expires_at.
func TestContainerdExpiry(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	rt := ctrd.rt
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	l := o.acq(t, "c-ctrd-expiry", minimalImage, "2s").GetLease()
	expiresAt := l.GetExpiresAt().AsTime()
	if d := time.Until(expiresAt); d <= 0 || d > 2*time.Second {
		t.Fatalf("expires_at is %s from now, want within (0, 2s]", d)
	}
	ctx := context.Background()
	var expiredAt, goneAt time.Time
	var last *orchv1.Lease
	ok := eventually(time.Until(expiresAt)+10*time.Second, 10*time.Millisecond, func() bool {
		if expiredAt.IsZero() {
			if last = o.mustGet(t, l.GetId()); last.GetState() == orchv1.LeaseState_LEASE_STATE_EXPIRED {
				expiredAt = time.Now()
			}
		}
		if goneAt.IsZero() {
			gone, err := ctrdGone(ctx, rt, l.GetContainerId())
			if err != nil {
				t.Fatalf("containerd Get: %v", err)
			}
			if gone {
				goneAt = time.Now()
			}
		}
		return !expiredAt.IsZero() && !goneAt.IsZero()
	})
	if !ok {
		t.Fatalf("10s after expiry: state %s (expired seen: %t), container gone: %t", last.GetState(), !expiredAt.IsZero(), !goneAt.IsZero())
	}
	if !strings.Contains(last.GetReason(), "ttl") {
		t.Errorf("EXPIRED reason %q does not mention the ttl", last.GetReason())
	}
	if goneAt.Before(expiresAt) || expiredAt.Before(expiresAt) {
		t.Errorf("expired %s / gone %s before expires_at", expiredAt.Sub(expiresAt), goneAt.Sub(expiresAt))
	}
	delay := goneAt.Sub(expiresAt)
	t.Logf("expires_at → EXPIRED seen: %s; expires_at → containerd container gone: %s (reason %q)",
		expiredAt.Sub(expiresAt).Round(time.Millisecond), delay.Round(time.Millisecond), last.GetReason())
	if delay > 2*time.Second {
		t.Errorf("container gone %s after expires_at, want within 2s", delay.Round(time.Millisecond))
	}
	requireCtrdGone(t, rt, l.GetId(), l.GetContainerId())
}

// TestContainerdReconcileAfterRestart: two leases survive Close (their
// containerd tasks keep running) and New on the same data dir (adopted,
// READY, exec works through the new proxy with the old lease tokens); a
// containerd container with this instance's label but no lease is removed
// at start.
func TestContainerdReconcileAfterRestart(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	rt := ctrd.rt
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	ra := o.acq(t, "c-ctrd-keep-a", minimalImage, "600s")
	rb := o.acq(t, "c-ctrd-keep-b", minimalImage, "600s")
	o.stop(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, r := range []*orchv1.AcquireResponse{ra, rb} {
		sb, err := rt.Get(ctx, r.GetLease().GetContainerId())
		if err != nil || sb.State != runtime.StateRunning {
			t.Fatalf("container %s of lease %s after Close: %v, %s; want running", r.GetLease().GetContainerId(), r.GetLease().GetId(), err, sb.State)
		}
	}
	orphan, err := rt.Create(ctx, runtime.Spec{
		LeaseID: "orphan-" + randHex(6), ConversationID: "c-ctrd-orphan", InstanceID: env.instance,
		Image: minimalImage, AgentToken: "orphan-token",
	})
	if err != nil {
		t.Fatalf("create orphan: %v", err)
	}
	env.track(orphan.ID)
	t.Logf("orphan container %s", orphan.ID)

	t0 := time.Now()
	o2 := startCtrdOrch(t, env)
	t.Logf("restart (runtime + New with reconcile): %s", time.Since(t0).Round(time.Millisecond))
	for _, r := range []*orchv1.AcquireResponse{ra, rb} {
		l := r.GetLease()
		got := o2.mustGet(t, l.GetId())
		if got.GetState() != orchv1.LeaseState_LEASE_STATE_READY || got.GetContainerId() != l.GetContainerId() || got.GetEndpoint() == "" {
			t.Errorf("lease %s after restart: %s (%s), container %s endpoint %q; want READY in %s", l.GetId(), got.GetState(), got.GetReason(), got.GetContainerId(), got.GetEndpoint(), l.GetContainerId())
			continue
		}
		if res := o2.mustProxyExec(t, l.GetId(), r.GetToken(), "echo", "adopted"); res.Stdout != "adopted\n" {
			t.Errorf("exec in adopted lease %s: %q", l.GetId(), res.Stdout)
		}
	}
	if gone, err := ctrdGone(ctx, rt, orphan.ID); err != nil || !gone {
		t.Errorf("orphan container %s survived the restart (%v)", orphan.ID, err)
	}
	if r := o2.mustAcquire(t, "c-ctrd-keep-a", minimalImage, "600s"); r.GetLease().GetId() != ra.GetLease().GetId() || r.GetCreated() {
		t.Errorf("acquire c-ctrd-keep-a after restart: lease %s created %t, want the adopted %s", r.GetLease().GetId(), r.GetCreated(), ra.GetLease().GetId())
	}
	if boxes, err := rt.List(ctx, runtime.Selector{runtime.LabelInstance: env.instance}); err != nil || len(boxes) != 2 {
		t.Errorf("%d containerd containers of this instance after restart (%v), want 2", len(boxes), err)
	}
	for _, r := range []*orchv1.AcquireResponse{ra, rb} {
		o2.mustRelease(t, r.GetLease().GetId())
		requireCtrdGone(t, rt, r.GetLease().GetId(), r.GetLease().GetContainerId())
	}
}

// TestContainerdSandboxKilled: with in-place restarts off (Restart.Limit
// 0), a sandbox whose task is SIGKILLed through containerd's API, behind
// the orchestrator's back, makes its lease FAILED within a few seconds with
// a reason naming the exit code (137); its container is then removed, and
// another lease is unaffected. (With restarts on, see
// TestContainerdRestartInPlace.)
func TestContainerdSandboxKilled(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	rt := ctrd.rt
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, func(c *orchestrator.Config) { c.Restart.Limit = 0 })
	victim := o.acq(t, "c-ctrd-victim", minimalImage, "600s").GetLease()
	bystander := o.acq(t, "c-ctrd-bystander", minimalImage, "600s")

	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	t0 := time.Now()
	if _, err := rt.Client().TaskService().Kill(ctx, &tasks.KillRequest{ContainerID: victim.GetContainerId(), Signal: uint32(syscall.SIGKILL), All: true}); err != nil {
		t.Fatalf("kill task %s: %v", victim.GetContainerId(), err)
	}
	var last *orchv1.Lease
	if !eventually(5*time.Second, 10*time.Millisecond, func() bool {
		last = o.mustGet(t, victim.GetId())
		return last.GetState() == orchv1.LeaseState_LEASE_STATE_FAILED
	}) {
		t.Fatalf("5s after the kill the lease is %s (%s), want FAILED", last.GetState(), last.GetReason())
	}
	failedIn := time.Since(t0)
	if !strings.Contains(last.GetReason(), "137") {
		t.Errorf("FAILED reason %q does not mention the exit code 137", last.GetReason())
	}
	var goneIn time.Duration
	if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
		gone, err := ctrdGone(ctx, rt, victim.GetContainerId())
		return err == nil && gone
	}) {
		t.Errorf("the dead sandbox's container %s is still there 10s after the kill", victim.GetContainerId())
	} else {
		goneIn = time.Since(t0)
	}
	t.Logf("kill → FAILED seen after %s (reason %q); → container removed after %s", failedIn.Round(time.Millisecond), last.GetReason(), goneIn.Round(time.Millisecond))
	requireCtrdGone(t, rt, victim.GetId(), victim.GetContainerId())

	if got := o.mustGet(t, bystander.GetLease().GetId()); got.GetState() != orchv1.LeaseState_LEASE_STATE_READY {
		t.Errorf("the other lease is %s (%s), want READY", got.GetState(), got.GetReason())
	}
	o.mustProxyExec(t, bystander.GetLease().GetId(), bystander.GetToken(), "true")
	// The dead lease's proxy route is closed.
	if code, _, err := o.proxyExec(context.Background(), victim.GetId(), operatorToken, map[string]any{"argv": []string{"true"}}); err != nil || code == http.StatusOK {
		t.Errorf("exec in the FAILED lease: HTTP %d, %v; want a refusal", code, err)
	}
	o.mustRelease(t, bystander.GetLease().GetId())
}

// TestContainerdWorkspaceConformance runs the workspace conformance suite
// through the proxy against containerd sandboxes (berth/base, else
// berth/minimal, whose Git subtest then skips): a Remote over gRPC on one
// lease (a fresh Root per subtest), and a Leased over gRPC (a lease per
// subtest, released on Close, its container gone from containerd), in
// parallel.
func TestContainerdWorkspaceConformance(t *testing.T) {
	requireContainerd(t)
	image := baseImage
	if !ctrdHasImage(image) {
		requireCtrdImage(t, minimalImage)
		testenv.LogOrFail(t, fmt.Sprintf("%s is not available (%s): running on %s, the Git subtest skips; run `make images` for full coverage", baseImage, ctrd.missing[baseImage], minimalImage))
		image = minimalImage
	}
	rt := ctrd.rt
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	log := testLogger(t, "workspace-ctrd")
	var leased atomic.Int32

	r := o.acq(t, "c-ctrd-ws-remote", image, "600s")
	remoteID, remoteTok := r.GetLease().GetId(), r.GetToken()
	t.Run("Remote-grpc", func(t *testing.T) {
		t.Parallel()
		runRemoteConformance(t, o.api, remoteID, remoteTok, workspace.TransportGRPC, log)
	})
	t.Run("Leased-grpc", func(t *testing.T) {
		t.Parallel()
		runLeasedConformance(t, o.api, leasedRun{
			ConvPrefix: "c-ctrd-ws-leased", Image: image, Transport: workspace.TransportGRPC, Log: log,
			Created: func(_ *testing.T, info workspace.LeaseInfo) {
				leased.Add(1)
				env.track(containerd.ContainerID(info.ID))
			},
			Gone: func(t *testing.T, l *orchv1.Lease) { requireCtrdGone(t, rt, l.GetId(), l.GetContainerId()) },
		})
	})
	t.Cleanup(func() {
		t.Logf("%d leases acquired by NewLeased on %s, 1 shared by the Remote run", leased.Load(), image)
		o.mustRelease(t, remoteID)
		requireCtrdGone(t, rt, remoteID, r.GetLease().GetContainerId())
	})
}

// TestContainerdProxyPreview: busybox httpd started in a berth/minimal
// containerd sandbox (a background process through the proxy) serves the
// uploaded page at /v1/sandboxes/{lease}/ports/8000/index.html with the
// lease's token (and the operator's), and answers 401 to another lease's
// token and to none; after release the preview is 410.
func TestContainerdProxyPreview(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	rt := ctrd.rt
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	a := o.acq(t, "c-ctrd-preview-a", minimalImage, "600s")
	other := o.acq(t, "c-ctrd-preview-b", minimalImage, "600s")
	id, tok := a.GetLease().GetId(), a.GetToken()

	page := fmt.Sprintf("<html><body>hello from %s %s</body></html>\n", id, randHex(8))
	o.putFile(t, id, tok, "/workspace/www/index.html", []byte(page))
	code, _, b := o.mustCall(t, http.MethodPost, sandboxPath(id, "/v1/processes"),
		map[string]any{"argv": []string{"busybox", "httpd", "-f", "-p", "8000", "-h", "/workspace/www"}}, tok)
	if code != http.StatusOK {
		t.Fatalf("start httpd: HTTP %d: %s", code, b)
	}
	url := "/v1/sandboxes/" + id + "/ports/8000/index.html"
	var lastCode int
	var lastBody string
	t0 := time.Now()
	if !eventually(15*time.Second, 50*time.Millisecond, func() bool {
		c, _, body, err := o.httpGet("", url, bearerHeader(tok))
		lastCode, lastBody = c, body
		return err == nil && c == http.StatusOK
	}) {
		t.Fatalf("preview never answered 200: last HTTP %d: %s", lastCode, lastBody)
	}
	t.Logf("preview answered 200 %s after httpd started", time.Since(t0).Round(time.Millisecond))

	for _, c := range []struct {
		name     string
		header   http.Header
		wantCode int
	}{
		{"lease token", bearerHeader(tok), http.StatusOK},
		{"operator token", bearerHeader(operatorToken), http.StatusOK},
		{"another lease's token", bearerHeader(other.GetToken()), http.StatusUnauthorized},
		{"no token", nil, http.StatusUnauthorized},
	} {
		code, _, body, err := o.httpGet("", url, c.header)
		switch {
		case err != nil:
			t.Errorf("%s: GET %s: %v", c.name, url, err)
		case code != c.wantCode:
			t.Errorf("%s: GET %s: HTTP %d, want %d: %.200s", c.name, url, code, c.wantCode, body)
		case code == http.StatusOK && body != page:
			t.Errorf("%s: body %q, want %q", c.name, body, page)
		case code != http.StatusOK && strings.Contains(body, "hello from"):
			t.Errorf("%s: a %d answer carries the page", c.name, code)
		}
	}
	// The other sandbox has no web server: its preview is a 502, not
	// lease a's page (sandboxes are separate).
	if code, _, body, err := o.httpGet("", "/v1/sandboxes/"+other.GetLease().GetId()+"/ports/8000/index.html", bearerHeader(other.GetToken())); err != nil || code == http.StatusOK {
		t.Errorf("preview of the lease without httpd: HTTP %d, %v: %.200s; want an error", code, err, body)
	}

	for _, l := range []*orchv1.AcquireResponse{a, other} {
		o.mustRelease(t, l.GetLease().GetId())
		requireCtrdGone(t, rt, l.GetLease().GetId(), l.GetLease().GetContainerId())
	}
	if code, _, body, err := o.httpGet("", url, bearerHeader(tok)); err != nil || code != http.StatusGone {
		t.Errorf("preview of a released lease: HTTP %d, %v, want 410: %.200s", code, err, body)
	}
}

// killCtrdTask SIGKILLs every process of container id's task through
// containerd's API, behind the orchestrator's back, and waits until the
// task is stopped.
func killCtrdTask(tb testing.TB, rt *containerd.Runtime, id string) {
	tb.Helper()
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	if _, err := rt.Client().TaskService().Kill(ctx, &tasks.KillRequest{ContainerID: id, Signal: uint32(syscall.SIGKILL), All: true}); err != nil {
		tb.Fatalf("kill task %s: %v", id, err)
	}
	if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
		// Stopped, or already gone: a kill that spends the restart budget
		// fails the lease, and berth may remove its container at once.
		sb, err := rt.Get(ctx, id)
		return err == nil && sb.State == runtime.StateExited || errdefs.IsNotFound(err)
	}) {
		tb.Fatalf("task of %s not stopped 10s after SIGKILL", id)
	}
}

// TestContainerdRestartInPlace: a sandbox whose task is SIGKILLed from
// outside is restarted in place: a new task on the same container and
// snapshot (the file written before is there), its network set up again
// (the endpoint is read again), the same lease and token; the lease records
// the restart. Released, it leaves nothing behind.
func TestContainerdRestartInPlace(t *testing.T) {
	_, o, r := ctrdKeptLease(t, "c-ctrd-restart")
	rt, l := ctrd.rt, r.GetLease()

	t0 := time.Now()
	killCtrdTask(t, rt, l.GetContainerId())
	var got *orchv1.Lease
	if !eventually(20*time.Second, 20*time.Millisecond, func() bool {
		got = o.mustGet(t, l.GetId())
		return got.GetState() == orchv1.LeaseState_LEASE_STATE_READY && got.GetRestarts() == 1
	}) {
		t.Fatalf("20s after the kill the lease is %s (%s) with %d restarts, want READY after 1", got.GetState(), got.GetReason(), got.GetRestarts())
	}
	t.Logf("kill → READY again in %s at %s (was %s): %q", time.Since(t0).Round(time.Millisecond), got.GetEndpoint(), l.GetEndpoint(), got.GetReason())
	trs := got.GetTransitions()
	if got.GetContainerId() != l.GetContainerId() || got.GetReason() != "restarted after exit 137" ||
		trs[len(trs)-2].GetReason() != "container exited with code 137; restarting" {
		t.Errorf("after the kill: container %s reason %q transitions %v", got.GetContainerId(), got.GetReason(), trs)
	}
	o.checkKeptAndRelease(t, r, "the restart")
}

// TestContainerdReconcileRestartsStopped: the orchestrator is stopped, a
// sandbox's task is killed while it is away (as a containerd or host
// restart would leave it), and the next orchestrator's reconcile restarts
// it in place: the lease survives with its files. (Restarting the machine's
// containerd itself is not done here: the Docker Engine runs on it.)
func TestContainerdReconcileRestartsStopped(t *testing.T) {
	env, o, r := ctrdKeptLease(t, "c-ctrd-reconcile-restart")
	rt, l := ctrd.rt, r.GetLease()
	o.stop(t)
	killCtrdTask(t, rt, l.GetContainerId())

	t0 := time.Now()
	o2 := startCtrdOrch(t, env)
	var got *orchv1.Lease
	if !eventually(20*time.Second, 20*time.Millisecond, func() bool {
		got = o2.mustGet(t, l.GetId())
		return got.GetState() == orchv1.LeaseState_LEASE_STATE_READY && got.GetRestarts() == 1
	}) {
		t.Fatalf("20s after the restart the lease is %s (%s) with %d restarts, want READY after 1", got.GetState(), got.GetReason(), got.GetRestarts())
	}
	t.Logf("orchestrator start → lease READY again in %s at %s (was %s): %q", time.Since(t0).Round(time.Millisecond), got.GetEndpoint(), l.GetEndpoint(), got.GetReason())
	trs := got.GetTransitions()
	if got.GetContainerId() != l.GetContainerId() || !strings.Contains(trs[len(trs)-2].GetReason(), "while the orchestrator was down; restarting") {
		t.Errorf("container %s transitions %v", got.GetContainerId(), trs)
	}
	o2.checkKeptAndRelease(t, r, "the restart")
}

// TestContainerdHibernate: a hibernated lease on the containerd backend
// keeps its container and files and nothing else on the host (its task is
// deleted, its network namespace gone, its address released), survives an
// orchestrator restart as PAUSED, and wakes on its first request through
// the proxy with its files and a working network.
func TestContainerdHibernate(t *testing.T) {
	env, o, r := ctrdKeptLease(t, "c-ctrd-hibernate")
	rt, l := ctrd.rt, r.GetLease()
	cid := l.GetContainerId()
	if _, err := os.Stat(netnsPath(cid)); err != nil {
		t.Fatalf("a READY sandbox's network namespace: %v", err)
	}

	if got, _ := pauseCall(t, o.api, l.GetId(), "hibernate"); got.GetPaused() != "hibernate" {
		t.Fatalf("after :pause hibernate the lease is paused %q (%s)", got.GetPaused(), got.GetReason())
	}
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	if _, err := rt.Client().TaskService().Get(ctx, &tasks.GetRequest{ContainerID: cid}); err == nil {
		t.Errorf("a hibernated sandbox still has its task")
	}
	if _, err := os.Lstat(netnsPath(cid)); !os.IsNotExist(err) {
		t.Errorf("a hibernated sandbox's network namespace %s: %v, want it gone", netnsPath(cid), err)
	}
	sb, err := rt.Get(ctx, cid)
	if err != nil || sb.State != runtime.StateCreated {
		t.Fatalf("runtime Get of a hibernated sandbox: %+v, %v; want it there, created (no task)", sb, err)
	}

	// A new orchestrator finds it as it was: PAUSED, not restarted.
	o.stop(t)
	o2 := startCtrdOrch(t, env)
	if got := o2.mustGet(t, l.GetId()); got.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED || got.GetPaused() != "hibernate" || got.GetRestarts() != 0 {
		t.Fatalf("after an orchestrator restart the lease is %s paused %q (%s), %d restarts; want PAUSED hibernate", got.GetState(), got.GetPaused(), got.GetReason(), got.GetRestarts())
	}

	o2.mustProxyExec(t, l.GetId(), r.GetToken(), "true") // wakes it
	got := o2.mustGet(t, l.GetId())
	if got.GetState() != orchv1.LeaseState_LEASE_STATE_READY || got.GetEndpoint() == "" {
		t.Fatalf("after the wake-up the lease is %s at %q (%s)", got.GetState(), got.GetEndpoint(), got.GetReason())
	}
	if _, err := os.Stat(netnsPath(cid)); err != nil {
		t.Errorf("the woken sandbox's network namespace: %v", err)
	}
	// Its network works: the agent answers at the address it got again
	// (the proxy reached it there), and the sandbox reaches its gateway.
	if res := o2.mustProxyExec(t, l.GetId(), r.GetToken(), "sh", "-c", "ip route 2>/dev/null | head -1 || cat /proc/net/route | sed -n 2p"); res.ExitCode != 0 || res.Stdout == "" {
		t.Errorf("the woken sandbox has no route: %+v", res)
	}
	o2.checkKeptAndRelease(t, r, "the wake-up")
}

// ctrdKeptLease starts an orchestrator on a new containerd env and
// acquires a berth/minimal lease of conversation conv with
// /workspace/kept.txt written in it.
func ctrdKeptLease(t *testing.T, conv string) (*ctrdEnv, *ctrdOrch, *orchv1.AcquireResponse) {
	t.Helper()
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	r := o.acq(t, conv, minimalImage, "600s")
	o.mustProxyExec(t, r.GetLease().GetId(), r.GetToken(), "sh", "-c", "echo kept > /workspace/kept.txt")
	return env, o, r
}

// checkKeptAndRelease checks that the kept.txt of ctrdKeptLease is still
// in r's sandbox after what (a restart, a wake-up), then releases the
// lease and checks that its sandbox is gone.
func (o *ctrdOrch) checkKeptAndRelease(t *testing.T, r *orchv1.AcquireResponse, what string) {
	t.Helper()
	l := r.GetLease()
	if res := o.mustProxyExec(t, l.GetId(), r.GetToken(), "cat", "/workspace/kept.txt"); res.Stdout != "kept\n" {
		t.Errorf("file after %s: %q, want \"kept\\n\"", what, res.Stdout)
	}
	o.mustRelease(t, l.GetId())
	requireCtrdGone(t, ctrd.rt, l.GetId(), l.GetContainerId())
}
