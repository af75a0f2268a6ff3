// Package conformance is the test suite every berth runtime backend must
// pass. A backend's tests call Run with a constructor and the images to use:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(t *testing.T) runtime.Runtime { return newBackend(t) },
//			conformance.Images{Empty: "berth-test/empty:latest", Shell: "berth/minimal:latest"},
//			conformance.WithKill(kill))
//	}
//
// The suite checks what the lease manager and the proxy rely on: any image
// works (even one with no files at all, since the agent is injected), the
// agent answers /healthz without auth and everything else only with the token,
// labels and selectors, hardening (no-new-privileges, reduced capabilities,
// limits, sandboxes unable to reach each other), the life cycle (stop,
// remove, restart; pause and resume when the runtime implements
// runtime.Freezer), Watch, and clean failures that leave nothing behind.
//
// Every sandbox the suite creates carries a per-run instance label; the suite
// removes them all in t.Cleanup, even when a test fails.
//
// A check whose optional input was not given (Images.Shell, Images.BadUser,
// WithKill, WithUnmanaged) skips, or fails when BERTH_REQUIRE_DOCKER=1 (see
// internal/testsupport/testenv): every caller in this repository gives them all.
// A backend that cannot keep a promise on its platform declares it
// (Limited, limitations.go): exactly that promise's checks are left out.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/agent/statefile"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Images names the locally present images the suite creates sandboxes from.
type Images struct {
	// Empty is an image with no files at all (e.g. `docker import` of an
	// empty tar). Required.
	Empty string
	// Shell is an image with /bin/sh and basic tools (coreutils or busybox,
	// and one of bash, busybox nc or python3 for the isolation check).
	// Optional: the hardening, limits and isolation checks are skipped
	// without it.
	Shell string
	// BadUser is an image whose configured user does not exist, so its
	// container cannot start. Optional.
	BadUser string
}

// Option tunes the suite.
type Option func(*options)

type options struct {
	kill          func(ctx context.Context, id string) error
	readyTimeout  time.Duration
	failureOutput bool
	unmanaged     func(t *testing.T, image string) (id string, exists func() bool)
}

// WithKill gives the suite a way to SIGKILL a sandbox's container behind the
// runtime's back (e.g. `docker kill`), to check that Watch reports the death
// with exit code 137. Without it that check is skipped.
func WithKill(fn func(ctx context.Context, id string) error) Option {
	return func(o *options) { o.kill = fn }
}

// WithFailureOutput makes the suite require the sandbox's last output lines
// in the error of a Create whose agent exited at once (a backend that
// reads them from the engine always has them; one that reads a log file
// written asynchronously may not yet).
func WithFailureOutput() Option {
	return func(o *options) { o.failureOutput = true }
}

// WithReadyTimeout sets Spec.ReadyTimeout of the sandboxes the suite creates.
// Default 60s (generous, for loaded CI machines).
func WithReadyTimeout(d time.Duration) Option {
	return func(o *options) { o.readyTimeout = d }
}

// Capabilities a sandbox must never have in its effective or bounding set.
var forbiddenCaps = map[int]string{
	12: "CAP_NET_ADMIN",
	13: "CAP_NET_RAW",
	16: "CAP_SYS_MODULE",
	17: "CAP_SYS_RAWIO",
	19: "CAP_SYS_PTRACE",
	21: "CAP_SYS_ADMIN",
	22: "CAP_SYS_BOOT",
	25: "CAP_SYS_TIME",
	27: "CAP_MKNOD",
}

type suite struct {
	rt       runtime.Runtime
	images   Images
	opts     options
	runID    string
	instance string
	seq      atomic.Int64
	http     *http.Client
}

