package e2e

import (
	"context"
	"fmt"
	"path"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/workspace"
	"github.com/berth-dev/berth/pkg/workspace/conformance"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestWorkspaceConformance runs the workspace conformance suite against
// real berth/base sandboxes through the in-process orchestrator's proxy:
//
//   - Remote over gRPC and Remote over REST, each on one lease (with the
//     lease token, routed by x-berth-lease metadata or the
//     /v1/sandboxes/{lease} prefix); every subtest gets a fresh Remote whose
//     Root is its own new directory under /workspace, so the suite's
//     "uncluttered Root" holds without a sandbox per subtest;
//   - Leased (gRPC, and REST): every subtest acquires its own lease with
//     NewLeased (the operator token for the lease API, the lease token
//     through the proxy) and releases it on Close.
//
// The four run in parallel. At the end every lease is released and no
// container of this orchestrator instance is left.
func TestWorkspaceConformance(t *testing.T) {
	requireImage(t, baseImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir)
	log := testLogger(t, "workspace")

	var leased atomic.Int32 // leases acquired by NewLeased
	var remoteIDs []string

	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		r := o.mustAcquire(t, "c-ws-remote-"+tr.String(), baseImage, "600s")
		id, tok := r.GetLease().GetId(), r.GetToken()
		remoteIDs = append(remoteIDs, id)
		t.Run("Remote-"+tr.String(), func(t *testing.T) {
			t.Parallel()
			var n atomic.Int32
			conformance.Run(t, func(t *testing.T) workspace.Workspace {
				root := path.Join("/workspace", fmt.Sprintf("ct-%02d", n.Add(1)))
				o.mustProxyExec(t, id, tok, "mkdir", root)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				ws, err := workspace.NewRemote(ctx, workspace.RemoteConfig{
					Target: "http://" + o.addr, Token: tok, LeaseID: id, Transport: tr, Root: root, Logger: log,
				})
				if err != nil {
					t.Fatalf("NewRemote(%s via the proxy): %v", tr, err)
				}
				t.Cleanup(func() { _ = ws.Close() })
				return ws
			})
		})
	}

	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		t.Run("Leased-"+tr.String(), func(t *testing.T) {
			t.Parallel()
			var n atomic.Int32
			conformance.Run(t, func(t *testing.T) workspace.Workspace {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				conv := fmt.Sprintf("c-ws-leased-%s-%02d", tr, n.Add(1))
				ws, err := workspace.NewLeased(ctx, workspace.LeasedConfig{
					OrchestratorAddr: "http://" + o.addr, Token: operatorToken, ConversationID: conv,
					Image: "berth/base", TTL: 10 * time.Minute, Transport: tr, Logger: log,
				})
				if err != nil {
					t.Fatalf("NewLeased(%s): %v", conv, err)
				}
				leased.Add(1)
				info := ws.Lease()
				if !info.Created || info.ID == "" || info.Token == "" {
					t.Fatalf("NewLeased(%s): lease %+v, want a new lease with a token", conv, info)
				}
				t.Cleanup(func() {
					if err := ws.Close(); err != nil {
						t.Errorf("Close of the leased workspace: %v", err)
					}
					// Close released the lease; its container is gone.
					if l := o.mustGet(t, info.ID); l.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
						t.Errorf("lease %s after Close: %s, want RELEASED", info.ID, l.GetState())
					} else if !containerGone(t, l.GetContainerId()) {
						t.Errorf("container %s of lease %s survived Close", l.GetContainerId(), info.ID)
					}
				})
				return ws
			})
		})
	}

	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		t.Logf("%d leases acquired by NewLeased, %d shared by the Remote runs", leased.Load(), len(remoteIDs))
		releaseAll(t, o, instance, remoteIDs...)
		if left := containersWith(t, runtime.LabelInstance+"="+instance); len(left) != 0 {
			t.Errorf("%d container(s) left: %v", len(left), left)
		}
	})
}
