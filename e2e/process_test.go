package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestKillMidAcquire: SIGKILL the orchestrator binary while a lease is being
// created, restart it on the same data dir, and check that nothing is lost
// or leaked: READY leases stay READY and usable, no container lacks a live
// lease, the interrupted conversation has at most one container and can be
// acquired again. Two rounds: killed as soon as the lease shows PENDING,
// and 150ms into its creation.
func TestKillMidAcquire(t *testing.T) {
	// settleTime bounds how long after a restart a container may lack a
	// live lease.
	const settleTime = 7 * time.Second
	dir, instance := newDataDir(t)
	addr := freeAddr(t)
	p := startProc(t, dir, addr)

	var ready []*orchv1.Lease
	for i := range 3 {
		ready = append(ready, p.mustAcquire(t, fmt.Sprintf("c-live-%d", i), noShellImage, "600s").GetLease())
	}
	agentToken := agentTokens(t, dir)

	for round, delay := range []time.Duration{0, 150 * time.Millisecond} {
		conv := fmt.Sprintf("c-killed-%d", round)
		acqErr := make(chan error, 1)
		go func(p *proc) {
			_, err := p.acquire(conv, noShellImage, "600s")
			acqErr <- err
		}(p)
		var pending *orchv1.Lease
		eventually(10*time.Second, 2*time.Millisecond, func() bool {
			ls, err := p.list("state=LEASE_STATE_PENDING&conversationId=" + conv)
			if err == nil && len(ls) > 0 {
				pending = ls[0]
			}
			return pending != nil
		})
		time.Sleep(delay)
		p.kill9(t)
		err := <-acqErr
		if pending == nil {
			t.Logf("round %d: never saw the lease PENDING (acquire: %v); killed anyway", round, err)
		} else {
			t.Logf("round %d: killed %s after lease %s showed PENDING; acquire: %v", round, delay, pending.GetId(), err)
		}
		if n := len(containersWith(t, runtime.LabelInstance+"="+instance, runtime.LabelConversation+"="+conv)); n > 1 {
			t.Errorf("round %d: %d containers for %s while the orchestrator is dead, want at most 1", round, n, conv)
		}

		restarted := time.Now()
		p = startProc(t, dir, addr)

		for _, l := range ready {
			got := p.mustGet(t, l.GetId())
			if got.GetState() != orchv1.LeaseState_LEASE_STATE_READY {
				t.Errorf("round %d: lease %s is %s (%s) after restart, want READY", round, l.GetId(), got.GetState(), got.GetReason())
				continue
			}
			mustExec(t, got.GetEndpoint(), agentToken(l.GetId()), agentVersionArgv...)
		}
		if pending != nil {
			switch got, code, b := p.get(t, pending.GetId()); {
			case code == http.StatusNotFound:
				// Killed between the lease entering memory (List shows it)
				// and its PENDING record being written: no record, but no
				// container either (the record is written before the
				// container is created), and its acquire never returned it.
				t.Logf("round %d: interrupted lease %s was never persisted (404 after restart)", round, pending.GetId())
			case code != http.StatusOK:
				t.Errorf("round %d: GET interrupted lease %s: HTTP %d: %s", round, pending.GetId(), code, b)
			case got.GetState() != orchv1.LeaseState_LEASE_STATE_FAILED:
				t.Errorf("round %d: interrupted lease %s is %s (%s), want FAILED", round, pending.GetId(), got.GetState(), got.GetReason())
			default:
				t.Logf("round %d: interrupted lease after restart: %s (%s)", round, got.GetState(), got.GetReason())
			}
		}
		// The interrupted conversation can be acquired again.
		r := p.mustAcquire(t, conv, noShellImage, "600s")
		mustExec(t, r.GetLease().GetEndpoint(), agentToken(r.GetLease().GetId()), agentVersionArgv...)

		// Once restart has settled, every container of this instance belongs
		// to a live lease, and the conversation has exactly one. The engine
		// may finish a creation the killed process had in flight after the
		// new one has reconciled; that container must not outlive the
		// settling (the lease manager resyncs 1s and 5s after such a start).
		time.Sleep(time.Until(restarted.Add(settleTime)))
		for _, cid := range containersWith(t, runtime.LabelInstance+"="+instance) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			lid, err := dockerCLI(ctx, "inspect", "--format", `{{index .Config.Labels "`+runtime.LabelLease+`"}}`, cid)
			cancel()
			if err != nil {
				continue // removed meanwhile
			}
			l, code, _ := p.get(t, strings.TrimSpace(lid))
			if code != http.StatusOK || l.GetState() != orchv1.LeaseState_LEASE_STATE_READY || l.GetContainerId() != cid {
				t.Errorf("round %d: %s after restart, container %s (%s) of lease %s has no live lease: HTTP %d, %s, lease container %q",
					round, settleTime, cid, describeContainer(t, cid), strings.TrimSpace(lid), code, l.GetState(), l.GetContainerId())
			}
		}
		if got := containersWith(t, runtime.LabelInstance+"="+instance, runtime.LabelConversation+"="+conv); len(got) != 1 || got[0] != r.GetLease().GetContainerId() {
			t.Errorf("round %d: containers of %s after re-acquire: %v, want just %s", round, conv, got, r.GetLease().GetContainerId())
		}
		ready = append(ready, r.GetLease())
		if t.Failed() {
			return
		}
	}
	if n := len(containersWith(t, runtime.LabelInstance+"="+instance)); n != len(ready) {
		t.Errorf("%d containers of this instance, want %d (one per READY lease)", n, len(ready))
	}
}

