package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime/docker"
	"github.com/berth-dev/berth/pkg/workspace"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// rawExec posts body to the agent's /v1/exec and returns the decoded JSON
// object (so a test sees the wire names, e.g. "oomKilled").
func rawExec(tb testing.TB, endpoint, token string, body map[string]any) map[string]any {
	tb.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, "http://"+endpoint+"/v1/exec", bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := agentHTTP.Do(req)
	if err != nil {
		tb.Fatalf("POST /v1/exec at %s: %v", endpoint, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("POST /v1/exec %v: HTTP %d: %s", body, resp.StatusCode, out)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		tb.Fatalf("decode %s: %v", out, err)
	}
	return m
}

// acquireWithMemory acquires a lease with a memory limit.
func acquireWithMemory(tb testing.TB, a *api, conv, image string, memory int64) *orchv1.AcquireResponse {
	tb.Helper()
	body := map[string]any{"conversationId": conv, "image": image, "ttl": "600s", "resources": map[string]any{"memoryBytes": memory}}
	code, _, b := a.mustCall(tb, http.MethodPost, "/v1/leases", body)
	if code != http.StatusOK {
		tb.Fatalf("acquire %s: HTTP %d: %s", conv, code, b)
	}
	var r orchv1.AcquireResponse
	if err := decode(b, &r); err != nil {
		tb.Fatal(err)
	}
	return &r
}

// waitRestarted waits until lease id is READY with at least n restarts.
func waitRestarted(tb testing.TB, a *api, id string, n int32, timeout time.Duration) *orchv1.Lease {
	tb.Helper()
	var got *orchv1.Lease
	if !eventually(timeout, 50*time.Millisecond, func() bool {
		got = a.mustGet(tb, id)
		return got.GetState() == orchv1.LeaseState_LEASE_STATE_READY && got.GetRestarts() >= n
	}) {
		tb.Fatalf("lease %s after %s: %s (%s) with %d restarts, want READY after %d", id, timeout, got.GetState(), got.GetReason(), got.GetRestarts(), n)
	}
	return got
}

// TestCommandOOMKeepsLease: on the real engine, a command that exceeds the
// sandbox's memory limit is OOM-killed and reported so (oomKilled true in
// the REST JSON, exit -1, signal SIGKILL), while the lease
// stays READY with no restart; then the container killed from outside is
// restarted in place with its files.
func TestCommandOOMKeepsLease(t *testing.T) {
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	acq := acquireWithMemory(t, o.api, "c-oom", minimalImage, 64<<20)
	l := acq.GetLease()
	tok := o.agentToken(l.GetId())
	rawExec(t, l.GetEndpoint(), tok, map[string]any{"command": "echo kept > /workspace/kept.txt"})

	// busybox tail keeps a line-less input in memory: the kernel kills it.
	began := time.Now()
	// (A shell reporting 137 for its killed child is covered by the agent's
	// unit tests; under this limit a pipeline can thrash for a minute
	// before the kernel picks a victim on a loaded machine.)
	res := rawExec(t, l.GetEndpoint(), tok, map[string]any{"argv": []string{"tail", "/dev/zero"}, "timeout": "45s"})
	t.Logf("tail /dev/zero with 64 MiB: %v in %s", res, time.Since(began).Round(time.Millisecond))
	if res["oomKilled"] != true || res["signal"] != "SIGKILL" || res["exitCode"] != float64(-1) {
		t.Errorf("exec result %v, want oomKilled true, signal SIGKILL, exitCode -1", res)
	}
	// A command that ends on its own is not reported.
	if res := rawExec(t, l.GetEndpoint(), tok, map[string]any{"command": "exit 3"}); res["oomKilled"] != false || res["exitCode"] != float64(3) {
		t.Errorf("exit 3: %v", res)
	}
	// The CLI says so and exits 137.
	cli := exec.Command(orchBin, "exec", l.GetId(), "--", "tail", "/dev/zero")
	cli.Env = append(os.Environ(), "BERTH_ADDR="+o.base, "BERTH_TOKEN="+acq.GetToken())
	var stderr bytes.Buffer
	cli.Stderr = &stderr
	err := cli.Run()
	if code := cli.ProcessState.ExitCode(); code != 137 || !strings.Contains(stderr.String(), "killed: out of memory") {
		t.Errorf("orchestrator exec tail /dev/zero: exit %d (%v), stderr %q; want 137 and \"killed: out of memory\"", code, err, stderr.String())
	}
	// The Workspace interface carries it on both transports, in Exec's
	// result and in ExecStream's exit event.
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		ws, err := workspace.NewRemote(ctx, workspace.RemoteConfig{Target: o.base, Token: acq.GetToken(), LeaseID: l.GetId(), Transport: tr})
		if err != nil {
			cancel()
			t.Fatalf("NewRemote(%s): %v", tr, err)
		}
		res, err := ws.Exec(ctx, workspace.Command{Argv: []string{"tail", "/dev/zero"}})
		if err != nil || !res.OOMKilled || res.Signal != "SIGKILL" {
			t.Errorf("%s: Exec tail /dev/zero = %+v, %v; want OOMKilled and SIGKILL", tr, res.ExitStatus, err)
		}
		var exited *workspace.ExitStatus
		res, err = ws.ExecStream(ctx, workspace.Command{Argv: []string{"tail", "/dev/zero"}}, func(ev workspace.Event) error {
			if ev.Kind == workspace.EventExited {
				exited = ev.Exit
			}
			return nil
		})
		if err != nil || !res.OOMKilled || exited == nil || !exited.OOMKilled {
			t.Errorf("%s: ExecStream tail /dev/zero = %+v (exit event %+v), %v; want OOMKilled", tr, res.ExitStatus, exited, err)
		}
		_ = ws.Close()
		cancel()
	}
	// The engine's oom events reach the lease manager and change nothing.
	if !eventually(10*time.Second, 50*time.Millisecond, func() bool { return o.srv.Manager().Stats().OOMEvents >= 1 }) {
		t.Errorf("no oom event counted 10s after the OOM kills")
	}
	time.Sleep(500 * time.Millisecond)
	got := o.mustGet(t, l.GetId())
	if got.GetState() != orchv1.LeaseState_LEASE_STATE_READY || got.GetRestarts() != 0 || got.GetContainerId() != l.GetContainerId() ||
		len(got.GetTransitions()) != len(l.GetTransitions()) {
		t.Fatalf("after the OOM kills the lease is %s (%s) restarts %d; want READY, untouched", got.GetState(), got.GetReason(), got.GetRestarts())
	}
	if r := mustExec(t, got.GetEndpoint(), tok, "cat", "/workspace/kept.txt"); r.Stdout != "kept\n" {
		t.Errorf("file after the OOM kills: %q", r.Stdout)
	}

	// The container killed from outside: restarted in place, files kept.
	killed := time.Now()
	mustDocker(t, "kill", l.GetContainerId())
	got = waitRestarted(t, o.api, l.GetId(), 1, 20*time.Second)
	trs := got.GetTransitions()
	t.Logf("docker kill → READY again in %s at %s (was %s): %q after %q", time.Since(killed).Round(time.Millisecond),
		got.GetEndpoint(), l.GetEndpoint(), got.GetReason(), trs[len(trs)-2].GetReason())
	if got.GetContainerId() != l.GetContainerId() || got.GetReason() != "restarted after exit 137" || len(trs) < 2 ||
		!strings.HasPrefix(trs[len(trs)-2].GetReason(), "container exited with code 137") {
		t.Errorf("after docker kill: container %s reason %q transitions %v", got.GetContainerId(), got.GetReason(), trs)
	}
	if r := mustExec(t, got.GetEndpoint(), tok, "cat", "/workspace/kept.txt"); r.Stdout != "kept\n" {
		t.Errorf("file after the restart: %q, want \"kept\\n\"", r.Stdout)
	}
	o.mustRelease(t, l.GetId())
}

