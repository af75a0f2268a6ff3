package e2e

import (
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc/codes"
)

// TestFaults checks the lease API's answers to bad requests and to
// sandboxes dying behind its back, on one in-process orchestrator.
func TestFaults(t *testing.T) {
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)

	// wantErr posts an acquire and checks HTTP status, gRPC code and that
	// the message contains every one of words.
	wantErr := func(t *testing.T, body string, status int, code codes.Code, words ...string) errBody {
		t.Helper()
		st, _, b := o.mustCall(t, http.MethodPost, "/v1/leases", body)
		if st != status {
			t.Fatalf("POST /v1/leases %s: HTTP %d, want %d: %s", body, st, status, b)
		}
		e := parseErr(t, b)
		if e.Code != int(code) {
			t.Errorf("POST /v1/leases %s: code %d, want %d (%s)", body, e.Code, code, code)
		}
		for _, w := range words {
			if !strings.Contains(e.Message, w) {
				t.Errorf("POST /v1/leases %s: message %q does not mention %q", body, e.Message, w)
			}
		}
		return e
	}

	t.Run("invalid image reference", func(t *testing.T) {
		for i, img := range []string{"not an image", "Invalid/UPPER:tag", "berth/base:", "a//b"} {
			body := `{"conversationId":"c-badimg-` + strconv.Itoa(i) + `","image":"` + img + `"}`
			e := wantErr(t, body, http.StatusBadRequest, codes.InvalidArgument, "image")
			t.Logf("%q → %s", img, e.Message)
		}
	})

	t.Run("image not present", func(t *testing.T) {
		img := "berth-e2e/no-such-image:" + runID
		e := wantErr(t, `{"conversationId":"c-noimg","image":"`+img+`"}`, http.StatusNotFound, codes.NotFound, "make images", img)
		t.Logf("→ %s", e.Message)
		// The failed lease is recorded as FAILED, and no container is left.
		ls, err := o.list("conversationId=c-noimg&includeEnded=true")
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) != 1 || ls[0].GetState() != orchv1.LeaseState_LEASE_STATE_FAILED {
			t.Errorf("leases of c-noimg: %v, want one FAILED", ls)
		}
	})

	t.Run("ttl 0s takes the default", func(t *testing.T) {
		r := o.mustAcquire(t, "c-ttl0", noShellImage, "0s")
		l := r.GetLease()
		def := time.Duration(orchestrator.Defaults().DefaultTTL)
		if got := l.GetTtl().AsDuration(); got != def {
			t.Errorf("ttl 0s: lease ttl %s, want the default %s", got, def)
		}
		if left := time.Until(l.GetExpiresAt().AsTime()); left < def-time.Minute || left > def {
			t.Errorf("ttl 0s: expires in %s, want about %s", left, def)
		}
		t.Logf("ttl \"0s\" → lease ttl %s (DefaultTTL), expires in %s", l.GetTtl().AsDuration(), time.Until(l.GetExpiresAt().AsTime()).Round(time.Second))
		o.mustRelease(t, l.GetId())
	})

	t.Run("negative ttl", func(t *testing.T) {
		e := wantErr(t, `{"conversationId":"c-negttl","image":"`+noShellImage+`","ttl":"-5s"}`, http.StatusBadRequest, codes.InvalidArgument, "ttl")
		t.Logf("→ %s", e.Message)
	})

	t.Run("huge ttl", func(t *testing.T) {
		// 999999h in protojson's form (seconds): refused by the lease
		// manager, naming ttl.
		e := wantErr(t, `{"conversationId":"c-hugettl","image":"`+noShellImage+`","ttl":"3599996400s"}`, http.StatusBadRequest, codes.InvalidArgument, "ttl")
		t.Logf("3599996400s → %s", e.Message)
		// Go's duration form is no JSON duration: refused when the body is
		// decoded, naming the field and the accepted form.
		e = wantErr(t, `{"conversationId":"c-hugettl","image":"`+noShellImage+`","ttl":"999999h"}`, http.StatusBadRequest, codes.InvalidArgument, "ttl")
		if !strings.Contains(e.Message, `"600s"`) {
			t.Errorf("999999h → %q, want a hint at the seconds form", e.Message)
		}
	})

	t.Run("unknown lease", func(t *testing.T) {
		for _, id := range []string{"0123456789abcdefghijklmnop", "nonexistent"} {
			for _, req := range []struct{ method, path, body string }{
				{http.MethodGet, "/v1/leases/" + id, ""},
				{http.MethodDelete, "/v1/leases/" + id, ""},
				{http.MethodPost, "/v1/leases/" + id + ":renew", "{}"},
			} {
				var body any
				if req.body != "" {
					body = req.body
				}
				st, _, b := o.mustCall(t, req.method, req.path, body)
				if st != http.StatusNotFound || parseErr(t, b).Code != int(codes.NotFound) {
					t.Errorf("%s %s: HTTP %d: %s; want 404 NOT_FOUND", req.method, req.path, st, b)
				}
			}
		}
	})

	t.Run("release twice", func(t *testing.T) {
		l := o.mustAcquire(t, "c-rel2", noShellImage, "600s").GetLease()
		first := o.mustRelease(t, l.GetId())
		second := o.mustRelease(t, l.GetId())
		if first.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED || second.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
			t.Fatalf("states %s, %s; want RELEASED twice", first.GetState(), second.GetState())
		}
		if !first.GetEndedAt().AsTime().Equal(second.GetEndedAt().AsTime()) || !first.GetUpdatedAt().AsTime().Equal(second.GetUpdatedAt().AsTime()) ||
			first.GetReason() != second.GetReason() || len(first.GetTransitions()) != len(second.GetTransitions()) {
			t.Errorf("second release changed the lease:\nfirst  %v\nsecond %v", first, second)
		}
	})

	t.Run("renew after expiry", func(t *testing.T) {
		l := o.mustAcquire(t, "c-renew-late", noShellImage, "1s").GetLease()
		time.Sleep(time.Until(l.GetExpiresAt().AsTime()) + 50*time.Millisecond)
		st, _, b := o.mustCall(t, http.MethodPost, "/v1/leases/"+l.GetId()+":renew", `{"ttl":"60s"}`)
		if st != http.StatusBadRequest {
			t.Fatalf("renew after expiry: HTTP %d, want 400: %s", st, b)
		}
		e := parseErr(t, b)
		if e.Code != int(codes.FailedPrecondition) || !strings.Contains(e.Message, "EXPIRED") {
			t.Errorf("renew after expiry: code %d %q, want FAILED_PRECONDITION naming EXPIRED", e.Code, e.Message)
		}
		t.Logf("→ %s", e.Message)
	})

	t.Run("container killed behind the back", func(t *testing.T) {
		l := o.mustAcquire(t, "c-killed-ctr", noShellImage, "600s").GetLease()
		var got *orchv1.Lease
		// The first three kills (the default Restart.Limit within 10m) are
		// answered with a restart in place; the fourth fails the lease.
		for i := 1; i <= 3; i++ {
			killed := time.Now()
			mustDocker(t, "kill", l.GetContainerId())
			if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
				got = o.mustGet(t, l.GetId())
				return got.GetState() == orchv1.LeaseState_LEASE_STATE_READY && got.GetRestarts() == int32(i)
			}) {
				t.Fatalf("10s after docker kill %d the lease is %s (%s) with %d restarts, want READY after restart %d",
					i, got.GetState(), got.GetReason(), got.GetRestarts(), i)
			}
			t.Logf("kill %d: READY again %s after docker kill: %q", i, time.Since(killed).Round(time.Millisecond), got.GetReason())
			if got.GetContainerId() != l.GetContainerId() || got.GetReason() != "restarted after exit 137" {
				t.Errorf("after kill %d: container %s reason %q, want the same container %s and \"restarted after exit 137\"",
					i, got.GetContainerId(), got.GetReason(), l.GetContainerId())
			}
		}
		killed := time.Now()
		mustDocker(t, "kill", l.GetContainerId())
		if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
			got = o.mustGet(t, l.GetId())
			return got.GetState() == orchv1.LeaseState_LEASE_STATE_FAILED
		}) {
			t.Fatalf("10s after the 4th docker kill the lease is %s (%s), want FAILED", got.GetState(), got.GetReason())
		}
		t.Logf("FAILED %s after the 4th docker kill: %q", time.Since(killed).Round(time.Millisecond), got.GetReason())
		if time.Since(killed) > 5*time.Second {
			t.Errorf("FAILED only %s after the kill, want within a few seconds", time.Since(killed).Round(time.Millisecond))
		}
		if !strings.Contains(got.GetReason(), "137") || !strings.Contains(got.GetReason(), "restart limit reached") {
			t.Errorf("reason %q does not mention the exit code 137 and the restart limit", got.GetReason())
		}
		// What is left of it is removed.
		if !eventually(10*time.Second, 50*time.Millisecond, func() bool { return containerGone(t, l.GetContainerId()) }) {
			t.Errorf("killed container %s not removed", l.GetContainerId())
		}
		// The conversation can start over.
		r := o.mustAcquire(t, "c-killed-ctr", noShellImage, "600s")
		if r.GetLease().GetId() == l.GetId() || !r.GetCreated() {
			t.Errorf("acquire after failure: lease %s created %t, want a new lease", r.GetLease().GetId(), r.GetCreated())
		}
	})
}