// Run runs the conformance suite against the runtime newRuntime returns
// (called once; the runtime is shared by the parallel subtests).
func Run(t *testing.T, newRuntime func(t *testing.T) runtime.Runtime, images Images, opts ...Option) {
	if images.Empty == "" {
		t.Fatal("conformance: Images.Empty is required")
	}
	s := &suite{images: images, opts: options{readyTimeout: 60 * time.Second}}
	for _, o := range opts {
		o(&s.opts)
	}
	s.runID = randomHex(4)
	s.instance = "conformance-" + s.runID
	s.http = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	s.rt = newRuntime(t)

	ctx := context.Background()
	if err := s.rt.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// Registered first, so it runs last: after every subtest's own cleanup.
	t.Cleanup(func() { s.removeAll(t) })

	t.Run("group", func(t *testing.T) {
		t.Run("EmptyImage", s.testEmptyImage)
		t.Run("ListSelector", s.testList)
		t.Run("Concurrent", s.testConcurrent)
		t.Run("DuplicateLease", s.testDuplicateLease)
		t.Run("Env", s.testEnv)
		t.Run("Hardening", s.testHardening)
		t.Run("Limits", s.testLimits)
		t.Run("Isolation", s.testIsolation)
		t.Run("HostListeners", s.testHostListeners)
		t.Run("StopRemove", s.testStopRemove)
		t.Run("PauseResume", s.testPauseResume)
		t.Run("StatsLogs", s.testStatsLogs) // stats.go
		t.Run("Mounts", s.testMounts)
		t.Run("Pool", s.testPool) // pool.go
		t.Run("Snapshot", s.testSnapshot)
		t.Run("WatchDied", s.testWatch)
		t.Run("RestartInPlace", s.testRestart)
		t.Run("MissingImage", s.testMissingImage)
		t.Run("InvalidReference", s.testInvalidReference)
		t.Run("InvalidSpec", s.testInvalidSpec)
		t.Run("ReadyTimeout", s.testReadyTimeout)
		t.Run("ReadyTimeoutError", s.testReadyTimeoutError)
		t.Run("EarlyExit", s.testEarlyExit)
		t.Run("BadUser", s.testBadUser)
		t.Run("Unmanaged", s.testUnmanaged)
	})
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// removeAll removes every sandbox of this run (the instance label).
func (s *suite) removeAll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	list, err := s.rt.List(ctx, runtime.Selector{runtime.LabelInstance: s.instance})
	if err != nil {
		t.Errorf("cleanup: List: %v", err)
		return
	}
	for _, sb := range list {
		if err := s.rt.Remove(ctx, sb.ID); err != nil {
			t.Errorf("cleanup: Remove %s: %v", sb.ID, err)
		}
	}
}

// spec returns a spec for a new sandbox of this run with a unique lease id.
func (s *suite) spec(image string) runtime.Spec {
	n := s.seq.Add(1)
	return runtime.Spec{
		LeaseID:        fmt.Sprintf("conf-%s-%d", s.runID, n),
		ConversationID: fmt.Sprintf("conv-%s-%d", s.runID, n),
		InstanceID:     s.instance,
		Image:          image,
		AgentToken:     "tok-" + randomHex(16),
		Labels:         map[string]string{"suite": s.runID},
		ReadyTimeout:   s.opts.readyTimeout,
	}
}

// create creates a sandbox and registers its removal.
func (s *suite) create(t *testing.T, spec runtime.Spec) runtime.Sandbox {
	t.Helper()
	began := time.Now()
	sb, err := s.rt.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.Image, err)
	}
	t.Logf("Create(%s) = %s at %s in %s", spec.Image, shortID(sb.ID), sb.Endpoint, time.Since(began).Round(time.Millisecond))
	s.removeOnCleanup(t, sb.ID)
	return sb
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func (s *suite) needShell(t *testing.T) {
	t.Helper()
	if s.images.Shell == "" {
		testenv.SkipOrFail(t, "no shell image given (Images.Shell); skipping")
	}
}

// call sends body as JSON to the agent and returns the status and body.
func (s *suite) call(t *testing.T, method, url, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	contentType := ""
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd, contentType = bytes.NewReader(b), "application/json"
	}
	return s.send(t, method, url, token, contentType, rd)
}

// send sends one request (contentType set when not empty) and returns the
// status and the whole body.
func (s *suite) send(t *testing.T, method, url, token, contentType string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, b
}

// execResult is the part of the agent's exec response the suite reads.
type execResult struct {
	ExitCode int    `json:"exitCode"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timedOut"`
}

// exec runs a command through the agent's REST API.
func (s *suite) exec(t *testing.T, sb runtime.Sandbox, token string, req map[string]any) execResult {
	t.Helper()
	code, body := s.call(t, http.MethodPost, "http://"+sb.Endpoint+"/v1/exec", token, req)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/exec %v: HTTP %d: %s", req, code, body)
	}
	var res execResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatalf("POST /v1/exec: decode %s: %v", body, err)
	}
	return res
}

// sh runs a shell line and fails the test unless it exits 0.
func (s *suite) sh(t *testing.T, sb runtime.Sandbox, token, line string) string {
	t.Helper()
	res := s.exec(t, sb, token, map[string]any{"command": line, "timeout": "30s"})
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d\nstdout: %s\nstderr: %s", line, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

func (s *suite) healthz(sb runtime.Sandbox, timeout time.Duration) error {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := c.Get("http://" + sb.Endpoint + "/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s", resp.Status)
	}
	return nil
}

