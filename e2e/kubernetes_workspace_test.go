package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/workspace"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// k8sLeasedCases are the conformance subtests the Leased workspace runs on
// the Kubernetes backend: what Leased adds to Remote (a lease of its own,
// pause and resume, Close releasing it) and one exec. The others are
// Remote's operations, run in full by the Remote runs; each Leased subtest
// costs a Pod (6-7 s here), so the whole suite on Leased would add minutes
// to make test.
var k8sLeasedCases = map[string]bool{"Root": true, "ExecExitCodesAndStreams": true, "PauseResume": true, "Close": true}

// TestKubernetesWorkspaceConformance runs the workspace conformance suite
// (pkg/workspace/conformance) against berth/base sandboxes on the
// Kubernetes backend, through the in-process orchestrator's proxy, as
// TestWorkspaceConformance does on Docker:
//
//   - Remote over gRPC and over REST, each on one lease; every subtest
//     gets a fresh Remote whose Root is its own new directory under
//     /workspace (the sandbox's PersistentVolumeClaim);
//   - Leased over gRPC: each subtest of k8sLeasedCases acquires its own
//     lease with NewLeased and releases it on Close; its PauseResume
//     checks that hibernate keeps /workspace (freeze is refused on this
//     backend, which the suite accepts).
//
// The three run in parallel; every lease is released and every Pod gone
// at the end.
func TestKubernetesWorkspaceConformance(t *testing.T) {
	a, rt, _ := startK8sOrch(t)
	k8sLoad(t, baseImage)
	log := testLogger(t, "k8s-workspace")

	podGone := func(t *testing.T, pod string) bool {
		return eventually(30*time.Second, 100*time.Millisecond, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := rt.Get(ctx, pod)
			return errdefs.IsNotFound(err)
		})
	}

	var remote []*orchv1.AcquireResponse
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		r := a.mustAcquire(t, "k8s-ws-remote-"+tr.String()+"-"+randHex(3), baseImage, "1200s")
		remote = append(remote, r)
		id, tok := r.GetLease().GetId(), r.GetToken()
		t.Run("Remote-"+tr.String(), func(t *testing.T) {
			t.Parallel()
			runRemoteConformance(t, a, id, tok, tr, log)
		})
	}

	t.Run("Leased-grpc", func(t *testing.T) {
		t.Parallel()
		runLeasedConformance(t, a, leasedRun{
			ConvPrefix: "k8s-ws-leased-" + randHex(3), Image: baseImage, Transport: workspace.TransportGRPC, Log: log,
			Skip: func(name string) string {
				if k8sLeasedCases[name] {
					return ""
				}
				return name + ": run by the Remote runs on this backend (k8sLeasedCases)"
			},
			// Close released the lease; its Pod is gone.
			Gone: func(t *testing.T, l *orchv1.Lease) {
				if !podGone(t, l.GetContainerId()) {
					t.Errorf("pod %s of lease %s survived Close", l.GetContainerId(), l.GetId())
				}
			},
		})
	})

	t.Cleanup(func() {
		for _, r := range remote {
			a.mustRelease(t, r.GetLease().GetId())
			if !podGone(t, r.GetLease().GetContainerId()) {
				t.Errorf("pod %s of lease %s still there 30 s after release", r.GetLease().GetContainerId(), r.GetLease().GetId())
			}
		}
	})
}
