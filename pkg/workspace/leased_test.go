package workspace_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/workspace"
	"github.com/berth-dev/berth/pkg/workspace/conformance"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// orch is a test orchestrator plus what the probe found out about its
// proxy.
type orch struct {
	*orchtest.Server
	once     sync.Once
	restOK   bool
	grpcOK   bool
	probeErr error
}

func startOrch(t *testing.T) *orch {
	return &orch{Server: orchtest.Start(t, nil)}
}

// probe acquires a throwaway lease and asks the proxy for its sandbox:
// GET {base}/v1/sandboxes/{lease}/healthz, and an agent GetInfo over gRPC
// with x-berth-lease. A 404 from the orchestrator's gateway (REST) or
// UNIMPLEMENTED (gRPC) means the proxy is not mounted yet.
func (o *orch) probe(t *testing.T) {
	o.once.Do(func() {
		ctx := testCtx(t)
		body := strings.NewReader(`{"conversationId": "proxy-probe"}`)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, o.Base+"/v1/leases", body)
		req.Header.Set("Authorization", "Bearer "+orchtest.OperatorToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			o.probeErr = err
			return
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var ar orchv1.AcquireResponse
		if err := protojson.Unmarshal(raw, &ar); err != nil || resp.StatusCode != http.StatusOK {
			o.probeErr = errors.New("probe acquire: " + resp.Status + ": " + string(raw))
			return
		}
		id, tok := ar.GetLease().GetId(), ar.GetToken()
		defer o.Srv.Manager().Release(context.Background(), id, "probe done")

		req, _ = http.NewRequestWithContext(ctx, http.MethodGet, o.Base+workspace.SandboxPathPrefix(id)+"/healthz", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			o.restOK = resp.StatusCode != http.StatusNotFound
		}

		conn, err := grpc.NewClient(o.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			o.probeErr = err
			return
		}
		defer conn.Close()
		gctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok, workspace.LeaseMetadataKey, id)
		_, err = agentv1.NewInfoServiceClient(conn).GetInfo(gctx, &agentv1.GetInfoRequest{})
		o.grpcOK = status.Code(err) != codes.Unimplemented
	})
	if o.probeErr != nil {
		t.Fatalf("proxy probe: %v", o.probeErr)
	}
}

// requireProxy fails t unless the orchestrator's proxy serves transport tr:
// the proxy is part of the orchestrator, so a leased workspace always goes
// through it.
func (o *orch) requireProxy(t *testing.T, tr workspace.Transport) {
	t.Helper()
	o.probe(t)
	if tr == workspace.TransportREST && !o.restOK {
		t.Fatal("the orchestrator's proxy is not mounted: GET {base}/v1/sandboxes/{lease}/healthz answered 404 from the gateway")
	}
	if tr == workspace.TransportGRPC && !o.grpcOK {
		t.Fatal("the orchestrator's proxy is not mounted: agent RPCs with x-berth-lease answer UNIMPLEMENTED")
	}
}

// config returns a LeasedConfig for conversation conv, through the
// orchestrator's proxy (which must be mounted).
func (o *orch) config(t *testing.T, conv string, tr workspace.Transport) workspace.LeasedConfig {
	t.Helper()
	o.requireProxy(t, tr)
	return workspace.LeasedConfig{
		OrchestratorAddr: o.Base, Token: orchtest.ClientAToken, ConversationID: conv,
		Transport: tr, Logger: quietLog(), ReleaseTimeout: 20 * time.Second,
	}
}

