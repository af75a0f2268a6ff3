package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/orchestrator"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// faultBackend is what the sandbox faults need of one container runtime.
type faultBackend struct {
	name string // "docker" or "containerd"
	a    *api   // the orchestrator's API
	// crashAgent crashes the agent (PID 1) from inside the sandbox and says
	// how; killOutside kills the sandbox from outside.
	crashAgent  func(t *testing.T, l *orchv1.Lease, token string) string
	killOutside func(t *testing.T, cid string) string
	// exists reports whether the container is still there; marker reads the
	// marker file of a kept (stopped) container, nil when it cannot.
	exists func(t *testing.T, cid string) bool
	marker func(t *testing.T, cid string) bool
	// health reports panics or an orchestrator gone ("" when fine).
	health func() string
	// track, when set, is told every sandbox the faults create; kept,
	// every container of an ended lease still there after the checks.
	track, kept func(cid string)
}

// sandboxFault is one fault done to a sandbox, with the outcome it should
// have.
type sandboxFault struct {
	name string
	// resources of the faulted lease (JSON of the API's Resources).
	resources map[string]any
	// do inflicts the fault and returns what the command (if any) showed.
	do func(t *testing.T, b *faultBackend, l *orchv1.Lease, token string) faultObs
	// settle waits until the lease shows the fault's outcome (or gives up).
	settle time.Duration
	// done reports whether the lease shows a final outcome of the fault.
	done func(before, now *orchv1.Lease) bool
	// expect checks the observation; it returns the deviations from the
	// documented behaviour.
	expect func(o faultObs) []string
}

// faultObs is what one fault run observed.
type faultObs struct {
	notRun     string // why the fault could not be inflicted
	cmd        string // what the faulting command returned, if any
	cmdFailed  bool   // the command failed (non-zero exit, signal, timeout)
	oomKilled  bool   // the exec result said oomKilled
	exitCode   int
	signal     string
	state      orchv1.LeaseState
	reason     string
	restarts   int32
	warnings   []string
	sameCtr    bool // the lease still names the same container
	ctrExists  bool // the lease's container still exists in the engine
	filesKept  bool // the marker written before the fault can be read back
	filesNA    bool // the marker of a kept container cannot be read here
	usable     bool // a command runs in the sandbox after the fault
	recoverIn  time.Duration
	neighbour  bool // the neighbour lease execs fine after the fault
	api5xx     int  // 5xx answers of the lease API while observing
	sawWarning bool // a warning was in the lease at some point
	// doTook is how long the fault took, settleTook how long the lease then
	// took to show its outcome, took the whole run (acquire to checks).
	doTook, settleTook, took time.Duration
}

func (o faultObs) String() string {
	if o.notRun != "" {
		return "not run: " + trunc(o.notRun, 200)
	}
	s := strings.TrimPrefix(o.state.String(), "LEASE_STATE_")
	if o.reason != "" {
		s += fmt.Sprintf(" %q", trunc(o.reason, 60))
	}
	s += fmt.Sprintf(", restarts %d", o.restarts)
	if o.cmd != "" {
		s += ", cmd: " + o.cmd
	}
	if len(o.warnings) > 0 || o.sawWarning {
		s += fmt.Sprintf(", warned %t", o.sawWarning)
	}
	if o.filesNA {
		s += fmt.Sprintf(", files kept n/a, usable %t", o.usable)
	} else {
		s += fmt.Sprintf(", files kept %t, usable %t", o.filesKept, o.usable)
	}
	if o.usable && o.recoverIn > 0 {
		s += fmt.Sprintf(" (after %.1fs)", o.recoverIn.Seconds())
	}
	if !o.ctrExists {
		s += ", container gone"
	}
	s += fmt.Sprintf(", neighbour ok %t, API 5xx %d; fault %.1fs, outcome %.1fs later, run %.0fs", o.neighbour, o.api5xx, o.doTook.Seconds(), o.settleTook.Seconds(), o.took.Seconds())
	return s
}

const chaosMarker = "chaos-marker-0123"

// chaosRestartLimit is the orchestrator's default restart budget
// (restartLimit within restartWindow).
var chaosRestartLimit = int32(orchestrator.Defaults().Restart.Limit)

func isReady(l *orchv1.Lease) bool { return l.GetState() == orchv1.LeaseState_LEASE_STATE_READY }
func isEnded(l *orchv1.Lease) bool {
	switch l.GetState() {
	case orchv1.LeaseState_LEASE_STATE_FAILED, orchv1.LeaseState_LEASE_STATE_EXPIRED, orchv1.LeaseState_LEASE_STATE_RELEASED:
		return true
	}
	return false
}

