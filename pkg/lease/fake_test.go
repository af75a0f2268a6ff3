package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// fakeRuntime implements Runtime in memory. It records creates and
// removes, can fail or slow them, and can simulate container deaths.
type fakeRuntime struct {
	mu          sync.Mutex
	boxes       map[string]*runtime.Sandbox
	next        int
	specs       []runtime.Spec
	removed     []string
	createDelay time.Duration
	createGate  chan struct{} // when set, Create waits for it to close
	createErr   error
	removeErr   error
	watchErr    error
	watchers    []chan runtime.Event
	watchCalls  int
	listCalls   int
	restartGate chan struct{} // when set, Restart waits for it to close
	restartErr  error
	restartIDs  []string         // containers Restart was called for
	usage       map[string]int64 // container id → disk bytes Usage reports
	usageErr    error
	usageCalls  int
	stopped     []string
	stopErr     error
	claimCalls  int
	claimHook   func(id string) // called by ClaimMember, with mu held, after a successful claim
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{boxes: map[string]*runtime.Sandbox{}}
}

func (f *fakeRuntime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	delay, gate, cerr := f.createDelay, f.createGate, f.createErr
	f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return runtime.Sandbox{}, ctx.Err()
		}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return runtime.Sandbox{}, ctx.Err()
		}
	}
	if cerr != nil {
		return runtime.Sandbox{}, cerr
	}
	if spec.AgentToken == "" || spec.LeaseID == "" {
		return runtime.Sandbox{}, errdefs.InvalidArgument("spec", "lease id and agent token are required")
	}
	labels := runtime.SandboxLabels(spec, "")
	return f.add(runtime.Sandbox{
		LeaseID: spec.LeaseID, ConversationID: spec.ConversationID, InstanceID: spec.InstanceID,
		Image: spec.Image, State: runtime.StateRunning, Labels: labels,
	}), nil
}

// add stores a sandbox, giving it an id and endpoint.
func (f *fakeRuntime) add(sb runtime.Sandbox) runtime.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	sb.ID = fmt.Sprintf("c%04d", f.next)
	sb.Name = "berth-" + sb.LeaseID
	sb.Endpoint = fmt.Sprintf("127.0.0.1:%d", 40000+f.next)
	sb.CreatedAt = time.Now()
	if sb.Labels == nil {
		sb.Labels = map[string]string{
			runtime.LabelManaged:  "true",
			runtime.LabelLease:    sb.LeaseID,
			runtime.LabelInstance: sb.InstanceID,
		}
	}
	if sb.State == "" {
		sb.State = runtime.StateRunning
	}
	f.boxes[sb.ID] = &sb
	return sb
}

func (f *fakeRuntime) Get(ctx context.Context, id string) (runtime.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.boxes[id]; ok {
		return *sb, nil
	}
	return runtime.Sandbox{}, errdefs.NotFound("container %s", id)
}

func (f *fakeRuntime) List(ctx context.Context, sel runtime.Selector) ([]runtime.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listCalls++
	var out []runtime.Sandbox
	for _, sb := range f.boxes {
		ok := true
		for k, v := range sel {
			if sb.Labels[k] != v {
				ok = false
			}
		}
		if ok {
			c := *sb
			c.Labels = maps.Clone(sb.Labels)
			out = append(out, c)
		}
	}
	return out, nil
}

func (f *fakeRuntime) Remove(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.removeErr != nil {
		return f.removeErr
	}
	f.removed = append(f.removed, id)
	delete(f.boxes, id)
	return nil
}

// Stop marks a container exited (files kept) and sends the died event.
func (f *fakeRuntime) Stop(ctx context.Context, id string, grace time.Duration) error {
	f.mu.Lock()
	if f.stopErr != nil {
		f.mu.Unlock()
		return f.stopErr
	}
	sb, ok := f.boxes[id]
	if !ok {
		f.mu.Unlock()
		return errdefs.NotFound("container %s", id)
	}
	f.stopped = append(f.stopped, id)
	sb.State, sb.ExitCode = runtime.StateExited, 143
	lease := sb.LeaseID
	f.mu.Unlock()
	f.emit(runtime.Event{Kind: runtime.EventDied, ID: id, LeaseID: lease, ExitCode: 143, At: time.Now()})
	return nil
}