func newLeased(t *testing.T, cfg workspace.LeasedConfig) *workspace.Leased {
	t.Helper()
	ws, err := workspace.NewLeased(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("NewLeased: %v", err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func getLease(t *testing.T, o *orch, id string) lease.Lease {
	t.Helper()
	l, err := o.Srv.Manager().Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return l
}

// TestLeasedConformance runs the suite against leased workspaces that go
// through the orchestrator's proxy (it fails if the proxy is not mounted).
// Each transport has its own orchestrator and runs beside the other.
func TestLeasedConformance(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	for _, tr := range []workspace.Transport{workspace.TransportREST, workspace.TransportGRPC} {
		t.Run(tr.String(), func(t *testing.T) {
			t.Parallel()
			o := startOrch(t)
			o.requireProxy(t, tr)
			conformance.Run(t, func(t *testing.T) workspace.Workspace {
				cfg := workspace.LeasedConfig{
					OrchestratorAddr: o.Base, Token: orchtest.ClientAToken, ConversationID: "conf-" + t.Name(),
					Transport: tr, Logger: quietLog(),
				}
				return newLeased(t, cfg)
			})
		})
	}
}

// TestLeasedDirectConformance runs the suite against leased workspaces
// (acquire, renewals, release) whose calls reach the sandbox's agent
// directly, whether or not the proxy is mounted.
func TestLeasedDirectConformance(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	o := startOrch(t)
	conformance.Run(t, func(t *testing.T) workspace.Workspace {
		cfg := workspace.LeasedConfig{
			OrchestratorAddr: o.Base, Token: orchtest.ClientAToken, ConversationID: "direct-" + t.Name(),
			Logger: quietLog(), RenewEvery: 200 * time.Millisecond,
		}
		workspace.SetDirect(&cfg, func(l *orchv1.Lease) workspace.RemoteConfig {
			return workspace.RemoteConfig{Target: l.GetEndpoint(), Token: o.Srv.Manager().Tokens().AgentToken(l.GetId()), Logger: quietLog()}
		})
		return newLeased(t, cfg)
	})
}

func TestLeasedRenews(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	o := startOrch(t)
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		t.Run(tr.String(), func(t *testing.T) {
			t.Parallel()
			cfg := o.config(t, "renew-"+tr.String(), tr)
			cfg.TTL, cfg.RenewEvery = 3*time.Second, 500*time.Millisecond
			ws := newLeased(t, cfg)
			id := ws.LeaseID()
			first := getLease(t, o, id).ExpiresAt
			firstSeen := ws.Lease().ExpiresAt
			if !ws.Lease().Created || ws.LeaseToken() == "" {
				t.Fatalf("Lease() = %+v, want a created lease with a token", ws.Lease())
			}

			// A renewal moves expires_at forward: wait for it (polled until
			// a generous deadline, not a fixed sleep).
			deadline := time.Now().Add(30 * time.Second)
			for !getLease(t, o, id).ExpiresAt.After(first) {
				if time.Now().After(deadline) {
					t.Fatalf("expires_at did not move forward from %s in 30s", first)
				}
				time.Sleep(50 * time.Millisecond)
			}
			// Past the TTL of the acquire, the lease is still live.
			time.Sleep(time.Until(first) + 500*time.Millisecond)
			if l := getLease(t, o, id); l.State != lease.StateReady {
				t.Fatalf("past the acquire's 3s TTL the lease is %s: %s", l.State, l.Reason)
			}
			if !ws.Lease().ExpiresAt.After(firstSeen) {
				t.Fatalf("Lease().ExpiresAt stayed at %s", firstSeen)
			}
			res, err := ws.Exec(testCtx(t), workspace.Command{Shell: "echo alive"})
			if err != nil || res.Stdout != "alive\n" {
				t.Fatalf("Exec: %+v, %v", res, err)
			}
			if err := ws.Err(); err != nil {
				t.Fatalf("Err() = %v", err)
			}
		})
	}
}

func TestLeasedCloseReleases(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	o := startOrch(t)
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		t.Run(tr.String(), func(t *testing.T) {
			ws := newLeased(t, o.config(t, "close-"+tr.String(), tr))
			id := ws.LeaseID()
			if l := getLease(t, o, id); l.State != lease.StateReady {
				t.Fatalf("lease is %s", l.State)
			}
			if err := ws.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if l := getLease(t, o, id); l.State != lease.StateReleased {
				t.Fatalf("after Close the lease is %s (%s), want RELEASED", l.State, l.Reason)
			}
			if err := ws.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if _, err := ws.Exec(testCtx(t), workspace.Command{Shell: "true"}); !errors.Is(err, workspace.ErrClosed) {
				t.Fatalf("Exec after Close: %v", err)
			}
		})
	}
}

func TestLeasedPickupAfterRestart(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	o := startOrch(t)
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		t.Run(tr.String(), func(t *testing.T) {
			conv := "pickup-" + tr.String()
			cfg := o.config(t, conv, tr)
			cfg.KeepOnClose = true
			first := newLeased(t, cfg)
			if err := first.Upload(testCtx(t), strings.NewReader("state"), "notes.txt"); err != nil {
				t.Fatal(err)
			}
			firstLease := first.Lease()
			if !firstLease.Created {
				t.Fatal("the first workspace did not create its lease")
			}
			// The "client" goes away without releasing.
			if err := first.Close(); err != nil {
				t.Fatalf("Close with KeepOnClose: %v", err)
			}
			if l := getLease(t, o, firstLease.ID); l.State != lease.StateReady {
				t.Fatalf("KeepOnClose: the lease is %s after Close", l.State)
			}

			// The restarted client asks for the same conversation.
			second := newLeased(t, o.config(t, conv, tr))
			got := second.Lease()
			if got.ID != firstLease.ID || got.Created || got.Token != firstLease.Token {
				t.Fatalf("second workspace got lease %+v, want the first one's (%s) picked up", got, firstLease.ID)
			}
			var b strings.Builder
			if err := second.Download(testCtx(t), "notes.txt", &b); err != nil || b.String() != "state" {
				t.Fatalf("the picked-up sandbox lost its files: %q, %v", b.String(), err)
			}
			if err := second.Close(); err != nil {
				t.Fatal(err)
			}
			if l := getLease(t, o, firstLease.ID); l.State != lease.StateReleased {
				t.Fatalf("after the second Close the lease is %s", l.State)
			}
		})
	}
}

