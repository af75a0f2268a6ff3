package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestStopAndDrain runs the real binary on Docker: SIGTERM and kill -9 of
// the orchestrator leave every sandbox running and the next start adopts
// them; `orchestrator drain --mode hibernate` stops every container with
// its files kept and refuses new leases; after a restart the drained
// conversation resumes in place with its files.
func TestStopAndDrain(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	p := startProc(t, dir, addr)
	a := p.mustAcquire(t, "c-drain-a", baseImage, "600s")
	b := p.mustAcquire(t, "c-drain-b", baseImage, "600s")
	for _, r := range []*orchv1.AcquireResponse{a, b} {
		cid := r.GetLease().GetContainerId()
		t.Cleanup(func() { _, _ = dockerCLI(context.Background(), "rm", "-f", "-v", cid) })
	}
	idA, tokA, cidA := a.GetLease().GetId(), a.GetToken(), a.GetLease().GetContainerId()
	cidB := b.GetLease().GetContainerId()
	pexec(t, p.api, idA, tokA, `echo kept > /workspace/f`)

	// Stopping, gently or not, leaves the sandboxes running; the next start
	// adopts them.
	for _, stop := range []struct {
		name string
		do   func()
	}{{"SIGTERM", p.stop}, {"kill -9", func() { p.kill9(t) }}} {
		stop.do()
		for _, cid := range []string{cidA, cidB} {
			if st := dockerState(t, cid); st != "running" {
				t.Fatalf("after %s the container %s is %s, want running", stop.name, cid, st)
			}
		}
		p = startProc(t, dir, addr)
		for _, r := range []*orchv1.AcquireResponse{a, b} {
			g := p.mustGet(t, r.GetLease().GetId())
			if g.GetState() != orchv1.LeaseState_LEASE_STATE_READY || g.GetContainerId() != r.GetLease().GetContainerId() || g.GetRestarts() != 0 {
				t.Fatalf("after %s and a start: lease %s %s (%s), container %s, %d restarts; want READY, adopted as it was",
					stop.name, g.GetId(), g.GetState(), g.GetReason(), g.GetContainerId(), g.GetRestarts())
			}
		}
	}

	// Drain with the command line, as an operator would.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, orchBin, "drain", "--mode", "hibernate", "--addr", "http://"+addr)
	cmd.Env = append(hermeticEnv(), "BERTH_OPERATOR_TOKEN="+operatorToken)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil || !strings.Contains(out.String(), "drained 2 leases (hibernate), 0 failed") {
		t.Fatalf("orchestrator drain: %v\nstdout %s\nstderr %s", err, out.String(), errb.String())
	}
	for _, cid := range []string{cidA, cidB} {
		if st := dockerState(t, cid); st != "exited" {
			t.Fatalf("after the drain the container %s is %s, want exited", cid, st)
		}
	}
	code, _, body := p.mustCall(t, http.MethodPost, "/v1/leases", acquireReq{ConversationID: "c-drain-new", Image: baseImage})
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "draining") {
		t.Fatalf("acquire while draining: HTTP %d %s; want 503 saying draining", code, body)
	}

	// The host comes back: the next start adopts the hibernated leases and
	// accepts acquires; the drained conversation resumes with its files.
	p.stop()
	p = startProc(t, dir, addr)
	if g := p.mustGet(t, idA); g.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED || g.GetPaused() != "hibernate" {
		t.Fatalf("after the restart lease A is %s %q (%s), want PAUSED hibernate", g.GetState(), g.GetPaused(), g.GetReason())
	}
	r := p.mustAcquire(t, "c-drain-a", baseImage, "600s")
	if r.GetLease().GetId() != idA || r.GetCreated() {
		t.Fatalf("acquire of the drained conversation: lease %s created %v, want %s resumed", r.GetLease().GetId(), r.GetCreated(), idA)
	}
	if got, _ := pexec(t, p.api, idA, tokA, "cat /workspace/f"); got != "kept\n" {
		t.Fatalf("files after the drain and a restart: %q", got)
	}
	for _, r := range []*orchv1.AcquireResponse{a, b} {
		if l := p.mustRelease(t, r.GetLease().GetId()); l.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
			t.Errorf("release %s: %s", l.GetId(), l.GetState())
		}
	}
}