// restartedOrEnded: the lease was restarted in place (READY again, more
// restarts) or ended.
func restartedOrEnded(before, now *orchv1.Lease) bool {
	return isEnded(now) || (isReady(now) && now.GetRestarts() > before.GetRestarts())
}

func sandboxFaults() []sandboxFault {
	restartedInPlace := func(o faultObs) []string {
		var d []string
		if o.state != orchv1.LeaseState_LEASE_STATE_READY {
			d = append(d, "lease "+o.state.String()+" ("+o.reason+"), want READY after a restart in place")
		}
		if o.restarts < 1 {
			d = append(d, fmt.Sprintf("restarts %d, want >= 1", o.restarts))
		}
		if !o.filesKept {
			d = append(d, "files lost")
		}
		if !o.sameCtr {
			d = append(d, "not the same container")
		}
		return d
	}
	return []sandboxFault{
		{
			name: "agent killed inside the sandbox (kill -ABRT 1: Go crash, exit 2)",
			do: func(t *testing.T, b *faultBackend, l *orchv1.Lease, token string) faultObs {
				return faultObs{cmd: b.crashAgent(t, l, token)}
			},
			settle: 30 * time.Second, done: restartedOrEnded, expect: restartedInPlace,
		},
		{
			name: "sandbox killed from outside (SIGKILL)",
			do: func(t *testing.T, b *faultBackend, l *orchv1.Lease, _ string) faultObs {
				return faultObs{cmd: b.killOutside(t, l.GetContainerId())}
			},
			settle: 30 * time.Second, done: restartedOrEnded, expect: restartedInPlace,
		},
		{
			name:      "command OOM (python3 allocates 256 MiB, limit 64 MiB)",
			resources: map[string]any{"memoryBytes": 64 << 20},
			do: func(t *testing.T, b *faultBackend, l *orchv1.Lease, token string) faultObs {
				code, r, body, err := b.a.chaosExec(l.GetId(), token, 60*time.Second, "python3", "-c", "x = bytearray(b'x') * (256 << 20); print(len(x))")
				o := faultObs{oomKilled: r.OOMKilled, exitCode: r.ExitCode, signal: r.Signal}
				switch {
				case err != nil:
					o.cmd = "error: " + trunc(err.Error(), 60)
				case code != http.StatusOK:
					o.cmd = fmt.Sprintf("HTTP %d %s", code, trunc(body, 60))
				default:
					o.cmd = fmt.Sprintf("exit %d signal %s oomKilled %t", r.ExitCode, r.Signal, r.OOMKilled)
					o.cmdFailed = r.ExitCode != 0
				}
				return o
			},
			// The engine's oom event arrives within moments; give the lease
			// manager time to (wrongly) act on it.
			settle: 3 * time.Second, done: func(_, now *orchv1.Lease) bool { return isEnded(now) },
			expect: func(o faultObs) []string {
				var d []string
				if !o.oomKilled || (o.exitCode != 137 && !strings.Contains(o.signal, "KILL")) {
					d = append(d, fmt.Sprintf("exec result: exit %d signal %q oomKilled %t, want exit 137 or SIGKILL, and oomKilled", o.exitCode, o.signal, o.oomKilled))
				}
				if o.state != orchv1.LeaseState_LEASE_STATE_READY || o.restarts != 0 {
					d = append(d, fmt.Sprintf("lease %s (%s) restarts %d, want READY with 0 restarts", o.state, o.reason, o.restarts))
				}
				if !o.filesKept {
					d = append(d, "files lost")
				}
				return d
			},
		},
		{
			name: "crash loop: killed from outside 4 times (restart limit 3)",
			do: func(t *testing.T, b *faultBackend, l *orchv1.Lease, _ string) faultObs {
				// Three kills are restarted in place; the fourth exit within
				// the window is past the budget.
				restarts := int32(0)
				for i := range chaosRestartLimit + 1 {
					b.killOutside(t, l.GetContainerId())
					if i == chaosRestartLimit {
						break
					}
					if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
						got, code, _ := b.a.get(t, l.GetId())
						if code == http.StatusOK && isReady(got) && got.GetRestarts() > restarts {
							restarts = got.GetRestarts()
							return true
						}
						return false
					}) {
						return faultObs{cmd: fmt.Sprintf("kill %d: not READY again within 30s", i+1)}
					}
				}
				return faultObs{cmd: fmt.Sprintf("%d kills", chaosRestartLimit+1)}
			},
			settle: 30 * time.Second, done: func(_, now *orchv1.Lease) bool { return isEnded(now) },
			expect: func(o faultObs) []string {
				var d []string
				if o.state != orchv1.LeaseState_LEASE_STATE_FAILED || !strings.Contains(o.reason, "restart limit") {
					d = append(d, fmt.Sprintf("lease %s (%s), want FAILED naming the restart limit", o.state, o.reason))
				}
				if o.restarts != chaosRestartLimit {
					d = append(d, fmt.Sprintf("restarts %d, want %d", o.restarts, chaosRestartLimit))
				}
				if o.ctrExists {
					d = append(d, "container not removed 10s after the lease failed")
				}
				return d
			},
		},
		{
			name:      "fork bomb (pids limit 64)",
			resources: map[string]any{"pids": 64},
			do: func(t *testing.T, b *faultBackend, l *orchv1.Lease, token string) faultObs {
				code, r, body, err := b.a.chaosExec(l.GetId(), token, 5*time.Second, "/bin/sh", "-c", "b() { b | b & }; b; sleep 30")
				o := faultObs{exitCode: r.ExitCode}
				switch {
				case err != nil:
					o.cmd = "error: " + trunc(err.Error(), 60)
				case code != http.StatusOK:
					o.cmd = fmt.Sprintf("HTTP %d %s", code, trunc(body, 60))
				default:
					o.cmd = fmt.Sprintf("exit %d timedOut %t", r.ExitCode, r.TimedOut)
					o.cmdFailed = r.ExitCode != 0 || r.TimedOut
				}
				return o
			},
			settle: time.Second, done: func(_, now *orchv1.Lease) bool { return isEnded(now) },
			expect: func(o faultObs) []string {
				var d []string
				if !o.cmdFailed {
					d = append(d, "the fork bomb's command did not fail: "+o.cmd)
				}
				if o.state != orchv1.LeaseState_LEASE_STATE_READY {
					d = append(d, "lease "+o.state.String()+" ("+o.reason+"), want READY")
				}
				if !o.usable {
					d = append(d, "no command runs in the sandbox 20s after the fork bomb")
				}
				if !o.filesKept {
					d = append(d, "files lost")
				}
				return d
			},
		},
		{
			name:      "disk fill (dd 128 MiB, diskBytes 64 MiB)",
			resources: map[string]any{"diskBytes": 64 << 20},
			do: func(t *testing.T, b *faultBackend, l *orchv1.Lease, token string) faultObs {
				code, r, body, err := b.a.chaosExec(l.GetId(), token, 60*time.Second, "/bin/sh", "-c", "dd if=/dev/zero of=chaos-fill bs=1M count=128 2>&1 | tail -1")
				o := faultObs{exitCode: r.ExitCode}
				switch {
				case err != nil:
					o.cmd = "error: " + trunc(err.Error(), 60)
				case code != http.StatusOK:
					o.cmd = fmt.Sprintf("HTTP %d %s", code, trunc(body, 60))
				default:
					o.cmd = fmt.Sprintf("exit %d", r.ExitCode)
					o.cmdFailed = r.ExitCode != 0
				}
				return o
			},
			settle: 90 * time.Second, done: func(_, now *orchv1.Lease) bool { return isEnded(now) },
			expect: func(o faultObs) []string {
				var d []string
				if o.state != orchv1.LeaseState_LEASE_STATE_FAILED || !strings.Contains(o.reason, "disk limit exceeded") {
					d = append(d, fmt.Sprintf("lease %s (%s), want FAILED \"disk limit exceeded\"", o.state, o.reason))
				}
				if !o.sawWarning {
					d = append(d, "no warning in the lease before it failed")
				}
				if !o.ctrExists {
					d = append(d, "container removed, want it kept")
				}
				return d
			},
		},
	}
}

