package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// keepAliveClient is an HTTP client with its own keep-alive pool, as a
// real caller of the agent or the proxy would hold.
func keepAliveClient() *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, DisableCompression: true}, Timeout: 5 * time.Minute}
}

// restExecTrue posts {"argv":["true"]} to url with token and requires a
// 200 answer with exit code 0.
func restExecTrue(c *http.Client, url, token string) error {
	return restExec(c, url, token, execTrueBody)
}

// execTrueBody and execTrueRootBody are the exec requests of the
// benchmarks: `true` as the sandbox's default user, and as root.
var (
	execTrueBody     = []byte(`{"argv":["true"]}`)
	execTrueRootBody = []byte(`{"argv":["true"],"user":"root"}`)
)

// restExec posts an exec request body to url with token and requires a
// 200 answer with exit code 0.
func restExec(c *http.Client, url, token string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r execResult
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil || r.ExitCode != 0 {
		return fmt.Errorf("POST %s: HTTP %d: %s", url, resp.StatusCode, b)
	}
	return nil
}

// BenchmarkProxyExecTrue measures `true` run in ONE berth/base sandbox on
// the Docker backend, interleaved in one run (the order rotates every
// iteration):
//
//   - rest-proxy: POST /v1/sandboxes/{lease}/v1/exec through the
//     orchestrator's proxy with the lease token (keep-alive client), as
//     the sandbox's default user; rest-proxy-root: the same as root
//     ("user": "root"), which shows what the user switch costs;
//   - grpc-proxy: ProcessService.Exec through the proxy (x-berth-lease
//     metadata, one connection);
//   - rest-direct and grpc-direct: the same calls straight to the agent's
//     endpoint with the agent token (Manager().AgentToken);
//   - docker-exec: `docker exec CONTAINER true` with the docker CLI, every
//     10th iteration (it is two orders of magnitude slower);
//   - host: fork/exec of `true` on the host (the "within 3× of a bare
//     fork/exec" target).
//
// It reports p50 and p99 of each, and the targets of DESIGN.md as ratios:
// docker-exec p50 / rest-proxy p50 and / grpc-proxy p50 (target ≥ 30), the
// proxy overhead at p50 (proxy p50 minus direct p50; target ≤ 0.5 ms), and
// proxy p50 / host p50 (target ≤ 3).
//
//	go test -run '^$' -bench ProxyExecTrue -benchtime 200x ./e2e/
func BenchmarkProxyExecTrue(b *testing.B) {
	requireImage(b, baseImage)
	dir, _ := newDataDir(b)
	o := startOrch(b, dir)
	r := o.mustAcquire(b, "bench-exec-true", baseImage, "1800s")
	l := r.GetLease()
	benchExecTrue(b, o.api, r, o.agentToken(l.GetId()), dockerExecSide(l.GetContainerId()))
	o.mustRelease(b, l.GetId())
}

// BenchmarkProxyExecTrueContainerd is BenchmarkProxyExecTrue with the
// sandbox on the containerd backend, whose root filesystem is a snapshot
// of the kernel's overlayfs (on these machines Docker's storage driver is
// fuse-overlayfs, which every file a command opens goes through). Its
// engine sides are `ctr task exec` into the same sandbox (containerd's own
// CLI) and `docker exec` into a plain `docker run -d berth/base sleep`
// container, the figure target 1 compares with; both every 10th iteration.
//
//	go test -run '^$' -bench ProxyExecTrueContainerd -benchtime 200x ./e2e/
func BenchmarkProxyExecTrueContainerd(b *testing.B) {
	requireCtrdImage(b, baseImage)
	requireImage(b, baseImage)
	env := newCtrdEnv(b)
	o := startCtrdOrch(b, env)
	r := o.acq(b, "bench-exec-true-ctrd", baseImage, "1800s")
	l := r.GetLease()
	plain := mustDocker(b, "run", "-d", "--label", runLabel+"="+runID, baseImage, "sleep", "infinity")
	b.Cleanup(func() { mustDocker(b, "rm", "-f", plain) })
	ns := ctrd.rt.Namespace()
	var n int
	ctrExec := &execSide{name: "ctr-exec", every: 10, run: func() error {
		n++
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ctr", "--address", ctrd.rt.Address(), "-n", ns,
			"task", "exec", "--exec-id", fmt.Sprintf("bench-%d", n), l.GetContainerId(), "true").CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr task exec: %v: %s", err, out)
		}
		return nil
	}}
	if _, err := exec.LookPath("ctr"); err != nil {
		b.Logf("no ctr command (%v): the ctr-exec side is left out", err)
		ctrExec = nil
	}
	sides := []*execSide{dockerExecSide(plain)}
	if ctrExec != nil {
		sides = append(sides, ctrExec)
	}
	benchExecTrue(b, o.api, r, o.srv.Manager().Tokens().AgentToken(l.GetId()), sides...)
	o.mustRelease(b, l.GetId())
}

