package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/docker"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

const (
	baseImage    = "berth/base:latest"
	minimalImage = "berth/minimal:latest"
	// operatorToken is BERTH_OPERATOR_TOKEN of every orchestrator the tests start.
	operatorToken = "e2e-operator-token-0123456789abcdef"
	// runLabel marks the containers the tests start with `docker run` (the
	// baseline of the benchmark); its value is runID.
	runLabel = "dev.berth.e2e.run"
	// instanceFile is the orchestrator's instance id file in its data dir.
	instanceFile = "instance-id"
)

var (
	// skipReason is set when Docker is unreachable; shortSkip when the run
	// is -short (a choice of the run, never turned into a failure).
	skipReason string
	shortSkip  bool
	// agentBin and orchBin are the binaries TestMain built.
	agentBin, orchBin string
	// runID distinguishes this test binary's run: it prefixes every instance id
	// and tags the shell-less image.
	runID string
	// noShellImage is imported by TestMain from a tar holding only /etc.
	noShellImage string
	// dockerRT is a runtime for direct checks (Get, List, Create).
	dockerRT *docker.Runtime
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	runID = randHex(4)
	if testing.Short() {
		skipReason = "e2e tests need the Docker Engine and take minutes: skipped with -short"
		shortSkip = true
		return m.Run()
	}
	if err := dockerReachable(); err != nil {
		skipReason = "Docker Engine unreachable, skipping e2e: " + err.Error()
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "berth-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)

	t0 := time.Now()
	// As `make build` does: static, stripped.
	if err := testenv.Build(dir, "./cmd/sandbox-agent", "./cmd/orchestrator"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build:", err)
		return 1
	}
	agentBin, orchBin = filepath.Join(dir, "sandbox-agent"), filepath.Join(dir, "orchestrator")
	noShellImage = "berth-e2e/noshell:" + runID
	if err := importNoShellImage(noShellImage); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer func() { _, _ = dockerCLI(context.Background(), "rmi", "-f", noShellImage) }()
	dockerRT, err = docker.New(context.Background(), docker.Config{AgentBinary: agentBin, Logger: discardLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: docker runtime:", err)
		return 1
	}
	defer dockerRT.Close()
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: run %s: built binaries and image %s in %s\n", runID, noShellImage, time.Since(t0).Round(time.Millisecond))
	}

	code := m.Run()

	// Safety net: every test removes its own containers; anything of this
	// run still there is a leak, reported and removed.
	if n := removeRunLeftovers(); n > 0 {
		fmt.Fprintf(os.Stderr, "e2e: removed %d container(s) of this run left behind by tests\n", n)
		if code == 0 {
			code = 1
		}
	}
	// A sandbox's own state volume goes with its container; one left
	// without a container is a leak too (named by its conversation, which
	// names the test).
	if n := removeRunVolumes(); n > 0 && code == 0 {
		code = 1
	}
	// The orchestrator's default injection keeps the agent in a volume per
	// agent build; remove this run's (only this one: another test package
	// running at the same time has its own build and its own volume).
	if vol, err := docker.AgentVolumeName(agentBin); err == nil {
		if out, err := dockerCLI(context.Background(), "volume", "rm", vol); err != nil && !strings.Contains(strings.ToLower(out), "no such volume") {
			fmt.Fprintf(os.Stderr, "e2e: cleanup: remove agent volume %s: %v: %s\n", vol, err, out)
		}
	}
	return code
}

func dockerReachable() error {
	if _, err := exec.LookPath("docker"); err != nil {
		return fmt.Errorf("docker CLI not found: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := dockerCLI(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		return fmt.Errorf("docker version: %v: %s (DOCKER_HOST=%q)", err, strings.TrimSpace(out), os.Getenv("DOCKER_HOST"))
	}
	return nil
}

// importNoShellImage imports ref from a tar holding nothing but an empty
// /etc directory: no shell, no libc, nothing to run but the injected agent.
func importNoShellImage(ref string) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755, ModTime: time.Now()}); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", "import", "-", ref)
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("docker import %s: %v: %s", ref, err, out)
	}
	return nil
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func requireDocker(tb testing.TB) {
	tb.Helper()
	if shortSkip {
		tb.Skip(skipReason)
	}
	if skipReason != "" {
		testenv.SkipOrFail(tb, skipReason)
	}
}

