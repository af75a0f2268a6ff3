package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/workspace"
	"github.com/berth-dev/berth/pkg/workspace/conformance"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// The workspace conformance runs of every backend (Docker, containerd,
// Kubernetes) share these two drivers; what differs per backend is the
// image, the transports, and how a sandbox is shown to be gone.

// runRemoteConformance runs the workspace conformance suite on Remote
// workspaces over tr, all on the one lease id (token tok), through a's
// proxy. Every subtest gets a fresh Remote whose Root is its own new
// directory under /workspace, so the suite's "uncluttered Root" holds
// without a sandbox per subtest.
func runRemoteConformance(t *testing.T, a *api, id, tok string, tr workspace.Transport, log *slog.Logger) {
	var n atomic.Int32
	conformance.Run(t, func(t *testing.T) workspace.Workspace {
		root := path.Join("/workspace", fmt.Sprintf("ct-%02d", n.Add(1)))
		a.mustProxyExec(t, id, tok, "mkdir", root)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ws, err := workspace.NewRemote(ctx, workspace.RemoteConfig{
			Target: "http://" + a.addr, Token: tok, LeaseID: id, Transport: tr, Root: root, Logger: log,
		})
		if err != nil {
			t.Fatalf("NewRemote(%s via the proxy): %v", tr, err)
		}
		t.Cleanup(func() { _ = ws.Close() })
		return ws
	})
}

// leasedRun is one run of the conformance suite on Leased workspaces.
type leasedRun struct {
	// ConvPrefix starts every subtest's conversation id (a counter follows).
	ConvPrefix string
	// Image is the sandbox image of every lease.
	Image string
	// Transport is the lease API's and the proxy's transport.
	Transport workspace.Transport
	// Log is the workspaces' logger.
	Log *slog.Logger
	// Skip, when set, gives a reason to skip the subtest named name ("" runs it).
	Skip func(name string) string
	// Created, when set, is told of every lease NewLeased created (to count
	// or track it), before anything about it is checked.
	Created func(t *testing.T, info workspace.LeaseInfo)
	// Gone checks that the sandbox of the released lease l is gone.
	Gone func(t *testing.T, l *orchv1.Lease)
}

// runLeasedConformance runs the workspace conformance suite on Leased
// workspaces through a: every subtest acquires its own lease with NewLeased
// (the operator token for the lease API, the lease token through the
// proxy); on its cleanup Close must release the lease and r.Gone see its
// sandbox gone.
func runLeasedConformance(t *testing.T, a *api, r leasedRun) {
	var n atomic.Int32
	conformance.Run(t, func(t *testing.T) workspace.Workspace {
		if r.Skip != nil {
			if why := r.Skip(path.Base(t.Name())); why != "" {
				t.Skip(why)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		conv := fmt.Sprintf("%s-%02d", r.ConvPrefix, n.Add(1))
		ws, err := workspace.NewLeased(ctx, workspace.LeasedConfig{
			OrchestratorAddr: "http://" + a.addr, Token: operatorToken, ConversationID: conv,
			Image: r.Image, TTL: 10 * time.Minute, Transport: r.Transport, Logger: r.Log,
		})
		if err != nil {
			t.Fatalf("NewLeased(%s): %v", conv, err)
		}
		info := ws.Lease()
		if r.Created != nil {
			r.Created(t, info)
		}
		t.Cleanup(func() {
			if err := ws.Close(); err != nil {
				t.Errorf("Close of the leased workspace: %v", err)
			}
			if l := a.mustGet(t, info.ID); l.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
				t.Errorf("lease %s after Close: %s, want RELEASED", info.ID, l.GetState())
			} else {
				r.Gone(t, l)
			}
		})
		if !info.Created || info.ID == "" || info.Token == "" {
			t.Fatalf("NewLeased(%s): lease %+v, want a new lease with a token", conv, info)
		}
		return ws
	})
}