// testEngine is a second Docker Engine started by a test: its own data and
// exec roots, socket, pid file, containerd (started by dockerd under the
// exec root), cgroup parent and default bridge; no iptables,
// sysctl or masquerading changes, so the machine's engine is never
// disturbed.
//
// Two dockerd behaviours would delete the host's "docker0", which is the
// machine engine's default bridge: --bridge=none (removed at every start),
// and --default-address-pool (removed at a restart, with the engine's stale
// "bridge" network). So the engine gets a default bridge the test creates
// (--bridge NAME) and no address pool: its networks take free subnets of
// Docker's default pools, which skip the ones in use on the host.
type testEngine struct {
	dir    string // holds data/, exec/, the socket, pid file and log
	sock   string
	cgroup string // its --cgroup-parent
	defBr  string // its default bridge, created (and deleted) by the test
	driver string // its --storage-driver
	cmd    *exec.Cmd
	exited chan struct{}
	bridge map[string]bool // bridge interfaces of its networks, removed at cleanup
}

// startTestEngine starts a second dockerd with the storage driver named
// (vfs: any file system will do; overlay2: the kernel's overlayfs, for
// measuring berth on the driver most Docker hosts use, where this
// machine's engine has fuse-overlayfs) and registers its cleanup: the
// daemon and what it started are killed by pid, its bridges, cgroups and
// directories removed. It skips (fails with BERTH_REQUIRE_DOCKER=1) without
// dockerd or root.
func startTestEngine(t testing.TB, storageDriver string) *testEngine {
	t.Helper()
	requireDocker(t)
	if _, err := exec.LookPath("dockerd"); err != nil {
		testenv.SkipOrFailf(t, "a second Docker Engine needs dockerd: %v", err)
	}
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "a second Docker Engine needs root")
	}
	// Not t.TempDir(): its long path would overflow the socket path limit.
	dir, err := os.MkdirTemp("", "bde-")
	if err != nil {
		t.Fatal(err)
	}
	suffix := randHex(3)
	e := &testEngine{dir: dir, sock: filepath.Join(dir, "d.sock"), driver: storageDriver,
		cgroup: "berth-e2e-" + runID + "-" + suffix, defBr: "bre2e" + suffix, bridge: map[string]bool{}}
	e.bridge[e.defBr] = true
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.cleanup(t) })
	n, _ := strconv.ParseUint(randHex(1), 16, 8)
	addr := fmt.Sprintf("10.232.%d.1/24", n) // varies between runs; only the host sees it
	for _, args := range [][]string{
		{"link", "add", e.defBr, "type", "bridge"},
		{"addr", "add", addr, "dev", e.defBr},
		{"link", "set", e.defBr, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	e.start(t)
	return e
}

// host is the engine's DOCKER_HOST.
func (e *testEngine) host() string { return "unix://" + e.sock }

// start runs dockerd on the engine's directories and waits until it answers.
func (e *testEngine) start(t testing.TB) {
	t.Helper()
	args := []string{
		"--config-file", filepath.Join(e.dir, "daemon.json"), // not the machine's /etc/docker/daemon.json
		"--data-root", filepath.Join(e.dir, "data"),
		"--exec-root", filepath.Join(e.dir, "exec"),
		"--pidfile", filepath.Join(e.dir, "dockerd.pid"),
		"-H", e.host(),
		"--bridge", e.defBr, "--iptables=false", "--ip-masq=false", "--ip-forward=false",
		"--storage-driver", e.driver,
		"--cgroup-parent", e.cgroup,
		"--exec-opt", "native.cgroupdriver=cgroupfs",
		"--log-level", "warn",
	}
	logf, err := os.OpenFile(filepath.Join(e.dir, "dockerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("dockerd", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start dockerd: %v", err)
	}
	logf.Close()
	e.cmd, e.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(e.exited) }()
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := exec.CommandContext(ctx, "docker", "-H", e.host(), "version", "--format", "{{.Server.Version}}").Output()
		return err == nil
	}) {
		log, _ := os.ReadFile(filepath.Join(e.dir, "dockerd.log"))
		t.Fatalf("the test engine did not answer within 30s:\n%s", log)
	}
}