// Usage reports the disk bytes set with setUsage (0 by default).
func (f *fakeRuntime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.usageCalls++
	if f.usageErr != nil {
		return runtime.Usage{}, f.usageErr
	}
	if _, ok := f.boxes[id]; !ok {
		return runtime.Usage{}, errdefs.NotFound("container %s", id)
	}
	return runtime.Usage{DiskBytes: f.usage[id], MeasuredAt: time.Now()}, nil
}

func (f *fakeRuntime) setUsage(id string, n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.usage == nil {
		f.usage = map[string]int64{}
	}
	f.usage[id] = n
}

func (f *fakeRuntime) Watch(ctx context.Context) (<-chan runtime.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watchCalls++
	if f.watchErr != nil {
		return nil, f.watchErr
	}
	ch := make(chan runtime.Event, 64)
	f.watchers = append(f.watchers, ch)
	context.AfterFunc(ctx, func() { f.closeWatcher(ch) })
	return ch, nil
}

// watching reports whether a watch is open.
func (f *fakeRuntime) watching() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watchers) > 0
}

// watchFails reports whether Watch is set to fail.
func (f *fakeRuntime) watchFails() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.watchErr != nil
}

func (f *fakeRuntime) closeWatcher(ch chan runtime.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i := slices.Index(f.watchers, ch); i >= 0 {
		f.watchers = slices.Delete(f.watchers, i, i+1)
		close(ch)
	}
}

// closeWatches ends every open watch, as a backend error would.
func (f *fakeRuntime) closeWatches() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.watchers {
		close(ch)
	}
	f.watchers = nil
}

func (f *fakeRuntime) emit(ev runtime.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.watchers {
		ch <- ev
	}
}

// kill makes a container exit with code and sends the died event.
func (f *fakeRuntime) kill(id string, code int, oom bool) {
	f.mu.Lock()
	sb := f.boxes[id]
	sb.State, sb.ExitCode, sb.OOMKilled = runtime.StateExited, code, oom
	lease := sb.LeaseID
	f.mu.Unlock()
	if oom {
		f.emit(runtime.Event{Kind: runtime.EventOOM, ID: id, LeaseID: lease, At: time.Now()})
	}
	f.emit(runtime.Event{Kind: runtime.EventDied, ID: id, LeaseID: lease, ExitCode: code, At: time.Now()})
}

// Restart starts an exited container again in place: same id, a new
// endpoint (as a container's address may change).
func (f *fakeRuntime) Restart(ctx context.Context, id string) (runtime.Sandbox, error) {
	f.mu.Lock()
	gate, rerr := f.restartGate, f.restartErr
	f.restartIDs = append(f.restartIDs, id)
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return runtime.Sandbox{}, ctx.Err()
		}
	}
	if rerr != nil {
		return runtime.Sandbox{}, rerr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.boxes[id]
	if !ok {
		return runtime.Sandbox{}, errdefs.NotFound("container %s", id)
	}
	f.next++
	sb.State, sb.ExitCode, sb.OOMKilled = runtime.StateRunning, 0, false
	sb.Endpoint = fmt.Sprintf("127.0.0.1:%d", 40000+f.next)
	return *sb, nil
}

func (f *fakeRuntime) restartCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.restartIDs)
}

// vanish deletes a container without an event.
func (f *fakeRuntime) vanish(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.boxes, id)
}

func (f *fakeRuntime) exists(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.boxes[id]
	return ok
}

func (f *fakeRuntime) creates() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.specs)
}

func (f *fakeRuntime) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.boxes)
}