// TestMaxLeases: with MaxLeases 1 a second live lease is refused with HTTP
// 429 and a Retry-After header.
func TestMaxLeases(t *testing.T) {
	dir, _ := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) { c.Admission.MaxLive = 1 })
	first := o.mustAcquire(t, "c-max-1", noShellImage, "600s").GetLease()

	st, h, b := o.mustCall(t, http.MethodPost, "/v1/leases", acquireReq{ConversationID: "c-max-2", Image: noShellImage})
	if st != http.StatusTooManyRequests {
		t.Fatalf("second lease: HTTP %d, want 429: %s", st, b)
	}
	if e := parseErr(t, b); e.Code != int(codes.ResourceExhausted) {
		t.Errorf("second lease: code %d, want RESOURCE_EXHAUSTED", e.Code)
	}
	ra := h.Get("Retry-After")
	if n, err := strconv.Atoi(ra); err != nil || n < 1 {
		t.Errorf("Retry-After %q, want a positive number of seconds", ra)
	}
	t.Logf("429 Retry-After: %s; %s", ra, b)

	// The same conversation still gets its lease: that is no new lease.
	if r := o.mustAcquire(t, "c-max-1", noShellImage, "600s"); r.GetLease().GetId() != first.GetId() {
		t.Errorf("re-acquire of c-max-1 at the limit: lease %s, want %s", r.GetLease().GetId(), first.GetId())
	}
	o.mustRelease(t, first.GetId())
	o.mustAcquire(t, "c-max-2", noShellImage, "600s")
}

// TestDockerUnreachable: `orchestrator serve` with an unreachable Docker
// Engine exits non-zero with a one-line error that names Docker.
func TestDockerUnreachable(t *testing.T) {
	requireDocker(t) // for the built binary
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, orchBin, "serve", "--listen", freeAddr(t), "--data-dir", filepath.Join(t.TempDir(), "data"), "--agent-binary", agentBin)
	cmd.Env = append(hermeticEnv(), "DOCKER_HOST=unix:///nonexistent.sock", "BERTH_OPERATOR_TOKEN="+operatorToken)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("orchestrator did not exit within a minute with Docker unreachable")
	}
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() == 0 {
		t.Fatalf("exit: %v, want a non-zero exit code", err)
	}
	lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
	if len(lines) != 1 || !strings.Contains(strings.ToLower(lines[0]), "docker") {
		t.Errorf("stderr: want one line mentioning Docker, got %d lines:\n%s", len(lines), stderr.String())
	}
	t.Logf("exit %d after %s; stderr: %s", ee.ExitCode(), time.Since(t0).Round(time.Millisecond), stderr.String())
}