func TestLeasedLost(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	o := startOrch(t)
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		t.Run(tr.String(), func(t *testing.T) {
			cfg := o.config(t, "lost-"+tr.String(), tr)
			cfg.RenewEvery = 100 * time.Millisecond
			ws := newLeased(t, cfg)
			if _, err := o.Srv.Manager().Release(testCtx(t), ws.LeaseID(), "operator pulled it"); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for ws.Err() == nil {
				if time.Now().After(deadline) {
					t.Fatal("the renewal loop did not notice the released lease")
				}
				time.Sleep(20 * time.Millisecond)
			}
			_, err := ws.Exec(testCtx(t), workspace.Command{Shell: "true"})
			if !errors.Is(err, workspace.ErrLeaseLost) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("Exec on a lost lease: %v, want ErrLeaseLost", err)
			}
			// The renewal may meet the lease while the release is still
			// under way (RELEASING) or after it (RELEASED); either way the
			// error names the lease, its state and the operator's reason.
			msg := err.Error()
			if !strings.Contains(msg, ws.LeaseID()) || !strings.Contains(msg, "operator pulled it") ||
				!(strings.Contains(msg, "RELEASING") || strings.Contains(msg, "RELEASED")) {
				t.Fatalf("the error does not say what happened: %v", err)
			}
			if err := ws.Close(); err != nil {
				t.Fatalf("Close of a lost lease: %v", err)
			}
		})
	}
}

func TestNewLeasedErrors(t *testing.T) {
	o := startOrch(t)
	ctx := testCtx(t)
	if _, err := workspace.NewLeased(ctx, workspace.LeasedConfig{OrchestratorAddr: o.Base, Token: orchtest.ClientAToken}); !isInvalid(err) {
		t.Fatalf("no conversation id: %v", err)
	}
	if _, err := workspace.NewLeased(ctx, workspace.LeasedConfig{OrchestratorAddr: o.Base, ConversationID: "c"}); !isInvalid(err) {
		t.Fatalf("no token: %v", err)
	}
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		_, err := workspace.NewLeased(ctx, workspace.LeasedConfig{
			OrchestratorAddr: o.Base, Token: "not-a-token", ConversationID: "c", Transport: tr, Logger: quietLog(),
		})
		if !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Fatalf("%s: bad token: %v, want unauthenticated", tr, err)
		}
	}
	// Another owner's identical conversation id is its own lease: A's is
	// neither picked up nor touched.
	a := newLeased(t, o.config(t, "owned-by-a", workspace.TransportGRPC))
	cfg := o.config(t, "owned-by-a", workspace.TransportGRPC)
	cfg.Token = orchtest.ClientBToken
	if b := newLeased(t, cfg); b.LeaseID() == a.LeaseID() || getLease(t, o, b.LeaseID()).Owner != "team-b" {
		t.Fatalf("another owner's conversation: got lease %s (A's is %s)", b.LeaseID(), a.LeaseID())
	}
	if l := getLease(t, o, a.LeaseID()); l.State != lease.StateReady {
		t.Fatalf("a failed NewLeased touched another owner's lease: %s", l.State)
	}
}
