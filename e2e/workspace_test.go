package e2e

import (
	"sync/atomic"
	"testing"

	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/workspace"
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
			runRemoteConformance(t, o.api, id, tok, tr, log)
		})
	}

	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		t.Run("Leased-"+tr.String(), func(t *testing.T) {
			t.Parallel()
			runLeasedConformance(t, o.api, leasedRun{
				ConvPrefix: "c-ws-leased-" + tr.String(), Image: baseImage, Transport: tr, Log: log,
				Created: func(*testing.T, workspace.LeaseInfo) { leased.Add(1) },
				Gone: func(t *testing.T, l *orchv1.Lease) {
					if !containerGone(t, l.GetContainerId()) {
						t.Errorf("container %s of lease %s survived Close", l.GetContainerId(), l.GetId())
					}
				},
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