// describeContainer says what state a container is in and since when.
func describeContainer(t *testing.T, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := dockerCLI(ctx, "inspect", "--format", "{{.Name}} {{.State.Status}} created {{.Created}} started {{.State.StartedAt}}", id)
	if err != nil {
		return "inspect: " + strings.TrimSpace(out)
	}
	return strings.TrimSpace(out)
}

// cliRun runs `orchestrator args...` against addr with the operator token
// and returns stdout, stderr and the exit code.
func cliRun(t *testing.T, addr string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, orchBin, args...)
	cmd.Env = append(hermeticEnv(), "BERTH_ADDR=http://"+addr, "BERTH_TOKEN="+operatorToken)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("orchestrator %s: %v", strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), code
}

// TestCLI drives the lease commands of the real binary against a running
// orchestrator, as a CI script would.
func TestCLI(t *testing.T) {
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	startProc(t, dir, addr)

	run := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := cliRun(t, addr, args...)
		if code != 0 {
			t.Fatalf("orchestrator %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout
	}

	// Flags go before the lease id: Go's flag package stops at the first
	// argument.
	out := run("lease", "acquire", "--conversation", "c-cli", "--image", "berth/minimal", "-o", "json")
	var acq struct {
		Lease struct {
			ID       string `json:"id"`
			State    string `json:"state"`
			Endpoint string `json:"endpoint"`
		} `json:"lease"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(out), &acq); err != nil {
		t.Fatalf("acquire -o json is not JSON: %v\n%s", err, out)
	}
	if acq.Lease.ID == "" || acq.Token == "" || acq.Lease.State != "LEASE_STATE_READY" {
		t.Fatalf("acquire -o json: id %q token %t state %q\n%s", acq.Lease.ID, acq.Token != "", acq.Lease.State, out)
	}
	id := acq.Lease.ID
	res := mustExec(t, acq.Lease.Endpoint, agentTokens(t, dir)(id), "sh", "-c", "echo from-cli")
	if res.Stdout != "from-cli\n" {
		t.Errorf("exec: stdout %q", res.Stdout)
	}

	var l orchv1.Lease
	if err := decode([]byte(run("lease", "get", "-o", "json", id)), &l); err != nil {
		t.Fatal(err)
	}
	if l.GetId() != id || l.GetState() != orchv1.LeaseState_LEASE_STATE_READY {
		t.Errorf("get: %s %s", l.GetId(), l.GetState())
	}
	if table := run("lease", "get", id); !strings.Contains(table, id) || !strings.Contains(table, "READY") {
		t.Errorf("get (table) lacks the id or READY:\n%s", table)
	}

	var list orchv1.ListLeasesResponse
	if err := decode([]byte(run("lease", "list", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.GetLeases()) != 1 || list.GetLeases()[0].GetId() != id {
		t.Errorf("list: %v, want just %s", list.GetLeases(), id)
	}
	if table := run("lease", "list"); !strings.Contains(table, id) {
		t.Errorf("list (table) lacks %s:\n%s", id, table)
	}

	before := l.GetExpiresAt().AsTime()
	if err := decode([]byte(run("lease", "renew", "--ttl", "20m", "-o", "json", id)), &l); err != nil {
		t.Fatal(err)
	}
	if l.GetTtl().AsDuration() != 20*time.Minute || !l.GetExpiresAt().AsTime().After(before) {
		t.Errorf("renew --ttl 20m: ttl %s, expires_at %s (was %s)", l.GetTtl().AsDuration(), l.GetExpiresAt().AsTime(), before)
	}

	if err := decode([]byte(run("lease", "release", "-o", "json", id)), &l); err != nil {
		t.Fatal(err)
	}
	if l.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
		t.Errorf("release: %s, want RELEASED", l.GetState())
	}
	if !containerGone(t, l.GetContainerId()) {
		t.Errorf("container %s still exists after release", l.GetContainerId())
	}

	stdout, stderr, code := cliRun(t, addr, "lease", "get", "nonexistent")
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if code == 0 || stdout != "" || len(lines) != 1 || lines[0] == "" {
		t.Errorf("lease get nonexistent: exit %d, stdout %q, stderr %q; want non-zero, nothing, one line", code, stdout, stderr)
	}
	t.Logf("lease get nonexistent: exit %d: %s", code, strings.TrimSpace(stderr))
}