// assertNothingLeft fails unless no sandbox of lease exists.
func (s *suite) assertNothingLeft(t *testing.T, leaseID string) {
	t.Helper()
	list, err := s.rt.List(context.Background(), runtime.Selector{runtime.LabelLease: leaseID})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != 0 {
		t.Errorf("a failed Create left %d container(s) behind: %+v", len(list), list)
	}
}

func (s *suite) testEmptyImage(t *testing.T) {
	t.Parallel()
	spec := s.spec(s.images.Empty)
	spec.Labels["color"] = "blue"
	sb := s.create(t, spec)

	if sb.ID == "" || sb.Endpoint == "" {
		t.Fatalf("Create returned no id or endpoint: %+v", sb)
	}
	if _, _, err := net.SplitHostPort(sb.Endpoint); err != nil {
		t.Fatalf("Endpoint %q is not host:port: %v", sb.Endpoint, err)
	}
	if sb.State != runtime.StateRunning {
		t.Errorf("State = %q, want running", sb.State)
	}
	// StateDir, where a backend reports one, is the agent's state
	// directory on this host: the agent's empty state file and its marker
	// are there, so a claim can configure it through the file.
	if sb.StateDir != "" && !statefile.Usable(sb.StateDir) {
		t.Errorf("StateDir %s holds no empty agent state file with its marker", sb.StateDir)
	}
	if sb.LeaseID != spec.LeaseID || sb.ConversationID != spec.ConversationID || sb.InstanceID != spec.InstanceID {
		t.Errorf("ids = %q/%q/%q, want %q/%q/%q", sb.LeaseID, sb.ConversationID, sb.InstanceID, spec.LeaseID, spec.ConversationID, spec.InstanceID)
	}
	wantLabels := map[string]string{
		runtime.LabelManaged:              "true",
		runtime.LabelLease:                spec.LeaseID,
		runtime.LabelConversation:         spec.ConversationID,
		runtime.LabelInstance:             spec.InstanceID,
		runtime.LabelUserPrefix + "color": "blue",
		runtime.LabelUserPrefix + "suite": s.runID,
	}
	for k, v := range wantLabels {
		if got := sb.Labels[k]; got != v {
			t.Errorf("label %s = %q, want %q", k, got, v)
		}
	}

	// Health needs no auth; everything else needs the token.
	if err := s.healthz(sb, 5*time.Second); err != nil {
		t.Errorf("GET /healthz without auth: %v", err)
	}
	infoURL := "http://" + sb.Endpoint + "/v1/info"
	if code, body := s.call(t, http.MethodGet, infoURL, "", nil); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/info without token: HTTP %d, want 401: %s", code, body)
	}
	if code, body := s.call(t, http.MethodGet, infoURL, "wrong-"+spec.AgentToken, nil); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/info with a wrong token: HTTP %d, want 401: %s", code, body)
	}
	if code, body := s.call(t, http.MethodGet, infoURL, spec.AgentToken, nil); code != http.StatusOK {
		t.Errorf("GET /v1/info with the token: HTTP %d, want 200: %s", code, body)
	}

	// The agent itself is the only program in the image.
	res := s.exec(t, sb, spec.AgentToken, map[string]any{"argv": []string{"/.berth/sandbox-agent", "--version"}})
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) == "" {
		t.Errorf("exec sandbox-agent --version: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}

	got, err := s.rt.Get(context.Background(), sb.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.ID != sb.ID || got.Endpoint != sb.Endpoint || got.LeaseID != spec.LeaseID || got.State != runtime.StateRunning {
		t.Errorf("Get = %+v\nwant id %s endpoint %s lease %s running", got, sb.ID, sb.Endpoint, spec.LeaseID)
	}
	if got.Labels[runtime.LabelUserPrefix+"color"] != "blue" {
		t.Errorf("Get: user label missing: %v", got.Labels)
	}
	if got.CreatedAt.IsZero() || time.Since(got.CreatedAt) > time.Hour {
		t.Errorf("Get: CreatedAt = %v", got.CreatedAt)
	}
}

func (s *suite) testList(t *testing.T) {
	t.Parallel()
	tag := randomHex(4)
	specA, specB := s.spec(s.images.Empty), s.spec(s.images.Empty)
	specA.Labels["list"], specB.Labels["list"] = tag, tag
	specA.Labels["which"], specB.Labels["which"] = "a", "b"
	var a, b runtime.Sandbox
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a = s.createNoFatal(t, specA) }()
	go func() { defer wg.Done(); b = s.createNoFatal(t, specB) }()
	wg.Wait()
	if a.ID == "" || b.ID == "" {
		t.FailNow()
	}
	ctx := context.Background()
	ids := func(sel runtime.Selector) []string {
		t.Helper()
		list, err := s.rt.List(ctx, sel)
		if err != nil {
			t.Fatalf("List(%v): %v", sel, err)
		}
		var out []string
		for _, sb := range list {
			out = append(out, sb.ID)
		}
		return out
	}
	if got := ids(runtime.Selector{runtime.LabelLease: specA.LeaseID}); len(got) != 1 || got[0] != a.ID {
		t.Errorf("List(lease A) = %v, want only %s", got, a.ID)
	}
	if got := ids(runtime.Selector{runtime.LabelUserPrefix + "list": tag, runtime.LabelUserPrefix + "which": "b"}); len(got) != 1 || got[0] != b.ID {
		t.Errorf("List(list=tag, which=b) = %v, want only %s", got, b.ID)
	}
	if got := ids(runtime.Selector{runtime.LabelUserPrefix + "list": tag}); len(got) != 2 {
		t.Errorf("List(list=tag) = %v, want both %s and %s", got, a.ID, b.ID)
	}
	if got := ids(runtime.Selector{runtime.LabelUserPrefix + "list": "no-such-" + tag}); len(got) != 0 {
		t.Errorf("List(no match) = %v, want none", got)
	}
	all := ids(nil)
	found := 0
	for _, id := range all {
		if id == a.ID || id == b.ID {
			found++
		}
	}
	if found != 2 {
		t.Errorf("List(nil) = %v does not include both %s and %s", all, a.ID, b.ID)
	}
	// Listed sandboxes carry their endpoint and ids like Get's.
	list, err := s.rt.List(ctx, runtime.Selector{runtime.LabelLease: specA.LeaseID})
	if err != nil || len(list) != 1 {
		t.Fatalf("List: %v %v", list, err)
	}
	if l := list[0]; l.Endpoint != a.Endpoint || l.LeaseID != specA.LeaseID || l.ConversationID != specA.ConversationID || l.State != runtime.StateRunning {
		t.Errorf("List entry = %+v, want endpoint %s, lease %s, running", l, a.Endpoint, specA.LeaseID)
	}
}

// createNoFatal is create for use in goroutines: it reports with t.Error.
func (s *suite) createNoFatal(t *testing.T, spec runtime.Spec) runtime.Sandbox {
	sb, err := s.rt.Create(context.Background(), spec)
	if err != nil {
		t.Errorf("Create(%s): %v", spec.LeaseID, err)
		return runtime.Sandbox{}
	}
	s.removeOnCleanup(t, sb.ID)
	return sb
}

func (s *suite) testConcurrent(t *testing.T) {
	t.Parallel()
	const n = 4
	sbs := make([]runtime.Sandbox, n)
	specs := make([]runtime.Spec, n)
	var wg sync.WaitGroup
	for i := range n {
		specs[i] = s.spec(s.images.Empty)
		wg.Add(1)
		go func() { defer wg.Done(); sbs[i] = s.createNoFatal(t, specs[i]) }()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, sb := range sbs {
		if sb.ID == "" {
			continue
		}
		if seen[sb.Endpoint] {
			t.Errorf("endpoint %s handed out twice", sb.Endpoint)
		}
		seen[sb.Endpoint] = true
		if code, body := s.call(t, http.MethodGet, "http://"+sb.Endpoint+"/v1/info", specs[i].AgentToken, nil); code != http.StatusOK {
			t.Errorf("sandbox %d: /v1/info: HTTP %d: %s", i, code, body)
		}
		// Each agent accepts only its own token.
		other := specs[(i+1)%n].AgentToken
		if code, _ := s.call(t, http.MethodGet, "http://"+sb.Endpoint+"/v1/info", other, nil); code != http.StatusUnauthorized {
			t.Errorf("sandbox %d accepted another sandbox's token: HTTP %d", i, code)
		}
	}
}

func (s *suite) testDuplicateLease(t *testing.T) {
	t.Parallel()
	spec := s.spec(s.images.Empty)
	sb := s.create(t, spec)
	_, err := s.rt.Create(context.Background(), spec)
	if err == nil {
		t.Fatal("a second Create for the same lease succeeded; want ErrAlreadyExists")
	}
	if !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Create: %v; want ErrAlreadyExists", err)
	}
	// The first sandbox is untouched.
	if err := s.healthz(sb, 5*time.Second); err != nil {
		t.Errorf("first sandbox after duplicate Create: %v", err)
	}
}

func (s *suite) testEnv(t *testing.T) {
	t.Parallel()
	s.needShell(t)
	spec := s.spec(s.images.Shell)
	spec.Env = map[string]string{"BERTH_CONFORMANCE": "yes it is", "PATH_EXTRA": "x"}
	sb := s.create(t, spec)
	out := s.sh(t, sb, spec.AgentToken, `echo "$BERTH_CONFORMANCE|$PATH|${BERTH_AGENT_TOKEN:-none}"; pwd`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("unexpected output %q", out)
	}
	parts := strings.Split(lines[0], "|")
	if len(parts) != 3 || parts[0] != "yes it is" {
		t.Errorf("Spec.Env not applied: %q", lines[0])
	}
	if len(parts) == 3 && parts[1] == "" {
		t.Errorf("the image's PATH was lost: %q", lines[0])
	}
	if len(parts) == 3 && parts[2] != "none" {
		t.Errorf("commands see BERTH_AGENT_TOKEN=%q", parts[2])
	}
	if !strings.HasPrefix(lines[1], "/") {
		t.Errorf("pwd = %q", lines[1])
	}
	// The working directory is writable by the image's user.
	s.sh(t, sb, spec.AgentToken, `echo hi > ./conformance.txt && cat ./conformance.txt`)
}

// parseStatus returns the fields of /proc/self/status text.
func parseStatus(text string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

func (s *suite) testHardening(t *testing.T) {
	t.Parallel()
	s.needShell(t)
	spec := s.spec(s.images.Shell)
	sb := s.create(t, spec)
	out := s.sh(t, sb, spec.AgentToken, `id -u; cat /proc/self/status`)
	uid, status, _ := strings.Cut(out, "\n")
	t.Logf("uid %s", strings.TrimSpace(uid))
	st := parseStatus(status)
	if st["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs = %q, want 1 (no-new-privileges)", st["NoNewPrivs"])
	}
	for _, field := range []string{"CapEff", "CapBnd", "CapPrm"} {
		v, err := strconv.ParseUint(st[field], 16, 64)
		if err != nil {
			t.Errorf("%s = %q: %v", field, st[field], err)
			continue
		}
		t.Logf("%s = %016x", field, v)
		for bit, name := range forbiddenCaps {
			if v&(1<<bit) != 0 {
				t.Errorf("%s includes %s", field, name)
			}
		}
	}
	// The agent (PID 1) has the same restrictions as the commands it runs.
	out = s.sh(t, sb, spec.AgentToken, `cat /proc/1/status`)
	if st := parseStatus(out); st["NoNewPrivs"] != "1" {
		t.Errorf("PID 1: NoNewPrivs = %q, want 1", st["NoNewPrivs"])
	}
	// A raw socket needs CAP_NET_RAW, which is dropped.
	res := s.exec(t, sb, spec.AgentToken, map[string]any{"command": `command -v ping >/dev/null || exit 77; ping -c 1 -W 1 127.0.0.1`, "timeout": "10s"})
	if res.ExitCode == 0 {
		t.Logf("note: ping works (unprivileged ICMP sockets allowed by net.ipv4.ping_group_range): %s", res.Stdout)
	}
}

func (s *suite) testLimits(t *testing.T) {
	t.Parallel()
	s.needShell(t)
	spec := s.spec(s.images.Shell)
	spec.Resources = runtime.Resources{NanoCPUs: 500_000_000, MemoryBytes: 256 << 20, PidsLimit: 100}
	sb := s.create(t, spec)
	out := s.sh(t, sb, spec.AgentToken, `
if [ -f /sys/fs/cgroup/memory.max ]; then
  echo "mem $(cat /sys/fs/cgroup/memory.max)"
  echo "swap $(cat /sys/fs/cgroup/memory.swap.max 2>/dev/null || echo 0)"
  echo "pids $(cat /sys/fs/cgroup/pids.max)"
  echo "cpu $(cat /sys/fs/cgroup/cpu.max)"
else
  m=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
  ms=$(cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null || echo "$m")
  echo "mem $m"
  echo "swap $((ms - m))"
  echo "pids $(cat /sys/fs/cgroup/pids/pids.max)"
  echo "cpu $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
fi`)
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		got[k] = strings.TrimSpace(v)
	}
	if got["mem"] != strconv.Itoa(256<<20) {
		t.Errorf("memory limit = %q, want %d", got["mem"], 256<<20)
	}
	if got["swap"] != "0" {
		t.Errorf("swap limit = %q, want 0 (no swap)", got["swap"])
	}
	if got["pids"] != "100" && !s.lacks(t, LimitPids) {
		t.Errorf("pids limit = %q, want 100", got["pids"])
	}
	var quota, period float64
	if _, err := fmt.Sscanf(got["cpu"], "%g %g", &quota, &period); err != nil || period == 0 || quota/period != 0.5 {
		t.Errorf("cpu quota = %q, want half a CPU", got["cpu"])
	}
}