// stop sends dockerd SIGTERM, as `systemctl restart docker` does (with
// live-restore off it stops every container first), and waits for it.
func (e *testEngine) stop(t testing.TB) {
	t.Helper()
	e.rememberBridges(t)
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(40 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
		t.Fatalf("the test engine did not stop within 40s of SIGTERM")
	}
}

// rememberBridges records the bridge interfaces of the engine's networks.
func (e *testEngine) rememberBridges(t testing.TB) {
	out, err := exec.Command("docker", "-H", e.host(), "network", "ls", "-q", "--no-trunc", "--filter", "driver=bridge").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		if len(id) >= 12 {
			e.bridge["br-"+id[:12]] = true
		}
	}
}

// cleanup stops the daemon (and kills, by pid, whatever it left: its
// containerd and shims), deletes its bridges and cgroups and removes its
// directories.
func (e *testEngine) cleanup(t testing.TB) {
	if e.cmd != nil {
		select {
		case <-e.exited:
		default:
			e.rememberBridges(t)
			_ = e.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-e.exited:
			case <-time.After(30 * time.Second):
				_ = e.cmd.Process.Kill()
				<-e.exited
			}
		}
	}
	// Processes started from the engine's directories (its containerd,
	// shims) that outlived it.
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		cl, _ := os.ReadFile("/proc/" + ent.Name() + "/cmdline")
		if bytes.Contains(cl, []byte(e.dir)) {
			t.Logf("cleanup: killing leftover process %d of the test engine: %s", pid, bytes.ReplaceAll(cl, []byte{0}, []byte{' '}))
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for br := range e.bridge {
		if out, err := exec.Command("ip", "link", "del", br).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find") {
			t.Logf("cleanup: ip link del %s: %v: %s", br, err, out)
		}
	}
	// Mounts left under the directory (container roots, netns) go first.
	if b, err := os.ReadFile("/proc/mounts"); err == nil {
		lines := strings.Split(string(b), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if f := strings.Fields(lines[i]); len(f) > 1 && strings.HasPrefix(f[1], e.dir) {
				_ = syscall.Unmount(f[1], syscall.MNT_DETACH)
			}
		}
	}
	if err := os.RemoveAll(e.dir); err != nil {
		t.Errorf("cleanup: remove %s: %v", e.dir, err)
	}
	for _, root := range cgroupRoots() {
		removeCgroupTree(filepath.Join(root, e.cgroup))
	}
}