// chaosSandboxFaults runs every sandbox fault on the Docker backend, on a
// subprocess orchestrator.
func chaosSandboxFaults(t *testing.T, cfg chaosSizes, table *chaosTable) {
	dir, _ := newDataDir(t)
	// Disk usage measured every second, stopped 3s past the limit: the
	// policy of the defaults (15s, 30s), sooner.
	p := startProc(t, dir, freeAddr(t), "BERTH_DISK_INTERVAL=1s", "BERTH_DISK_GRACE=3s")
	b := &faultBackend{name: "docker", a: p.api,
		crashAgent: func(t *testing.T, l *orchv1.Lease, _ string) string {
			// PID 1 ignores signals it has no handler for when they come
			// from inside its namespace (kill -9 1 does nothing); the Go
			// runtime handles SIGABRT and crashes (exit 2): an agent crash.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := dockerCLI(ctx, "exec", l.GetContainerId(), "kill", "-ABRT", "1")
			return trunc(fmt.Sprintf("docker exec kill -ABRT 1: %v %s", err, out), 80)
		},
		killOutside: func(t *testing.T, cid string) string {
			mustDocker(t, "kill", cid)
			return "docker kill"
		},
		exists: func(t *testing.T, cid string) bool { return !containerGone(t, cid) },
		marker: func(t *testing.T, cid string) bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := dockerCLI(ctx, "cp", cid+":"+workdirOf(t, cid)+"/chaos-marker", "-")
			return err == nil && strings.Contains(out, chaosMarker)
		},
		health: func() string { return procHealth(p) },
	}
	runSandboxFaults(t, cfg, table, b, 200)
}