// requireImage skips (fails with BERTH_REQUIRE_DOCKER=1) unless ref is
// present locally.
func requireImage(tb testing.TB, ref string) {
	tb.Helper()
	requireDocker(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := dockerCLI(ctx, "image", "inspect", "--format", "{{.Id}}", ref); err != nil {
		testenv.SkipOrFailf(tb, "image %s is not present: run `make images` (images/build.sh all) first", ref)
	}
}

// dockerCLI runs the docker CLI and returns its combined output.
func dockerCLI(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func mustDocker(tb testing.TB, args ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := dockerCLI(ctx, args...)
	if err != nil {
		tb.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

// containersWith lists the ids of all containers (running or not) carrying
// every label k=v given, via `docker ps`.
func containersWith(tb testing.TB, labels ...string) []string {
	tb.Helper()
	args := []string{"ps", "-aq", "--no-trunc"}
	for _, l := range labels {
		args = append(args, "--filter", "label="+l)
	}
	out := mustDocker(tb, args...)
	return strings.Fields(out)
}

// containerGone reports whether `docker inspect` says there is no such container.
func containerGone(tb testing.TB, id string) bool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := dockerCLI(ctx, "inspect", "--type", "container", "--format", "{{.State.Status}}", id)
	if err == nil {
		return false
	}
	if !strings.Contains(strings.ToLower(out), "no such") {
		tb.Fatalf("docker inspect %s: %v: %s", id, err, out)
	}
	return true
}

// goneFast reports whether the runtime no longer finds container id (one
// API round trip; for polling).
func goneFast(ctx context.Context, id string) (bool, error) {
	_, err := dockerRT.Get(ctx, id)
	if errdefs.IsNotFound(err) {
		return true, nil
	}
	return false, err
}

// removeContainers force-removes the containers carrying every label given
// and returns how many there were.
func removeContainers(labels ...string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{"ps", "-aq", "--no-trunc"}
	for _, l := range labels {
		args = append(args, "--filter", "label="+l)
	}
	out, err := dockerCLI(ctx, args...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: cleanup: docker ps: %v: %s\n", err, out)
		return 0
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return 0
	}
	if out, err := dockerCLI(ctx, append([]string{"rm", "-f", "-v"}, ids...)...); err != nil && !strings.Contains(out, "No such") {
		fmt.Fprintf(os.Stderr, "e2e: cleanup: docker rm: %v: %s\n", err, out)
	}
	return len(ids)
}

// removeRunLeftovers removes every container of this run: those of
// orchestrator instances named e2e-<runID>-* and the `docker run` baselines.
func removeRunLeftovers() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := removeContainers(runLabel + "=" + runID)
	out, err := dockerCLI(ctx, "ps", "-a", "--no-trunc", "--filter", "label="+runtime.LabelManaged+"=true",
		"--format", `{{.ID}} {{.Label "`+runtime.LabelInstance+`"}}`)
	if err != nil {
		return n
	}
	for _, line := range strings.Split(out, "\n") {
		id, inst, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && strings.HasPrefix(inst, "e2e-"+runID+"-") {
			_, _ = dockerCLI(ctx, "rm", "-f", "-v", id)
			n++
		}
	}
	return n
}

// removeRunVolumes removes the volumes of this run's orchestrators that no
// container uses, reporting each, and returns how many there were.
func removeRunVolumes() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := dockerCLI(ctx, "volume", "ls", "-q", "--filter", "dangling=true", "--filter", "label="+runtime.LabelManaged+"=true")
	if err != nil {
		return 0
	}
	n := 0
	for _, v := range strings.Fields(out) {
		desc, err := dockerCLI(ctx, "volume", "inspect", "--format",
			`{{index .Labels "`+runtime.LabelInstance+`"}} conversation={{index .Labels "`+runtime.LabelConversation+`"}} lease={{index .Labels "`+runtime.LabelLease+`"}}`, v)
		if err != nil || !strings.HasPrefix(desc, "e2e-"+runID+"-") {
			continue
		}
		fmt.Fprintf(os.Stderr, "e2e: removing volume %s left behind without its container: instance %s\n", v, strings.TrimSpace(desc))
		_, _ = dockerCLI(ctx, "volume", "rm", v)
		n++
	}
	return n
}

// newDataDir returns a fresh data directory whose instance id file is
// already written, so the instance label is known before any orchestrator
// starts; every container with that label is removed when the test ends.
func newDataDir(tb testing.TB) (dir, instance string) {
	tb.Helper()
	requireDocker(tb)
	dir = tb.TempDir()
	instance = "e2e-" + runID + "-" + randHex(4)
	if err := os.WriteFile(filepath.Join(dir, instanceFile), []byte(instance+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	// Registered before any server starts, so it runs after they stop.
	tb.Cleanup(func() {
		if n := removeContainers(runtime.LabelInstance + "=" + instance); n > 0 {
			tb.Logf("cleanup: removed %d container(s) of instance %s", n, instance)
		}
		// The egress rules of sandboxes removed behind the orchestrator's back.
		if err := egress.RemoveInstance(context.Background(), instance); err != nil {
			tb.Errorf("cleanup: egress rules of instance %s: %v", instance, err)
		}
	})
	return dir, instance
}

// testLogger returns a logger whose output is printed if the test fails
// (and streamed to stderr with BERTH_E2E_LOG=1).
func testLogger(tb testing.TB, name string) *slog.Logger {
	buf := &testenv.SyncBuffer{}
	var w io.Writer = buf
	if os.Getenv("BERTH_E2E_LOG") != "" {
		w = io.MultiWriter(buf, os.Stderr)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("--- %s log ---\n%s", name, buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})).With("orchestrator", name)
}

// api is a REST and gRPC client of one orchestrator.
type api struct {
	base string // http://host:port
	addr string // host:port
	http *http.Client
}

func newAPI(addr string) *api {
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, DisableCompression: true}
	return &api{base: "http://" + addr, addr: addr, http: &http.Client{Transport: tr, Timeout: 2 * time.Minute}}
}

func (a *api) close() { a.http.CloseIdleConnections() }

// call sends a REST request with the operator token (or token, if given)
// and returns status, headers and body. It does not need a testing.TB, so
// it can run in any goroutine.
func (a *api) call(method, path string, body any, token ...string) (int, http.Header, []byte, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return 0, nil, nil, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	tok := operatorToken
	if len(token) > 0 {
		tok = token[0]
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

func (a *api) mustCall(tb testing.TB, method, path string, body any, token ...string) (int, http.Header, []byte) {
	tb.Helper()
	code, h, b, err := a.call(method, path, body, token...)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	return code, h, b
}

var unmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}

func decode(b []byte, m proto.Message) error {
	if err := unmarshal.Unmarshal(b, m); err != nil {
		return fmt.Errorf("decode %T: %w: %s", m, err, b)
	}
	return nil
}

// acquireReq is the JSON body of POST /v1/leases.
type acquireReq struct {
	ConversationID string `json:"conversationId"`
	Image          string `json:"image,omitempty"`
	TTL            string `json:"ttl,omitempty"`
}

// acquire calls POST /v1/leases; err is set for transport errors and for a
// non-200 answer (whose status and body it names).
func (a *api) acquire(conv, image, ttl string) (*orchv1.AcquireResponse, error) {
	code, _, b, err := a.call(http.MethodPost, "/v1/leases", acquireReq{ConversationID: conv, Image: image, TTL: ttl})
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("acquire %s: HTTP %d: %s", conv, code, b)
	}
	var r orchv1.AcquireResponse
	if err := decode(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// mustAcquire acquires and checks the lease is READY with an endpoint and a token.
func (a *api) mustAcquire(tb testing.TB, conv, image, ttl string) *orchv1.AcquireResponse {
	tb.Helper()
	r, err := a.acquire(conv, image, ttl)
	if err != nil {
		tb.Fatal(err)
	}
	l := r.GetLease()
	if l.GetState() != orchv1.LeaseState_LEASE_STATE_READY || l.GetEndpoint() == "" || l.GetContainerId() == "" || r.GetToken() == "" {
		tb.Fatalf("acquire %s: want a READY lease with endpoint, container and token, got state %s endpoint %q container %q token %t",
			conv, l.GetState(), l.GetEndpoint(), l.GetContainerId(), r.GetToken() != "")
	}
	return r
}

// get calls GET /v1/leases/{id}.
func (a *api) get(tb testing.TB, id string) (*orchv1.Lease, int, []byte) {
	tb.Helper()
	code, _, b := a.mustCall(tb, http.MethodGet, "/v1/leases/"+id, nil)
	if code != http.StatusOK {
		return nil, code, b
	}
	var l orchv1.Lease
	if err := decode(b, &l); err != nil {
		tb.Fatal(err)
	}
	return &l, code, b
}

func (a *api) mustGet(tb testing.TB, id string) *orchv1.Lease {
	tb.Helper()
	l, code, b := a.get(tb, id)
	if code != http.StatusOK {
		tb.Fatalf("GET /v1/leases/%s: HTTP %d: %s", id, code, b)
	}
	return l
}

// list calls GET /v1/leases with the query (e.g. "state=LEASE_STATE_PENDING").
func (a *api) list(query string) ([]*orchv1.Lease, error) {
	code, _, b, err := a.call(http.MethodGet, "/v1/leases?"+query, nil)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("list: HTTP %d: %s", code, b)
	}
	var r orchv1.ListLeasesResponse
	if err := decode(b, &r); err != nil {
		return nil, err
	}
	return r.GetLeases(), nil
}

func (a *api) mustRelease(tb testing.TB, id string) *orchv1.Lease {
	tb.Helper()
	code, _, b := a.mustCall(tb, http.MethodDelete, "/v1/leases/"+id, nil)
	if code != http.StatusOK {
		tb.Fatalf("DELETE /v1/leases/%s: HTTP %d: %s", id, code, b)
	}
	var l orchv1.Lease
	if err := decode(b, &l); err != nil {
		tb.Fatal(err)
	}
	return &l
}

// grpcClient dials the orchestrator's gRPC API (same listener, h2c).
func (a *api) grpcClient(tb testing.TB) orchv1.LeaseServiceClient {
	tb.Helper()
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return orchv1.NewLeaseServiceClient(conn)
}

// withToken returns ctx carrying "authorization: Bearer token" for gRPC.
func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// errBody is grpc-gateway's JSON error.
type errBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func parseErr(tb testing.TB, b []byte) errBody {
	tb.Helper()
	var e errBody
	if err := json.Unmarshal(b, &e); err != nil {
		tb.Fatalf("error body is not JSON: %v: %s", err, b)
	}
	return e
}

// dockerBaseLease starts an in-process orchestrator on Docker with a new
// data dir (whose cleanup removes its containers) and acquires a berth/base
// lease named prefix plus a random suffix for ten minutes. It returns the
// orchestrator, its data dir, and the lease's id and token.
func dockerBaseLease(tb testing.TB, prefix string) (o *orch, dir, id, tok string) {
	tb.Helper()
	requireDocker(tb)
	requireImage(tb, baseImage)
	dir, _ = newDataDir(tb)
	o = startOrch(tb, dir)
	r := o.mustAcquire(tb, prefix+"-"+randHex(4), baseImage, "600s")
	return o, dir, r.GetLease().GetId(), r.GetToken()
}

// orch is an in-process orchestrator serving on 127.0.0.1:0.
type orch struct {
	*api
	srv      *orchestrator.Server
	rt       *docker.Runtime
	dataDir  string
	instance string
	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan error
}

// startOrch starts an in-process orchestrator over a real Docker runtime on
// dataDir (see newDataDir), with the operator token set; mutate adjusts the
// configuration. It is stopped (Close: sandboxes keep running) when the
// test ends, or earlier with stop.
func startOrch(tb testing.TB, dataDir string, mutate ...func(*orchestrator.Config)) *orch {
	tb.Helper()
	cfg := orchestrator.Defaults()
	cfg.DataDir = dataDir
	cfg.AgentBinary = agentBin
	cfg.OperatorToken = operatorToken
	cfg.Admission.AllowedImages = append(cfg.Admission.AllowedImages, "berth-e2e/") // the images the tests build
	for _, f := range mutate {
		f(&cfg)
	}
	log := testLogger(tb, "inproc:"+filepath.Base(dataDir))
	ctx := context.Background()
	rt, err := docker.New(ctx, docker.Config{AgentBinary: cfg.AgentBinary, Network: cfg.Network,
		Injection: docker.Injection(cfg.AgentInjection), Output: cfg.SandboxOutput(), Logger: log.With("component", "docker")})
	if err != nil {
		tb.Fatalf("docker.New: %v", err)
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
	o := &orch{api: newAPI(ln.Addr().String()), srv: srv, rt: rt, dataDir: dataDir, cancel: cancel, done: make(chan error, 1)}
	go func() { o.done <- srv.Serve(sctx, ln) }()
	b, err := os.ReadFile(filepath.Join(dataDir, instanceFile))
	if err != nil {
		tb.Fatal(err)
	}
	o.instance = strings.TrimSpace(string(b))
	tb.Cleanup(func() { o.stop(tb) })
	return o
}

// stop shuts the server down and closes it; its sandboxes keep running.
func (o *orch) stop(tb testing.TB) {
	o.stopOnce.Do(func() {
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

// agentToken is the token the sandbox agent of lease id requires.
func (o *orch) agentToken(id string) string { return o.srv.Manager().Tokens().AgentToken(id) }

// agentTokens returns the agent-token function of the orchestrator whose
// data dir is dataDir (for subprocess orchestrators): lease.Tokens on the
// same server secret derive the same tokens.
func agentTokens(tb testing.TB, dataDir string) func(id string) string {
	tb.Helper()
	secret, err := os.ReadFile(filepath.Join(dataDir, lease.SecretFileName))
	if err != nil {
		tb.Fatalf("server secret: %v", err)
	}
	tk, err := lease.NewTokens(secret)
	if err != nil {
		tb.Fatal(err)
	}
	return tk.AgentToken
}

// execResult is the agent's answer to POST /v1/exec.
type execResult struct {
	ExitCode int    `json:"exitCode"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timedOut"`
}

var agentHTTP = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: time.Minute}

// agentExec runs argv through the agent at endpoint (POST /v1/exec) and
// returns the HTTP status with the decoded result.
func agentExec(endpoint, token string, argv ...string) (int, execResult, error) {
	body, _ := json.Marshal(map[string]any{"argv": argv, "timeout": "30s"})
	req, err := http.NewRequest(http.MethodPost, "http://"+endpoint+"/v1/exec", bytes.NewReader(body))
	if err != nil {
		return 0, execResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := agentHTTP.Do(req)
	if err != nil {
		return 0, execResult{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, execResult{}, err
	}
	var r execResult
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &r); err != nil {
			return resp.StatusCode, r, fmt.Errorf("decode exec response: %w: %s", err, b)
		}
	} else {
		r.Stderr = string(b)
	}
	return resp.StatusCode, r, nil
}

// mustExec runs argv through the agent and requires HTTP 200 and exit code 0.
func mustExec(tb testing.TB, endpoint, token string, argv ...string) execResult {
	tb.Helper()
	code, r, err := agentExec(endpoint, token, argv...)
	if err != nil {
		tb.Fatalf("exec %q at %s: %v", argv, endpoint, err)
	}
	if code != http.StatusOK || r.ExitCode != 0 {
		tb.Fatalf("exec %q at %s: HTTP %d, exit %d, stdout %q, stderr %q", argv, endpoint, code, r.ExitCode, r.Stdout, r.Stderr)
	}
	return r
}

// agentVersionArgv runs the injected agent binary itself: it works in any
// image, even one without a shell.
var agentVersionArgv = []string{runtime.AgentPath, "--version"}

// eventually polls cond every interval until it returns true or timeout
// passes, and reports whether it did.
func eventually(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// freeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// proc is an `orchestrator serve` subprocess.
type proc struct {
	*api
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	logPath string
}

// hermeticEnv is the environment for the binaries the tests run: this
// process's, without BERTH_* variables a developer may have set (DOCKER_HOST
// and the like stay: they name the engine under test).
func hermeticEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BERTH_") {
			env = append(env, kv)
		}
	}
	return env
}

// startProc runs `orchestrator serve --listen addr --data-dir dataDir
// --agent-binary <built agent>` with BERTH_OPERATOR_TOKEN set and waits
// until /healthz answers. It is stopped (SIGTERM, then SIGKILL) when the
// test ends.
func startProc(tb testing.TB, dataDir, addr string, env ...string) *proc {
	tb.Helper()
	logf, err := os.CreateTemp(tb.TempDir(), "orchestrator-*.log")
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(orchBin, "serve", "--listen", addr, "--data-dir", dataDir, "--agent-binary", agentBin, "--log-level", "debug")
	// The e2e images (berth-e2e/…) are allowed beside berth's own; env given
	// by the caller comes later and wins.
	cmd.Env = append(hermeticEnv(), "BERTH_OPERATOR_TOKEN="+operatorToken, "BERTH_ALLOWED_IMAGES=berth/,berth-e2e/")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatal(err)
	}
	p := &proc{api: newAPI(addr), cmd: cmd, done: make(chan struct{}), logPath: logf.Name()}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	tb.Cleanup(func() {
		p.stop()
		if tb.Failed() {
			b, _ := os.ReadFile(p.logPath)
			tb.Logf("--- orchestrator pid %d log ---\n%s", cmd.Process.Pid, b)
		}
	})
	ok := eventually(30*time.Second, 20*time.Millisecond, func() bool {
		select {
		case <-p.done:
			return true
		default:
		}
		code, _, _, err := p.call(http.MethodGet, "/healthz", nil, "")
		return err == nil && code == http.StatusOK
	})
	select {
	case <-p.done:
		b, _ := os.ReadFile(p.logPath)
		tb.Fatalf("orchestrator exited at start: %v\n%s", p.waitErr, b)
	default:
	}
	if !ok {
		tb.Fatalf("orchestrator at %s not healthy within 30s", addr)
	}
	return p
}

// kill9 SIGKILLs the process and waits for it.
func (p *proc) kill9(tb testing.TB) {
	tb.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Fatalf("kill -9 %d: %v", p.cmd.Process.Pid, err)
	}
	<-p.done
	p.api.close()
}

// stop sends SIGTERM, waits up to 20s, then SIGKILLs. Idempotent.
func (p *proc) stop() {
	p.api.close()
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// percentile returns the p-th percentile (0..100, nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