func (f *fakeRuntime) set(fn func(f *fakeRuntime)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// harness is a started Manager over a real bbolt file and a fake runtime.
type harness struct {
	t      *testing.T
	m      *Manager
	rt     *fakeRuntime
	store  *BoltStore
	path   string
	cancel context.CancelFunc
	cfg    Config
}

var testSecret = []byte("0123456789abcdef0123456789abcdef")

func newHarness(t *testing.T, tweak func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, rt: newFakeRuntime(), path: filepath.Join(t.TempDir(), DBFileName)}
	h.cfg = Config{InstanceID: "test", Secret: testSecret, ReapInterval: 50 * time.Millisecond, Restart: RestartConfig{Delay: 10 * time.Millisecond}}
	if tweak != nil {
		tweak(&h.cfg)
	}
	h.start()
	t.Cleanup(h.stop)
	return h
}

// start opens the store and starts a Manager on it.
func (h *harness) start() {
	h.t.Helper()
	st, err := OpenBolt(h.path)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg := h.cfg
	cfg.Store, cfg.Runtime = st, h.rt
	m, cancel := startManager(h.t, cfg)
	h.m, h.store, h.cancel = m, st, cancel
	// The event watch starts in the background: events emitted before it
	// subscribes are lost (a resync finds a died container, nothing finds an
	// oom event), so a test's events wait for it.
	if !h.rt.watchFails() {
		eventually(h.t, 10*time.Second, "the manager watches the runtime's events", h.rt.watching)
	}
}

// startManager creates a Manager from cfg and starts it; cancel stops its
// loops (the caller still closes the Manager).
func startManager(t *testing.T, cfg Config) (m *Manager, cancel context.CancelFunc) {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	return m, cancel
}

// stop closes the Manager and the store, as a shutdown (or crash after the
// last write) would.
func (h *harness) stop() {
	if h.m == nil {
		return
	}
	h.cancel()
	_ = h.m.Close()
	_ = h.store.Close()
	h.m = nil
}

// restart simulates an orchestrator restart on the same data and runtime.
func (h *harness) restart() {
	h.stop()
	h.start()
}

func (h *harness) acquire(conv string) (Lease, string) {
	h.t.Helper()
	l, tok, _, err := h.m.Acquire(context.Background(), AcquireRequest{ConversationID: conv})
	if err != nil {
		h.t.Fatalf("acquire %s: %v", conv, err)
	}
	return l, tok
}

func (h *harness) get(id string) Lease {
	h.t.Helper()
	l, err := h.m.Get(context.Background(), id)
	if err != nil {
		h.t.Fatalf("get %s: %v", id, err)
	}
	return l
}

// eventually polls cond every 10ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func jsonOf(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// ClaimMember implements MemberClaimer: a compare-and-swap on the
// sandbox's labels under f.mu, as the kubernetes runtime's patch with a
// resourceVersion precondition.
func (f *fakeRuntime) ClaimMember(ctx context.Context, id, claimant string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claimCalls++
	sb, ok := f.boxes[id]
	switch {
	case !ok:
		return errdefs.NotFound("container %s", id)
	case sb.Labels[runtime.LabelPool] == "":
		return errdefs.FailedPrecondition("container %s is no pool member", id)
	case sb.Labels[runtime.LabelPoolClaim] != "":
		return errdefs.Conflict("container %s is claimed by %s", id, sb.Labels[runtime.LabelPoolClaim])
	}
	sb.Labels = maps.Clone(sb.Labels)
	sb.Labels[runtime.LabelPoolClaim] = claimant
	sb.Labels[runtime.LabelInstance] = claimant
	sb.InstanceID = claimant
	if f.claimHook != nil {
		f.claimHook(id)
	}
	return nil
}

// MarkMemberReady implements MemberClaimer.
func (f *fakeRuntime) MarkMemberReady(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.boxes[id]
	switch {
	case !ok:
		return errdefs.NotFound("container %s", id)
	case sb.Labels[runtime.LabelPoolClaim] != "":
		return errdefs.Conflict("container %s is claimed by %s", id, sb.Labels[runtime.LabelPoolClaim])
	}
	sb.Labels = maps.Clone(sb.Labels)
	sb.Labels[runtime.LabelPoolReady] = "true"
	return nil
}