// runSandboxFaults runs every sandbox fault (concurrently, each on its own
// lease on berth/base) next to a neighbour lease, and checks the outcome
// each should have, that the neighbour keeps working and that the lease API
// never answers 5xx.
func runSandboxFaults(t *testing.T, cfg chaosSizes, table *chaosTable, b *faultBackend, order int) {
	t0 := time.Now()
	nb := b.a.mustAcquire(t, "neighbour", minimalImage, "600s")
	neighbourOK := func() bool {
		ok, _ := b.a.execOK(nb.GetLease().GetId(), nb.GetToken(), "echo ok")
		return ok
	}

	faults := sandboxFaults()
	rows := make([]*chaosRow, len(faults))
	for i, f := range faults {
		rows[i] = &chaosRow{name: f.name + " [" + b.name + "]", runs: cfg.sandboxRuns, pass: true, order: order + i}
		table.add(rows[i])
	}
	for run := range cfg.sandboxRuns {
		obs := make([]faultObs, len(faults))
		// Every fault of a run at once, each in its own parallel subtest
		// (so helpers may t.Fatal); t.Run returns when all are done.
		t.Run(fmt.Sprintf("run%d", run), func(t *testing.T) {
			for i, f := range faults {
				t.Run(fmt.Sprintf("fault%d", i), func(t *testing.T) {
					t.Parallel()
					t0 := time.Now()
					obs[i] = runSandboxFault(t, b, f, fmt.Sprintf("f%d-r%d", i, run), neighbourOK)
					obs[i].took = time.Since(t0)
				})
			}
		})
		for i, f := range faults {
			o := obs[i]
			rows[i].figures = o.String()
			if o.notRun != "" {
				rows[i].fail(t, "run %d: not run: %s", run, o.notRun)
				continue
			}
			if !o.neighbour {
				rows[i].fail(t, "run %d: the neighbour lease did not exec after the fault", run)
			}
			if o.api5xx > 0 {
				rows[i].fail(t, "run %d: the lease API answered 5xx %d time(s)", run, o.api5xx)
			}
			for _, d := range f.expect(o) {
				rows[i].fail(t, "run %d: %s", run, d)
			}
		}
	}
	if h := b.health(); h != "" {
		rows[0].fail(t, "%s", h)
	}
	for _, r := range rows {
		r.took = time.Since(t0)
	}
}