// probeScript exits 0 when a TCP connection to $1:$2 succeeds, 1 when it
// fails, 77 when the image has no tool to try.
const probeScript = `
h=$1; p=$2
if command -v bash >/dev/null 2>&1; then
  exec timeout 3 bash -c 'exec 3<>/dev/tcp/'"$h/$p" 2>/dev/null
elif command -v python3 >/dev/null 2>&1; then
  exec python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)' "$h" "$p" 2>/dev/null
elif command -v nc >/dev/null 2>&1; then
  # busybox nc: -e takes the rest of the line, so it comes last
  exec nc -w 3 "$h" "$p" -e true </dev/null 2>/dev/null
fi
exit 77`

func (s *suite) probe(t *testing.T, from runtime.Sandbox, token, hostPort string) int {
	t.Helper()
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Fatal(err)
	}
	res := s.exec(t, from, token, map[string]any{
		"argv":    []string{"/bin/sh", "-c", probeScript, "probe", host, port},
		"timeout": "20s",
	})
	return res.ExitCode
}

func (s *suite) testIsolation(t *testing.T) {
	t.Parallel()
	s.needShell(t)
	specA, specB := s.spec(s.images.Shell), s.spec(s.images.Shell)
	a := s.create(t, specA)
	b := s.create(t, specB)

	// Control: from A, A's own agent is reachable (so the tool works).
	s.controlProbe(t, a, specA.AgentToken)
	// From the host, B is reachable…
	if err := s.healthz(b, 5*time.Second); err != nil {
		t.Fatalf("host cannot reach sandbox B: %v", err)
	}
	// …but not from A.
	if code := s.probe(t, a, specA.AgentToken, b.Endpoint); code == 0 {
		t.Errorf("sandbox A reached sandbox B's agent at %s; sandboxes must not reach each other", b.Endpoint)
	}
}

