package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// pauseCall posts :pause (mode "freeze" or "hibernate") or, with mode "",
// :resume for lease id, requires 200 and returns the lease and how long the
// call took.
func pauseCall(tb testing.TB, a *api, id, mode string) (*orchv1.Lease, time.Duration) {
	tb.Helper()
	path, body := "/v1/leases/"+id+":resume", any(map[string]any{})
	if mode != "" {
		path, body = "/v1/leases/"+id+":pause", map[string]any{"mode": mode}
	}
	t0 := time.Now()
	code, _, b := a.mustCall(tb, http.MethodPost, path, body)
	took := time.Since(t0)
	if code != http.StatusOK {
		tb.Fatalf("POST %s %v: HTTP %d: %s", path, body, code, b)
	}
	var l orchv1.Lease
	if err := decode(b, &l); err != nil {
		tb.Fatal(err)
	}
	want := orchv1.LeaseState_LEASE_STATE_PAUSED
	if mode == "" {
		want = orchv1.LeaseState_LEASE_STATE_READY
	}
	if l.GetState() != want {
		tb.Fatalf("POST %s: state %s (%s), want %s", path, l.GetState(), l.GetReason(), want)
	}
	return &l, took
}

// pexec runs command in lease id's sandbox through the proxy and requires
// exit 0; it returns stdout and how long the request took.
func pexec(tb testing.TB, a *api, id, tok, command string) (string, time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	code, res, err := a.proxyExec(ctx, id, tok, map[string]any{"command": command})
	took := time.Since(t0)
	if err != nil || code != http.StatusOK || res.ExitCode != 0 {
		tb.Fatalf("exec %q via proxy: HTTP %d, %+v, %v", command, code, res, err)
	}
	return res.Stdout, took
}

// dockerState is the container's state as docker reports it ("paused").
func dockerState(tb testing.TB, cid string) string {
	return strings.TrimSpace(mustDocker(tb, "inspect", "-f", "{{.State.Status}}", cid))
}

// startSleep starts a background process (the agent's StartProcess: sleep
// 3599, which a test finds by its /proc cmdline, as pids are reused after a
// restart; the pattern 35[9]9 does not match the checking shell's own
// cmdline, which may hold the reused pid) in lease id's sandbox and returns
// its pid.
func startSleep(tb testing.TB, a *api, id, tok string) string {
	tb.Helper()
	code, _, b := a.mustCall(tb, http.MethodPost, sandboxPath(id, "/v1/processes"), map[string]any{"argv": []string{"sleep", "3599"}}, tok)
	var proc struct {
		Pid int `json:"pid"`
	}
	if code != http.StatusOK || json.Unmarshal(b, &proc) != nil || proc.Pid == 0 {
		tb.Fatalf("start a background process in %s: HTTP %d: %s", id, code, b)
	}
	return strconv.Itoa(proc.Pid)
}

// pauseFixture starts an orchestrator on Docker and acquires a lease for
// conv whose sandbox has a file (/workspace/f) and a background process
// (pid).
func pauseFixture(t *testing.T, conv string) (o *orch, dir, id, tok, cid, pid string) {
	t.Helper()
	requireImage(t, baseImage)
	dir, _ = newDataDir(t)
	o = startOrch(t, dir)
	r := o.mustAcquire(t, conv, baseImage, "600s")
	id, tok, cid = r.GetLease().GetId(), r.GetToken(), r.GetLease().GetContainerId()
	pexec(t, o.api, id, tok, `echo kept > /workspace/f`)
	return o, dir, id, tok, cid, startSleep(t, o.api, id, tok)
}

func TestPauseFreezeResume(t *testing.T) {
	o, dir, id, tok, cid, pid := pauseFixture(t, "c-freeze")

	l, took := pauseCall(t, o.api, id, "freeze")
	if l.GetPaused() != "freeze" || dockerState(t, cid) != "paused" {
		t.Fatalf("after freeze: paused %q, container %s", l.GetPaused(), dockerState(t, cid))
	}
	t.Logf("freeze: %s", took)
	// Survives an orchestrator restart: still PAUSED, still frozen.
	o.stop(t)
	o = startOrch(t, dir)
	if g := o.mustGet(t, id); g.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED || dockerState(t, cid) != "paused" {
		t.Fatalf("after restart: %s, container %s", g.GetState(), dockerState(t, cid))
	}
	_, took = pauseCall(t, o.api, id, "")
	t.Logf("resume (freeze): %s", took)
	out, _ := pexec(t, o.api, id, tok, `cat /workspace/f; grep -qs '35[9]9' /proc/`+pid+`/cmdline && echo alive`)
	if out != "kept\nalive\n" {
		t.Fatalf("after freeze/resume: %q, want the file and the process", out)
	}
}