// cgroupRoots are the mounted cgroup hierarchies (v1 controllers, or the v2 root).
func cgroupRoots() []string {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 2 && (f[2] == "cgroup" || f[2] == "cgroup2") {
			out = append(out, f[1])
		}
	}
	return out
}

// removeCgroupTree removes an (empty) cgroup directory tree, deepest first.
func removeCgroupTree(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, ent := range ents {
		if ent.IsDir() {
			removeCgroupTree(filepath.Join(dir, ent.Name()))
		}
	}
	_ = syscall.Rmdir(dir)
}

// loadImage copies ref from the machine's engine into the test engine.
func (e *testEngine) loadImage(t testing.TB, ref string) {
	t.Helper()
	save := exec.Command("docker", "save", ref)
	load := exec.Command("docker", "-H", e.host(), "load")
	pipe, err := save.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	load.Stdin = pipe
	var out bytes.Buffer
	load.Stdout, load.Stderr = &out, &out
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	if err := save.Run(); err != nil {
		t.Fatalf("docker save %s: %v", ref, err)
	}
	if err := load.Wait(); err != nil {
		t.Fatalf("docker load %s into the test engine: %v: %s", ref, err, out.String())
	}
}

// startOrchOnEngine starts an in-process orchestrator (as startOrch) whose
// Docker backend talks to the test engine.
func startOrchOnEngine(t testing.TB, e *testEngine, dataDir string) *orch {
	t.Helper()
	cfg := orchestrator.Defaults()
	cfg.DataDir, cfg.AgentBinary, cfg.OperatorToken = dataDir, agentBin, operatorToken
	cfg.AgentInjection = "copy" // no agent volume to leave in the test engine
	log := testLogger(t, "engine-restart")
	cli, err := client.NewClientWithOpts(client.WithHost(e.host()), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	rt, err := docker.New(context.Background(), docker.Config{AgentBinary: agentBin, Network: cfg.Network,
		Injection: docker.InjectCopy, Client: cli, Logger: log.With("component", "docker")})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := orchestrator.New(context.Background(), cfg, orchestrator.Platform{Runtime: rt}, log)
	if err != nil {
		rt.Close()
		cli.Close()
		t.Fatalf("orchestrator.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	o := &orch{api: newAPI(ln.Addr().String()), srv: srv, rt: rt, dataDir: dataDir, cancel: cancel, done: make(chan error, 1)}
	go func() { o.done <- srv.Serve(sctx, ln) }()
	t.Cleanup(func() { o.stop(t); cli.Close() })
	return o
}

// TestEngineRestartKeepsLeases: a second Docker Engine, started by the
// test, is restarted (SIGTERM, live-restore off: every container stops with
// it, then dockerd again on the same directories). The orchestrator sees
// the sandbox die, waits for the engine, and restarts the same container
// in place: the lease stays, with its files, its token and a new endpoint.
func TestEngineRestartKeepsLeases(t *testing.T) {
	requireImage(t, minimalImage)
	e := startTestEngine(t, "vfs")
	e.loadImage(t, minimalImage)
	dir, _ := newDataDir(t)
	o := startOrchOnEngine(t, e, dir)

	var leases []*orchv1.Lease
	for i := range 2 {
		l := o.mustAcquire(t, fmt.Sprintf("c-engine-%d", i), minimalImage, "600s").GetLease()
		rawExec(t, l.GetEndpoint(), o.agentToken(l.GetId()), map[string]any{"command": fmt.Sprintf("echo kept-%d > /workspace/kept.txt", i)})
		leases = append(leases, l)
	}
	t.Logf("leases at %s and %s", leases[0].GetEndpoint(), leases[1].GetEndpoint())

	t0 := time.Now()
	e.stop(t)
	stopped := time.Since(t0)
	time.Sleep(time.Second) // the orchestrator meets a dead engine for a moment
	t1 := time.Now()
	e.start(t)
	up := time.Since(t1)
	for i, l := range leases {
		got := waitRestarted(t, o.api, l.GetId(), 1, 45*time.Second)
		t.Logf("lease %d READY %s after the engine answered again (engine stop %s, start %s): %q at %s",
			i, time.Since(t1).Round(time.Millisecond), stopped.Round(time.Millisecond), up.Round(time.Millisecond), got.GetReason(), got.GetEndpoint())
		if got.GetContainerId() != l.GetContainerId() || !strings.HasPrefix(got.GetReason(), "restarted after ") {
			t.Errorf("lease %d: container %s reason %q, want the same container %s restarted", i, got.GetContainerId(), got.GetReason(), l.GetContainerId())
		}
		r := rawExec(t, got.GetEndpoint(), o.agentToken(l.GetId()), map[string]any{"argv": []string{"cat", "/workspace/kept.txt"}})
		if want := fmt.Sprintf("kept-%d\n", i); r["stdout"] != want {
			t.Errorf("lease %d: file after the engine restart: %v, want %q", i, r["stdout"], want)
		}
		var reasons []string
		for _, tr := range got.GetTransitions() {
			reasons = append(reasons, tr.GetFrom().String()+"→"+tr.GetTo().String()+" "+tr.GetReason())
		}
		t.Logf("lease %d transitions: %s", i, strings.Join(reasons, " | "))
	}
	// Sandboxes the engine restart took along leave nothing behind when released.
	for _, l := range leases {
		o.mustRelease(t, l.GetId())
	}
	out, err := exec.Command("docker", "-H", e.host(), "ps", "-aq").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("containers left in the test engine after release: %q %v", out, err)
	}
}