// BenchmarkProxyExecTrueOverlay2 is BenchmarkProxyExecTrue on a second
// Docker Engine started for it with the overlay2 storage driver (the
// kernel's overlayfs; this machine's own engine runs fuse-overlayfs), so
// that the Docker backend is measured on the driver most Docker hosts use;
// its docker-exec side is `docker exec` on that engine. The engine and
// everything it started are removed at the end.
//
//	go test -run '^$' -bench ProxyExecTrueOverlay2 -benchtime 200x ./e2e/
func BenchmarkProxyExecTrueOverlay2(b *testing.B) {
	e, o := startOverlay2Orch(b)
	r := o.mustAcquire(b, "bench-exec-true-overlay2", baseImage, "1800s")
	l := r.GetLease()
	engineExec := dockerExecSide(l.GetContainerId())
	engineExec.run = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "docker", "-H", e.host(), "exec", l.GetContainerId(), "true").CombinedOutput()
		if err != nil {
			return fmt.Errorf("docker exec: %v: %s", err, out)
		}
		return nil
	}
	benchExecTrue(b, o.api, r, o.agentToken(l.GetId()), engineExec)
	o.mustRelease(b, l.GetId())
}

// startOverlay2Orch starts a second Docker Engine with the overlay2
// storage driver (startTestEngine: removed with all it started when b
// ends), loads berth/base into it and starts an orchestrator on it. It
// skips (fails with BERTH_REQUIRE_DOCKER=1) when the kernel has no
// overlayfs.
func startOverlay2Orch(b *testing.B) (*testEngine, *orch) {
	requireImage(b, baseImage)
	if !kernelHas("overlay") {
		testenv.SkipOrFail(b, "the kernel has no overlay file system: no overlay2 engine")
	}
	e := startTestEngine(b, "overlay2")
	e.loadImage(b, baseImage)
	dir, _ := newDataDir(b)
	return e, startOrchOnEngine(b, e, dir)
}

// kernelHas reports whether /proc/filesystems lists fs.
func kernelHas(fs string) bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == fs {
			return true
		}
	}
	return false
}

// execSide is one way of running `true` in BenchmarkProxyExecTrue's
// rotation, and its measured durations.
type execSide struct {
	name  string
	every int // run on every n-th iteration
	run   func() error
	ds    []time.Duration
}

// dockerExecSide runs `docker exec ID true` with the docker CLI, every
// 10th iteration.
func dockerExecSide(id string) *execSide {
	return &execSide{name: "docker-exec", every: 10, run: func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := dockerCLI(ctx, "exec", id, "true")
		if err != nil {
			return fmt.Errorf("docker exec: %v: %s", err, out)
		}
		return nil
	}}
}