func TestPauseHibernateResume(t *testing.T) {
	o, dir, id, tok, cid, pid := pauseFixture(t, "c-hibernate")

	l, took := pauseCall(t, o.api, id, "hibernate")
	if l.GetPaused() != "hibernate" || !strings.Contains(l.GetReason(), "processes are gone") || dockerState(t, cid) != "exited" {
		t.Fatalf("after hibernate: paused %q (%s), container %s", l.GetPaused(), l.GetReason(), dockerState(t, cid))
	}
	t.Logf("hibernate: %s", took)
	// The deliberate stop is not a crash: no restart, and an orchestrator
	// restart keeps the lease PAUSED with its container stopped.
	time.Sleep(3 * time.Second) // past RestartDelay
	o.stop(t)
	o = startOrch(t, dir)
	time.Sleep(500 * time.Millisecond)
	if g := o.mustGet(t, id); g.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED || g.GetRestarts() != 0 || dockerState(t, cid) != "exited" {
		t.Fatalf("after restart: %s (%s), %d restarts, container %s", g.GetState(), g.GetReason(), g.GetRestarts(), dockerState(t, cid))
	}
	l, took = pauseCall(t, o.api, id, "")
	t.Logf("resume (hibernate): %s", took)
	if l.GetRestarts() != 0 || !strings.Contains(l.GetReason(), "processes that were running are gone") {
		t.Fatalf("resumed: %d restarts, reason %q", l.GetRestarts(), l.GetReason())
	}
	out, _ := pexec(t, o.api, id, tok, `cat /workspace/f; grep -qs '35[9]9' /proc/`+pid+`/cmdline && echo alive; true`)
	if out != "kept\n" {
		t.Fatalf("after hibernate/resume: %q, want the file without the process", out)
	}
}

// An exec through the proxy to a paused lease resumes it and succeeds; so
// does an acquire of its conversation.
func TestPauseTransparentResume(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	r := o.mustAcquire(t, "c-transparent", baseImage, "600s")
	id, tok := r.GetLease().GetId(), r.GetToken()
	for _, mode := range []string{"freeze", "hibernate"} {
		pauseCall(t, o.api, id, mode)
		out, took := pexec(t, o.api, id, tok, "echo served")
		if out != "served\n" {
			t.Fatalf("%s: exec on a paused lease: %q", mode, out)
		}
		t.Logf("first proxied request after %s: %s", mode, took)
		if g := o.mustGet(t, id); g.GetState() != orchv1.LeaseState_LEASE_STATE_READY {
			t.Fatalf("%s: lease %s after a proxied request", mode, g.GetState())
		}
	}
	pauseCall(t, o.api, id, "hibernate")
	again := o.mustAcquire(t, "c-transparent", baseImage, "600s")
	if again.GetLease().GetId() != id || again.GetLease().GetState() != orchv1.LeaseState_LEASE_STATE_READY {
		t.Fatalf("acquire of a paused conversation: %s %s", again.GetLease().GetId(), again.GetLease().GetState())
	}
}

// TestPauseLatency measures, over 10 runs each, freeze→resume and
// hibernate→resume (the :resume call) and the proxy's first request to a
// frozen and to a hibernated lease, and logs the p50 and max.
func TestPauseLatency(t *testing.T) {
	requireImage(t, baseImage)
	if testing.Short() {
		t.Skip("-short")
	}
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	r := o.mustAcquire(t, "c-latency", baseImage, "600s")
	id, tok := r.GetLease().GetId(), r.GetToken()
	const runs = 10
	var freeze, hibernate, proxyFrozen, proxyHibernated []time.Duration
	for range runs {
		pauseCall(t, o.api, id, "freeze")
		_, d := pauseCall(t, o.api, id, "")
		freeze = append(freeze, d)
		pauseCall(t, o.api, id, "hibernate")
		_, d = pauseCall(t, o.api, id, "")
		hibernate = append(hibernate, d)
		pauseCall(t, o.api, id, "freeze")
		_, d = pexec(t, o.api, id, tok, "true")
		proxyFrozen = append(proxyFrozen, d)
		pauseCall(t, o.api, id, "hibernate")
		_, d = pexec(t, o.api, id, tok, "true")
		proxyHibernated = append(proxyHibernated, d)
	}
	_, warm := pexec(t, o.api, id, tok, "true")
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{"freeze→resume (REST :resume)", freeze}, {"hibernate→resume (REST :resume)", hibernate},
		{"proxy exec to a frozen lease", proxyFrozen}, {"proxy exec to a hibernated lease", proxyHibernated}} {
		slices.Sort(m.ds)
		t.Logf("PAUSE-BENCH %-34s p50 %8s  max %8s  (n=%d)", m.name, m.ds[len(m.ds)/2].Round(10*time.Microsecond), m.ds[len(m.ds)-1].Round(10*time.Microsecond), len(m.ds))
	}
	t.Logf("PAUSE-BENCH %-34s      %8s", "proxy exec to a READY lease", warm.Round(10*time.Microsecond))
}