// runSandboxFault acquires a lease for f, writes a marker file, inflicts
// the fault and observes the lease, its files and the neighbour.
func runSandboxFault(t *testing.T, b *faultBackend, f sandboxFault, conv string, neighbourOK func() bool) faultObs {
	p := b.a
	body := map[string]any{"conversationId": conv, "image": baseImage, "ttl": "600s"}
	if f.resources != nil {
		body["resources"] = f.resources
	}
	code, ab, err := acquireRetry(p, body)
	if err != nil || code != http.StatusOK {
		return faultObs{notRun: fmt.Sprintf("acquire: HTTP %d %v %s", code, err, trunc(string(ab), 200))}
	}
	var r orchv1.AcquireResponse
	if err := decode(ab, &r); err != nil {
		return faultObs{notRun: err.Error()}
	}
	before, token := r.GetLease(), r.GetToken()
	id := before.GetId()
	if b.track != nil {
		b.track(before.GetContainerId())
	}
	if ok, msg := p.execOK(id, token, "echo "+chaosMarker+" > chaos-marker"); !ok {
		return faultObs{notRun: "write marker: " + msg}
	}

	tDo := time.Now()
	o := f.do(t, b, before, token)
	t0 := time.Now()
	o.doTook = t0.Sub(tDo)
	var now *orchv1.Lease
	get := func() *orchv1.Lease {
		code, _, lb, err := p.call(http.MethodGet, "/v1/leases/"+id, nil)
		if err != nil {
			return nil
		}
		if code >= 500 {
			o.api5xx++
		}
		if code != http.StatusOK {
			return nil
		}
		var l orchv1.Lease
		if decode(lb, &l) != nil {
			return nil
		}
		if len(l.GetWarnings()) > 0 {
			o.sawWarning = true
		}
		return &l
	}
	eventually(f.settle, 100*time.Millisecond, func() bool {
		if l := get(); l != nil {
			now = l
		}
		return now != nil && f.done(before, now)
	})
	o.settleTook = time.Since(t0)
	if now == nil {
		now = before
	}
	o.state, o.reason, o.restarts, o.warnings = now.GetState(), now.GetReason(), now.GetRestarts(), now.GetWarnings()
	o.sameCtr = now.GetContainerId() == before.GetContainerId()
	if isEnded(now) && !strings.Contains(now.GetReason(), "disk limit") {
		// Failed for another reason: its container is being removed.
		eventually(10*time.Second, 200*time.Millisecond, func() bool { return !b.exists(t, before.GetContainerId()) })
	}
	o.ctrExists = b.exists(t, before.GetContainerId())
	if isEnded(now) && o.ctrExists && b.kept != nil {
		b.kept(before.GetContainerId())
	}

	// The sandbox is usable once a command runs in it (a fork bomb may hold
	// the pids for a while); the marker tells whether files survived.
	if isReady(now) {
		eventually(20*time.Second, 250*time.Millisecond, func() bool {
			ok, _ := p.execOK(id, token, "true")
			o.usable = ok
			return ok
		})
		if o.usable {
			o.recoverIn = time.Since(t0)
			ok, out := p.execOK(id, token, "cat chaos-marker")
			o.filesKept = ok && strings.TrimSpace(out) == chaosMarker
		}
		// A last look at the lease (a late event may still end it).
		if l := get(); l != nil {
			o.state, o.reason, o.restarts = l.GetState(), l.GetReason(), l.GetRestarts()
		}
	} else if o.ctrExists && b.marker != nil {
		// Ended but kept: the files are still in the container.
		o.filesKept = b.marker(t, before.GetContainerId())
	} else if o.ctrExists {
		o.filesNA = true
	}
	o.neighbour = neighbourOK()
	return o
}

// workdirOf is a container's working directory.
func workdirOf(t *testing.T, cid string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := dockerCLI(ctx, "inspect", "--format", "{{.Config.WorkingDir}}", cid)
	if err != nil || strings.TrimSpace(out) == "" {
		return "/workspace"
	}
	return strings.TrimSpace(out)
}

// chaosSandboxFaultsContainerd runs every sandbox fault on the containerd
// backend (an in-process orchestrator, as the other containerd e2e tests).
// The agent is crashed by a command in the sandbox run as root; the task is
// killed from outside through containerd's API.
func chaosSandboxFaultsContainerd(t *testing.T, cfg chaosSizes, table *chaosTable) {
	requireCtrdImage(t, minimalImage)
	requireCtrdImage(t, baseImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, func(c *orchestrator.Config) {
		c.Disk.Interval = time.Second
		c.Disk.Grace = 3 * time.Second
	})
	// Runs before the env's leftover check: the containers of ended leases
	// that berth keeps (disk limit) are expected; remove them. Anything
	// else left fails the test there.
	var mu sync.Mutex
	var kept []string
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		mu.Lock()
		defer mu.Unlock()
		for _, id := range kept {
			if err := ctrd.rt.Remove(ctx, id); err != nil && !errdefs.IsNotFound(err) {
				t.Errorf("cleanup: remove kept container %s: %v", id, err)
			}
		}
	})
	b := &faultBackend{name: "containerd", a: o.api,
		crashAgent: func(t *testing.T, l *orchv1.Lease, token string) string {
			code, _, body, err := o.api.chaosExecAs(l.GetId(), token, "root", 10*time.Second, "kill", "-ABRT", "1")
			return trunc(fmt.Sprintf("exec kill -ABRT 1 as root: HTTP %d %v %s", code, err, body), 80)
		},
		killOutside: func(t *testing.T, cid string) string {
			killCtrdTask(t, ctrd.rt, cid)
			return "task SIGKILL"
		},
		exists: func(t *testing.T, cid string) bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := ctrd.rt.Get(ctx, cid)
			return err == nil
		},
		health: func() string { return "" },
		track:  env.track,
		kept: func(cid string) {
			mu.Lock()
			defer mu.Unlock()
			kept = append(kept, cid)
		},
	}
	runSandboxFaults(t, cfg, table, b, 250)
}