// hostListener listens on addr (port 0) and counts the connections it gets.
func hostListener(t *testing.T, addr string) (net.Listener, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln, &n
}

// testHostListeners checks that a sandbox cannot reach services listening
// on the host: neither one bound to 0.0.0.0 (through the bridge's gateway
// address or any other address of the host) nor one bound to the gateway
// address itself, while the host still reaches the sandbox's agent.
func (s *suite) testHostListeners(t *testing.T) {
	t.Parallel()
	s.needShell(t)
	spec := s.spec(s.images.Shell)
	sb := s.create(t, spec)
	s.controlProbe(t, sb, spec.AgentToken)
	host, _, err := net.SplitHostPort(sb.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	sbIP := net.ParseIP(host)
	// The gateway is the host's address on the sandbox's subnet; the
	// others are the host's remaining IPv4 addresses (bridges, LAN).
	var gateway net.IP
	var others []net.IP
	ifaces, _ := net.Interfaces()
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.To4() == nil {
				continue
			}
			if ipn.Contains(sbIP) {
				gateway = ipn.IP
			} else {
				others = append(others, ipn.IP)
			}
		}
	}
	if gateway == nil {
		testenv.SkipOrFailf(t, "no address of this host is on the sandbox's subnet (%s): the sandboxes run elsewhere", sbIP)
	}
	all, nAll := hostListener(t, "0.0.0.0:0")
	gw, nGw := hostListener(t, net.JoinHostPort(gateway.String(), "0"))
	allPort := strconv.Itoa(all.Addr().(*net.TCPAddr).Port)
	targets := []string{net.JoinHostPort(gateway.String(), allPort), gw.Addr().String()}
	if len(others) > 3 {
		others = others[:3]
	}
	for _, ip := range others {
		targets = append(targets, net.JoinHostPort(ip.String(), allPort))
	}
	// Control: the listeners work from the host.
	for _, a := range targets {
		c, err := net.DialTimeout("tcp", a, 3*time.Second)
		if err != nil {
			t.Fatalf("control: the host cannot reach its own listener %s: %v", a, err)
		}
		c.Close()
	}
	// Wait until the listeners have counted the control connections.
	want := int64(len(targets))
	for deadline := time.Now().Add(5 * time.Second); nAll.Load()+nGw.Load() < want && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	before := nAll.Load() + nGw.Load()
	if before != want {
		t.Fatalf("control: the listeners counted %d connections, want %d", before, want)
	}
	for _, a := range targets {
		if code := s.probe(t, sb, spec.AgentToken, a); code == 0 {
			t.Errorf("the sandbox (%s) reached the host's listener at %s", sbIP, a)
		} else {
			t.Logf("sandbox -> host %s: refused or dropped (exit %d)", a, code)
		}
	}
	if n := nAll.Load() + nGw.Load() - before; n != 0 {
		t.Errorf("the host's listeners accepted %d connections from the sandbox", n)
	}
	// The host still reaches the sandbox (host -> sandbox is OUTPUT, and
	// the sandbox's replies are ESTABLISHED on INPUT).
	if err := s.healthz(sb, 5*time.Second); err != nil {
		t.Errorf("the host cannot reach the sandbox's agent any more: %v", err)
	}
}