// On containerd, freeze is the task pause and hibernate the task's stop:
// files kept through both, the background process only through freeze;
// a proxied exec resumes a paused lease.
func TestPauseContainerd(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env)
	r := o.acq(t, "c-ctrd-pause", minimalImage, "600s")
	id, tok := r.GetLease().GetId(), r.GetToken()
	pexec(t, o.api, id, tok, `echo kept > /workspace/f`)
	pid := startSleep(t, o.api, id, tok)
	check := `cat /workspace/f; grep -qs '35[9]9' /proc/` + pid + `/cmdline && echo alive; true`

	pauseCall(t, o.api, id, "freeze")
	_, took := pauseCall(t, o.api, id, "")
	t.Logf("containerd freeze→resume: %s", took)
	if out, _ := pexec(t, o.api, id, tok, check); out != "kept\nalive\n" {
		t.Fatalf("after freeze/resume: %q", out)
	}
	pauseCall(t, o.api, id, "hibernate")
	out, took := pexec(t, o.api, id, tok, check) // resumes through the proxy
	t.Logf("containerd hibernate→first proxied exec: %s", took)
	if out != "kept\n" {
		t.Fatalf("after hibernate/resume: %q", out)
	}
}

// kill -9 of the orchestrator in the middle of a pause or a resume: after a
// restart the lease is PAUSED or READY (never FAILED, never restarted as a
// crash), its container agrees with it, and it resumes with its files.
func TestPauseKill9(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	p := startProc(t, dir, addr)
	r := p.mustAcquire(t, "c-kill9", baseImage, "600s")
	id, tok, cid := r.GetLease().GetId(), r.GetToken(), r.GetLease().GetContainerId()
	pexec(t, p.api, id, tok, `echo kept > /workspace/f`)
	wantEngine := map[string]string{"freeze": "paused", "hibernate": "exited"}
	for i, step := range []struct{ op, mode string }{
		{"pause", "hibernate"}, {"resume", ""}, {"pause", "freeze"}, {"resume", ""}, {"pause", "hibernate"}, {"resume", ""},
	} {
		delay := time.Duration(i%3) * 40 * time.Millisecond
		path, body := "/v1/leases/"+id+":"+step.op, map[string]any{}
		if step.mode != "" {
			body["mode"] = step.mode
		}
		go func() { _, _, _, _ = p.call(http.MethodPost, path, body) }()
		time.Sleep(delay)
		p.kill9(t)
		p = startProc(t, dir, addr)
		// The engine may still finish a start or stop the killed process had
		// asked for: the orchestrator's resyncs (1s and 5s after start)
		// bring the container back to what the lease records.
		var g *orchv1.Lease
		var engine string
		eventually(10*time.Second, 100*time.Millisecond, func() bool {
			g, engine = p.mustGet(t, id), dockerState(t, cid)
			return g.GetState() == orchv1.LeaseState_LEASE_STATE_READY && engine == "running" ||
				g.GetState() == orchv1.LeaseState_LEASE_STATE_PAUSED && engine == wantEngine[g.GetPaused()]
		})
		t.Logf("%s %s, kill -9 after %s: lease %s %q (%s), container %s", step.op, step.mode, delay, g.GetState(), g.GetPaused(), g.GetReason(), engine)
		switch {
		case g.GetRestarts() != 0:
			t.Fatalf("a deliberate pause was taken for a crash: %d restarts", g.GetRestarts())
		case g.GetState() == orchv1.LeaseState_LEASE_STATE_READY && engine != "running",
			g.GetState() == orchv1.LeaseState_LEASE_STATE_PAUSED && engine != wantEngine[g.GetPaused()],
			g.GetState() != orchv1.LeaseState_LEASE_STATE_READY && g.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED:
			t.Fatalf("after kill -9: lease %s %q, container %s", g.GetState(), g.GetPaused(), engine)
		}
		// Bring it to the state the step aimed at, so the next step starts there.
		if step.op == "pause" && g.GetState() == orchv1.LeaseState_LEASE_STATE_READY {
			pauseCall(t, p.api, id, step.mode)
		}
		if step.op == "resume" {
			if out, _ := pexec(t, p.api, id, tok, "cat /workspace/f"); out != "kept\n" {
				t.Fatalf("files after resume: %q", out)
			}
		}
	}
}