// benchExecTrue runs BenchmarkProxyExecTrue's rotation against lease r of
// the orchestrator behind a: berth's sides (through the proxy as the
// default user and as root, over REST and gRPC; the agent reached
// directly with agentTok; fork/exec on the host) and the engine's own
// sides. The first engine side named docker-exec is the one target 1's
// ratios are taken against; every further engine side gets its own ratio
// to rest-proxy.
func benchExecTrue(b *testing.B, a *api, r *orchv1.AcquireResponse, agentTok string, engine ...*execSide) {
	l := r.GetLease()
	id, tok := l.GetId(), r.GetToken()

	proxyHTTP, directHTTP := keepAliveClient(), keepAliveClient()
	defer proxyHTTP.CloseIdleConnections()
	defer directHTTP.CloseIdleConnections()
	proxyURL := a.base + sandboxPath(id, "/v1/exec")
	directURL := "http://" + l.GetEndpoint() + "/v1/exec"

	proxyConn := a.grpcConn(b)
	directConn, err := grpc.NewClient(l.GetEndpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer directConn.Close()
	proxyProc, directProc := agentv1.NewProcessServiceClient(proxyConn), agentv1.NewProcessServiceClient(directConn)
	proxyCtx := leaseCtx(context.Background(), id, tok)
	directCtx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+agentTok)
	grpcTrue := func(ctx context.Context, c agentv1.ProcessServiceClient) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := c.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"true"}})
		if err == nil && res.GetExitCode() != 0 {
			err = fmt.Errorf("exit %d: %s", res.GetExitCode(), res.GetStderr())
		}
		return err
	}

	sides := []*execSide{
		{name: "rest-proxy", every: 1, run: func() error { return restExecTrue(proxyHTTP, proxyURL, tok) }},
		{name: "rest-proxy-root", every: 1, run: func() error { return restExec(proxyHTTP, proxyURL, tok, execTrueRootBody) }},
		{name: "grpc-proxy", every: 1, run: func() error { return grpcTrue(proxyCtx, proxyProc) }},
		{name: "rest-direct", every: 1, run: func() error { return restExecTrue(directHTTP, directURL, agentTok) }},
		{name: "grpc-direct", every: 1, run: func() error { return grpcTrue(directCtx, directProc) }},
		{name: "host", every: 1, run: func() error { return exec.Command("true").Run() }},
	}
	sides = append(sides, engine...)
	// Warm up: connections, the agent's and the proxy's caches.
	for range 5 {
		for _, s := range sides {
			if err := s.run(); err != nil {
				b.Fatalf("%s (warm-up): %v", s.name, err)
			}
		}
	}

	b.ResetTimer()
	for i := range b.N {
		for k := range sides {
			s := sides[(i+k)%len(sides)]
			if i%s.every != 0 {
				continue
			}
			t0 := time.Now()
			err := s.run()
			d := time.Since(t0)
			if err != nil {
				b.Fatalf("%s, iteration %d: %v", s.name, i, err)
			}
			s.ds = append(s.ds, d)
		}
	}
	b.StopTimer()

	p50, p99 := map[string]time.Duration{}, map[string]time.Duration{}
	b.ReportMetric(0, "ns/op") // one iteration mixes every side: meaningless
	for _, s := range sides {
		p50[s.name], p99[s.name] = percentile(s.ds, 50), percentile(s.ds, 99)
		b.ReportMetric(ms(p50[s.name]), s.name+"-p50-ms")
		b.ReportMetric(ms(p99[s.name]), s.name+"-p99-ms")
	}
	ratio := func(a, c string) float64 { return ms(p50[a]) / ms(p50[c]) }
	b.ReportMetric(ratio("docker-exec", "rest-proxy"), "docker/rest-proxy-p50-x")
	b.ReportMetric(ratio("docker-exec", "grpc-proxy"), "docker/grpc-proxy-p50-x")
	restOver, grpcOver := p50["rest-proxy"]-p50["rest-direct"], p50["grpc-proxy"]-p50["grpc-direct"]
	b.ReportMetric(ms(restOver), "rest-overhead-p50-ms")
	b.ReportMetric(ms(grpcOver), "grpc-overhead-p50-ms")
	b.ReportMetric(ratio("rest-proxy", "host"), "rest-proxy/host-p50-x")
	b.ReportMetric(ratio("grpc-proxy", "host"), "grpc-proxy/host-p50-x")

	var line bytes.Buffer
	fmt.Fprintf(&line, "N=%d (engine CLIs: %d samples each):", b.N, len(engine[0].ds))
	for _, s := range sides {
		fmt.Fprintf(&line, " %s p50 %s p99 %s |", s.name, p50[s.name].Round(time.Microsecond), p99[s.name].Round(time.Microsecond))
	}
	fmt.Fprintf(&line, " docker/proxy p50: rest %.1f× grpc %.1f× (target ≥ 30×, stretch 40×) |", ratio("docker-exec", "rest-proxy"), ratio("docker-exec", "grpc-proxy"))
	for _, s := range engine {
		if s.name != "docker-exec" {
			fmt.Fprintf(&line, " %s/rest-proxy p50 %.1f× |", s.name, ratio(s.name, "rest-proxy"))
		}
	}
	fmt.Fprintf(&line, " default user - root p50 %s | proxy overhead p50: rest %s grpc %s (target ≤ 0.5ms) | proxy/host p50: rest %.2f× grpc %.2f× (target ≤ 3×)",
		(p50["rest-proxy"] - p50["rest-proxy-root"]).Round(time.Microsecond), restOver.Round(time.Microsecond), grpcOver.Round(time.Microsecond),
		ratio("rest-proxy", "host"), ratio("grpc-proxy", "host"))
	b.Log(line.String())
}