func (s *suite) testStopRemove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	spec := s.spec(s.images.Empty)
	sb := s.create(t, spec)
	began := time.Now()
	if err := s.rt.Stop(ctx, sb.ID, 5*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	t.Logf("Stop took %s", time.Since(began).Round(time.Millisecond))
	got, err := s.rt.Get(ctx, sb.ID)
	if err != nil {
		t.Fatalf("Get after Stop: %v", err)
	}
	if got.State != runtime.StateExited {
		t.Errorf("State after Stop = %q, want exited", got.State)
	}
	if got.Endpoint != "" {
		t.Errorf("Endpoint after Stop = %q, want empty", got.Endpoint)
	}
	if err := s.rt.Stop(ctx, sb.ID, time.Second); err != nil {
		t.Errorf("Stop of a stopped sandbox: %v", err)
	}
	if err := s.rt.Remove(ctx, sb.ID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := s.rt.Remove(ctx, sb.ID); err != nil {
		t.Errorf("second Remove: %v, want nil", err)
	}
	if _, err := s.rt.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Errorf("Get after Remove: %v, want ErrNotFound", err)
	}
	if err := s.rt.Stop(ctx, sb.ID, time.Second); !errdefs.IsNotFound(err) {
		t.Errorf("Stop after Remove: %v, want ErrNotFound", err)
	}
	s.assertNothingLeft(t, spec.LeaseID)

	// Remove of a running sandbox.
	spec2 := s.spec(s.images.Empty)
	sb2 := s.create(t, spec2)
	if err := s.rt.Remove(ctx, sb2.ID); err != nil {
		t.Fatalf("Remove running: %v", err)
	}
	s.assertNothingLeft(t, spec2.LeaseID)
	if _, err := s.rt.Get(ctx, "berth-conformance-no-such-container"); !errdefs.IsNotFound(err) {
		t.Errorf("Get of a missing container: %v, want ErrNotFound", err)
	}
}

func (s *suite) testWatch(t *testing.T) {
	t.Parallel()
	if s.opts.kill == nil {
		testenv.SkipOrFail(t, "no kill hook given (WithKill); skipping")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := s.rt.Watch(ctx)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	spec := s.spec(s.images.Empty)
	sb := s.create(t, spec)
	if err := s.opts.kill(ctx, sb.ID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	wait := func(kind runtime.EventKind) runtime.Event {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("Watch channel closed while waiting for %s", kind)
				}
				if ev.ID == sb.ID && ev.Kind == kind {
					return ev
				}
			case <-timeout:
				t.Fatalf("no %s event for %s within 30s", kind, sb.ID)
			}
		}
	}
	died := wait(runtime.EventDied)
	if died.ExitCode != 137 {
		t.Errorf("died event ExitCode = %d, want 137 (SIGKILL)", died.ExitCode)
	}
	if died.LeaseID != spec.LeaseID {
		t.Errorf("died event LeaseID = %q, want %q", died.LeaseID, spec.LeaseID)
	}
	if died.At.IsZero() {
		t.Error("died event has no time")
	}
	got, err := s.rt.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != runtime.StateExited || got.ExitCode != 137 {
		t.Errorf("Get after kill: state %q exit %d, want exited 137", got.State, got.ExitCode)
	}
	if err := s.rt.Remove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	wait(runtime.EventRemoved)

	// The channel closes when the context ends.
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("Watch channel not closed 10s after its context ended")
		}
	}
}