// BenchmarkProxyFiles256MiB moves one 256 MiB file (random bytes, from a
// temporary file on disk) into and out of ONE berth/base sandbox, each
// iteration one full round, interleaved (the order alternates):
//
//   - proxy up: raw PUT /v1/sandboxes/{lease}/v1/files/workspace/big.bin
//     streamed from the file; proxy down: raw GET of the same path into a
//     file on disk;
//   - docker cp up: `docker cp FILE CONTAINER:/workspace/big.bin`; docker
//     cp down: `docker cp CONTAINER:/workspace/big.bin FILE`.
//
// Every copy is checked (size, and sha256 outside the timing). It reports
// the median seconds and MiB/s of each, and docker cp time / proxy time up
// and down (target: > 1, the proxy faster both ways). Temporary files are
// removed. One round is meaningful, and at most maxFileRounds rounds are
// run whatever b.N is, so that `-bench Proxy -benchtime 200x` (sized for
// BenchmarkProxyExecTrue) stays under a minute:
//
//	go test -run '^$' -bench ProxyFiles256MiB -benchtime 1x ./e2e/
func BenchmarkProxyFiles256MiB(b *testing.B) {
	const size = 256 << 20
	const maxFileRounds = 3
	const mib = float64(size) / (1 << 20)
	requireImage(b, baseImage)
	dir, _ := newDataDir(b)
	o := startOrch(b, dir)
	r := o.mustAcquire(b, "bench-files", baseImage, "1800s")
	l := r.GetLease()
	id, tok, cid := l.GetId(), r.GetToken(), l.GetContainerId()

	tmp := b.TempDir() // removed when the benchmark ends
	src := filepath.Join(tmp, "big.bin")
	want := writeRandomFile(b, src, size)
	c := keepAliveClient()
	defer c.CloseIdleConnections()
	fileURL := o.base + sandboxPath(id, "/v1/files/workspace/big.bin")
	const inSandbox = "/workspace/big.bin"

	proxyUp := func() error {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		req, err := http.NewRequest(http.MethodPut, fileURL, f)
		if err != nil {
			return err
		}
		req.ContentLength = size
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("PUT: HTTP %d: %s", resp.StatusCode, body)
		}
		return nil
	}
	proxyDown := func(dst string) error {
		req, err := http.NewRequest(http.MethodGet, fileURL, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("GET: HTTP %d: %s", resp.StatusCode, body)
		}
		f, err := os.Create(dst)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	dockerCp := func(from, to string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if out, err := dockerCLI(ctx, "cp", from, to); err != nil {
			return fmt.Errorf("docker cp %s %s: %v: %s", from, to, err, out)
		}
		return nil
	}
	// inSandboxSum is the sha256 of the sandbox's copy, computed in the
	// sandbox (outside the timing).
	inSandboxSum := func() string {
		res := o.mustProxyExec(b, id, tok, "sha256sum", inSandbox)
		if len(res.Stdout) < 64 {
			b.Fatalf("sha256sum: %q", res.Stdout)
		}
		return res.Stdout[:64]
	}
	wantHex := fmt.Sprintf("%x", want)
	checkLocal := func(what, path string) {
		b.StopTimer()
		defer b.StartTimer()
		if got := fileSum(b, path); got != want {
			b.Fatalf("%s: %s has another sha256 than the source", what, path)
		}
		if err := os.Remove(path); err != nil {
			b.Fatal(err)
		}
	}
	checkSandbox := func(what string) {
		b.StopTimer()
		defer b.StartTimer()
		if got := inSandboxSum(); got != wantHex {
			b.Fatalf("%s: the sandbox's copy has sha256 %s, want %s", what, got, wantHex)
		}
	}

	type side struct {
		name string
		ds   []time.Duration
	}
	sides := map[string]*side{}
	timed := func(name string, f func() error) {
		t0 := time.Now()
		err := f()
		d := time.Since(t0)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		if sides[name] == nil {
			sides[name] = &side{name: name}
		}
		sides[name].ds = append(sides[name].ds, d)
	}
	proxyRound := func(i int) {
		timed("proxy-up", proxyUp)
		checkSandbox("proxy up")
		dst := filepath.Join(tmp, fmt.Sprintf("proxy-down-%d.bin", i))
		timed("proxy-down", func() error { return proxyDown(dst) })
		checkLocal("proxy down", dst)
	}
	dockerRound := func(i int) {
		timed("docker-cp-up", func() error { return dockerCp(src, cid+":"+inSandbox) })
		checkSandbox("docker cp up")
		dst := filepath.Join(tmp, fmt.Sprintf("docker-down-%d.bin", i))
		timed("docker-cp-down", func() error { return dockerCp(cid+":"+inSandbox, dst) })
		checkLocal("docker cp down", dst)
	}

	b.ResetTimer()
	for i := range min(b.N, maxFileRounds) {
		if i%2 == 0 {
			proxyRound(i)
			dockerRound(i)
		} else {
			dockerRound(i)
			proxyRound(i)
		}
	}
	b.StopTimer()
	o.mustRelease(b, id)

	med := map[string]time.Duration{}
	b.ReportMetric(0, "ns/op")
	for _, name := range []string{"proxy-up", "proxy-down", "docker-cp-up", "docker-cp-down"} {
		med[name] = percentile(sides[name].ds, 50)
		b.ReportMetric(med[name].Seconds(), name+"-s")
		b.ReportMetric(mib/med[name].Seconds(), name+"-MiB/s")
	}
	upX := med["docker-cp-up"].Seconds() / med["proxy-up"].Seconds()
	downX := med["docker-cp-down"].Seconds() / med["proxy-down"].Seconds()
	b.ReportMetric(upX, "docker/proxy-up-x")
	b.ReportMetric(downX, "docker/proxy-down-x")
	b.Logf("N=%d (%d rounds), 256 MiB: proxy up %s (%.0f MiB/s), down %s (%.0f MiB/s) | docker cp up %s (%.0f MiB/s), down %s (%.0f MiB/s) | docker cp / proxy: up %.2f×, down %.2f× (target > 1 both ways)",
		b.N, len(sides["proxy-up"].ds), med["proxy-up"].Round(time.Millisecond), mib/med["proxy-up"].Seconds(), med["proxy-down"].Round(time.Millisecond), mib/med["proxy-down"].Seconds(),
		med["docker-cp-up"].Round(time.Millisecond), mib/med["docker-cp-up"].Seconds(), med["docker-cp-down"].Round(time.Millisecond), mib/med["docker-cp-down"].Seconds(),
		upX, downX)
}

// writeRandomFile writes size pseudo-random bytes to path and returns their
// sha256.
func writeRandomFile(tb testing.TB, path string, size int64) [sha256.Size]byte {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	rng := mrand.NewChaCha8([32]byte([]byte(randHex(16))))
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if _, err := io.CopyN(w, rng, size); err != nil {
		tb.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// fileSum returns the sha256 of the file at path.
func fileSum(tb testing.TB, path string) [sha256.Size]byte {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		tb.Fatal(err)
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return sum
}