func (s *suite) testMissingImage(t *testing.T) {
	t.Parallel()
	spec := s.spec("berth-conformance/no-such-image:" + s.runID)
	_, err := s.rt.Create(context.Background(), spec)
	if !errdefs.IsNotFound(err) {
		t.Fatalf("Create of a missing image: %v, want ErrNotFound", err)
	}
	if !strings.Contains(err.Error(), "make images") || !strings.Contains(err.Error(), spec.Image) {
		t.Errorf("error %q should name the image and mention `make images`", err)
	}
	s.assertNothingLeft(t, spec.LeaseID)
}

func (s *suite) testInvalidReference(t *testing.T) {
	t.Parallel()
	spec := s.spec("Not A Valid//Reference!")
	_, err := s.rt.Create(context.Background(), spec)
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Create with an invalid reference: %v, want ErrInvalidArgument", err)
	}
	if !strings.Contains(err.Error(), "image") {
		t.Errorf("error %q should name the image field", err)
	}
	s.assertNothingLeft(t, spec.LeaseID)
}

func (s *suite) testInvalidSpec(t *testing.T) {
	t.Parallel()
	cases := map[string]func(*runtime.Spec){
		"no lease":       func(sp *runtime.Spec) { sp.LeaseID = "" },
		"no token":       func(sp *runtime.Spec) { sp.AgentToken = "" },
		"no image":       func(sp *runtime.Spec) { sp.Image = "" },
		"negative mem":   func(sp *runtime.Spec) { sp.Resources.MemoryBytes = -1 },
		"reserved env":   func(sp *runtime.Spec) { sp.Env = map[string]string{"BERTH_AGENT_TOKEN": "x"} },
		"bad env name":   func(sp *runtime.Spec) { sp.Env = map[string]string{"A=B": "x"} },
		"negative ready": func(sp *runtime.Spec) { sp.ReadyTimeout = -time.Second },
	}
	for name, mutate := range cases {
		spec := s.spec(s.images.Empty)
		mutate(&spec)
		if _, err := s.rt.Create(context.Background(), spec); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: Create: %v, want ErrInvalidArgument", name, err)
		}
		if spec.LeaseID != "" {
			s.assertNothingLeft(t, spec.LeaseID)
		}
	}
}

func (s *suite) testReadyTimeout(t *testing.T) {
	t.Parallel()
	spec := s.spec(s.images.Empty)
	spec.ReadyTimeout = 5 * time.Millisecond
	began := time.Now()
	_, err := s.rt.Create(context.Background(), spec)
	if err == nil {
		t.Fatal("Create with a 5ms ReadyTimeout succeeded")
	}
	t.Logf("Create with a 5ms ReadyTimeout failed after %s: %v", time.Since(began).Round(time.Millisecond), err)
	s.assertNothingLeft(t, spec.LeaseID)

	// A cancelled caller leaves nothing behind either.
	spec = s.spec(s.images.Empty)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.rt.Create(ctx, spec); err == nil {
		t.Fatal("Create with a cancelled context succeeded")
	}
	s.assertNothingLeft(t, spec.LeaseID)
}

func (s *suite) testBadUser(t *testing.T) {
	t.Parallel()
	if s.images.BadUser == "" {
		testenv.SkipOrFail(t, "no image with a missing user given (Images.BadUser); skipping")
	}
	spec := s.spec(s.images.BadUser)
	began := time.Now()
	_, err := s.rt.Create(context.Background(), spec)
	if err == nil {
		t.Fatal("Create of an image whose user does not exist succeeded")
	}
	if d := time.Since(began); d > 20*time.Second {
		t.Errorf("failing Create took %s; it should fail fast, not wait for the ready timeout", d)
	}
	t.Logf("Create failed as expected in %s: %v", time.Since(began).Round(time.Millisecond), err)
	s.assertNothingLeft(t, spec.LeaseID)
}

// controlProbe checks that sb reaches its own agent with s.probe, so the
// probing tool works there; a shell image without one skips.
func (s *suite) controlProbe(t *testing.T, sb runtime.Sandbox, token string) {
	t.Helper()
	switch code := s.probe(t, sb, token, net.JoinHostPort("127.0.0.1", strconv.Itoa(runtime.AgentPort))); code {
	case 0:
	case 77:
		testenv.SkipOrFail(t, "the shell image has none of bash, python3 or nc to test connectivity with")
	default:
		t.Fatalf("control probe of the sandbox's own agent failed (exit %d)", code)
	}
}

// removeOnCleanup removes sandbox id when t ends.
func (s *suite) removeOnCleanup(t *testing.T, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.rt.Remove(ctx, id); err != nil {
			t.Errorf("cleanup: Remove %s: %v", id, err)
		}
	})
}
