package e2e

import (
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/kubernetes"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// Several orchestrator replicas serving one fleet on the test cluster
// (docs/kubernetes.md "Several replicas, one fleet"): real `orchestrator
// serve` processes on the kubernetes runtime and the cluster lease store,
// as the ServiceAccount of deploy/kubernetes, in a fleet of their own (so
// other tests' orchestrators in the namespace are not part of it).

// fleetReplica is one `orchestrator serve` replica of a test fleet.
type fleetReplica struct {
	*proc
	name, dataDir, addr string
	env                 []string
}

// k8sFleet starts n replicas (r1, r2, ...) of a new fleet, with extra
// environment variables extra, and returns them with an admin view of the
// namespace's Pods. Every lease of the fleet is reaped when the test ends,
// and its warm pools' members are removed once the replicas are gone.
func k8sFleet(t *testing.T, n int, extra ...string) ([]*fleetReplica, *kubernetes.Runtime, string) {
	t.Helper()
	dir := k8sDir(t)
	if out, err := exec.Command("../scripts/k8s/agent-image.sh").CombinedOutput(); err != nil {
		t.Fatalf("agent image: %v\n%s", err, out)
	}
	k8sLoad(t, minimalImage)
	fleet := "e2e-" + randHex(4)
	rt, err := kubernetes.New(context.Background(), kubernetes.Config{
		Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), NodeName: "localhost",
		AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever,
		LeaderLease: kubernetes.LeaderLeaseOf(fleet), Logger: discardLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	// Last, once the replicas are gone: the fleet's records and leader
	// Lease (ended records would otherwise wait for a leader to purge them).
	t.Cleanup(func() { k8sForgetFleet(t, dir, fleet) })
	var reps []*fleetReplica
	// Before that, once the replicas are gone: the warm pools' members
	// (whichever replica created or claimed them).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, r := range reps {
			removePoolMembers(ctx, t, rt, r.name)
		}
	})
	for i := range n {
		name := fleet + "-r" + string(rune('1'+i))
		r := &fleetReplica{name: name, dataDir: t.TempDir(), addr: freeAddr(t), env: []string{
			"BERTH_RUNTIME=kubernetes", "BERTH_KUBECONFIG=" + filepath.Join(dir, "berth.kubeconfig"),
			"BERTH_K8S_NODE=localhost", "BERTH_K8S_PULL_POLICY=Never", "BERTH_DEFAULT_IMAGE=" + minimalImage,
			"BERTH_INSTANCE_ID=" + name, "BERTH_FLEET=" + fleet, "BERTH_LEADER_LEASE_DURATION=4s",
		}}
		r.env = append(r.env, extra...)
		// The kubernetes runtime programs no host egress rules; should a
		// regression make it, they go with the test.
		t.Cleanup(func() {
			if err := egress.RemoveInstance(context.Background(), name); err != nil {
				t.Errorf("cleanup: egress rules of %s: %v", name, err)
			}
		})
		r.proc = startProc(t, r.dataDir, r.addr, r.env...)
		reps = append(reps, r)
	}
	t.Cleanup(func() {
		for _, r := range reps {
			if code, _, b, err := r.call(http.MethodPost, "/v1/leases:reap", `{"all":true}`); err == nil {
				if code != http.StatusOK {
					t.Errorf("cleanup: reap all on %s: HTTP %d: %s", r.name, code, b)
				}
				// The replica that answered stays up until the leases'
				// Pods are gone: a replica restarted by a test is stopped
				// before this cleanup runs (its stop was registered later),
				// so the removal of its leases' Pods may fall to this one.
				if !eventually(2*time.Minute, 200*time.Millisecond, func() bool { return len(leasePods(rt, reps)) == 0 }) {
					t.Errorf("cleanup: leases' pods of fleet %s still there after reap all on %s: %v", fleet, r.name, leasePods(rt, reps))
				}
				return
			}
		}
		t.Errorf("cleanup: no replica of fleet %s answered to reap its leases", fleet)
	})
	return reps, rt, fleet
}

// leasePods lists the ids of the fleet's Pods that belong to a lease (all
// but unclaimed warm pool members), or an error's text when listing fails.
func leasePods(rt *kubernetes.Runtime, reps []*fleetReplica) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for _, r := range reps {
		sbs, err := rt.List(ctx, runtime.Selector{runtime.LabelInstance: r.name})
		if err != nil {
			return []string{"list: " + err.Error()}
		}
		for _, sb := range sbs {
			if sb.Labels[runtime.LabelPool] == "" || sb.Labels[runtime.LabelPoolClaim] != "" {
				ids = append(ids, sb.ID)
			}
		}
	}
	return ids
}

// restart starts the replica again under the same instance id and data
// dir; it is stopped when t ends.
func (r *fleetReplica) restart(t *testing.T) {
	t.Helper()
	r.proc = startProc(t, r.dataDir, r.addr, r.env...)
}

// leaseState is the lease's state as replica r reports it ("" on error),
// without the LEASE_STATE_ prefix.
func (r *fleetReplica) leaseState(id string) string {
	code, _, b, err := r.call(http.MethodGet, "/v1/leases/"+id, nil)
	if err != nil || code != http.StatusOK {
		return ""
	}
	var l orchv1.Lease
	if decode(b, &l) != nil {
		return ""
	}
	return strings.TrimPrefix(l.GetState().String(), "LEASE_STATE_")
}

// podsOf lists the berth Pods of lease id.
func podsOf(t *testing.T, rt *kubernetes.Runtime, id string) []runtime.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sbs, err := rt.List(ctx, runtime.Selector{runtime.LabelLease: id})
	if err != nil {
		t.Fatalf("list pods of %s: %v", id, err)
	}
	return sbs
}

// TestKubernetesReplicas: two replicas of one fleet.
//   - acquires of one conversation sent to both at once give one lease
//     and one Pod; each replica's proxy serves it with its token;
//   - a release through the replica that did not create it ends it on
//     both and removes the Pod;
//   - killing the elected replica (kill -9) moves expiry to the other
//     within seconds (leader Lease of 4 s);
//   - a replica restarted after kill -9 under its instance id serves its
//     leases again, and the other served them meanwhile.
func TestKubernetesReplicas(t *testing.T) {
	reps, rt, fleet := k8sFleet(t, 2)
	r1, r2 := reps[0], reps[1]
	top := t // restarted replicas live until the whole test ends

	t.Run("ConcurrentAcquire", func(t *testing.T) {
		conv := "fleet-conv-" + randHex(4)
		const each = 3
		var wg sync.WaitGroup
		ids, toks := make([]string, 2*each), make([]string, 2*each)
		began := time.Now()
		for i := range ids {
			r := reps[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := r.acquire(conv, minimalImage, "300s")
				if err != nil {
					t.Errorf("acquire on %s: %v", r.name, err)
					return
				}
				ids[i], toks[i] = res.GetLease().GetId(), res.GetToken()
			}()
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		t.Logf("%d concurrent acquires of one conversation on 2 replicas: %s", len(ids), time.Since(began).Round(time.Millisecond))
		for i := range ids {
			if ids[i] != ids[0] || toks[i] != toks[0] {
				t.Fatalf("acquires of one conversation got leases %v", ids)
			}
		}
		if pods := podsOf(t, rt, ids[0]); len(pods) != 1 {
			t.Fatalf("lease %s has %d pods, want 1: %+v", ids[0], len(pods), pods)
		}
		for _, r := range reps {
			out := r.mustProxyExec(t, ids[0], toks[0], "sh", "-c", "echo served")
			if out.Stdout != "served\n" {
				t.Errorf("exec through %s's proxy: %q", r.name, out.Stdout)
			}
		}
		// Release through the replica that is not the home of the lease
		// (either is fine: the other replica must follow).
		r2.mustRelease(t, ids[0])
		if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
			return r1.leaseState(ids[0]) == "RELEASED" && len(podsOf(t, rt, ids[0])) == 0
		}) {
			t.Fatalf("after release on %s: state on %s %q, pods %d", r2.name, r1.name, r1.leaseState(ids[0]), len(podsOf(t, rt, ids[0])))
		}
	})

	t.Run("LeaderDies", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var leader string
		if !eventually(20*time.Second, 100*time.Millisecond, func() bool {
			l, err := rt.LeaderOf(ctx, kubernetes.LeaderLeaseOf(fleet))
			leader = l
			return err == nil && (l == r1.name || l == r2.name)
		}) {
			t.Fatalf("no replica of fleet %s is elected (holder %q)", fleet, leader)
		}
		dead, survivor := r1, r2
		if leader == r2.name {
			dead, survivor = r2, r1
		}
		res := survivor.mustAcquire(t, "fleet-ttl-"+randHex(4), minimalImage, "12s")
		id := res.GetLease().GetId()
		killed := time.Now()
		dead.kill9(t)
		if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
			l, err := rt.LeaderOf(ctx, kubernetes.LeaderLeaseOf(fleet))
			return err == nil && l == survivor.name
		}) {
			t.Fatalf("%s not elected within 30 s of killing %s", survivor.name, dead.name)
		}
		t.Logf("takeover: %s elected %s after kill -9 of %s (leader Lease 4 s)", survivor.name, time.Since(killed).Round(time.Millisecond), dead.name)
		expiresAt := res.GetLease().GetExpiresAt().AsTime()
		if !eventually(60*time.Second, 100*time.Millisecond, func() bool { return survivor.leaseState(id) == "EXPIRED" }) {
			t.Fatalf("lease %s not EXPIRED on %s (state %q)", id, survivor.name, survivor.leaseState(id))
		}
		t.Logf("expiry on the new leader: %s after the lease's end", time.Since(expiresAt).Round(time.Millisecond))
		if late := time.Since(expiresAt); late > 10*time.Second {
			t.Errorf("lease expired %s after its end, want within seconds", late)
		}
		dead.restart(top) // for the next subtest
	})

	t.Run("KillRestart", func(t *testing.T) {
		res := r1.mustAcquire(t, "fleet-home-"+randHex(4), minimalImage, "300s")
		id, tok := res.GetLease().GetId(), res.GetToken()
		r1.mustProxyExec(t, id, tok, "sh", "-c", "echo before > /workspace/kept.txt")
		r1.kill9(t)
		// The other replica serves the lease while its home is down.
		if out := r2.mustProxyExec(t, id, tok, "cat", "/workspace/kept.txt"); out.Stdout != "before\n" {
			t.Errorf("exec through %s while %s is down: %q", r2.name, r1.name, out.Stdout)
		}
		began := time.Now()
		r1.restart(top)
		t.Logf("%s restarted after kill -9 in %s", r1.name, time.Since(began).Round(time.Millisecond))
		// The restarted replica may find the Pod's status behind its
		// container (the kubelet reports a started container a moment
		// later) and restart the sandbox in place at once, which is
		// PENDING for a few milliseconds: READY is what it must reach, in
		// the same Pod (checked below).
		if !eventually(30*time.Second, 10*time.Millisecond, func() bool { return r1.leaseState(id) == "READY" }) {
			t.Fatalf("lease %s on the restarted %s: %q, want READY", id, r1.name, r1.leaseState(id))
		}
		if out := r1.mustProxyExec(t, id, tok, "cat", "/workspace/kept.txt"); out.Stdout != "before\n" {
			t.Errorf("exec through the restarted %s: %q", r1.name, out.Stdout)
		}
		if pods := podsOf(t, rt, id); len(pods) != 1 || pods[0].ID != res.GetLease().GetContainerId() {
			t.Errorf("after the restart: pods %+v, want the one Pod %s", pods, res.GetLease().GetContainerId())
		}
	})
}

// removePoolMembers removes the unclaimed warm-pool members that the
// orchestrator instance created, once it is gone: they outlive an
// orchestrator by design (the next one adopts them). Pods of leases are
// left alone: the test reaps those, and one left is a leak.
func removePoolMembers(ctx context.Context, t *testing.T, rt *kubernetes.Runtime, instance string) {
	t.Helper()
	sbs, err := rt.List(ctx, runtime.Selector{runtime.LabelInstance: instance})
	if err != nil {
		t.Errorf("cleanup: list the pods of %s: %v", instance, err)
		return
	}
	for _, sb := range sbs {
		if sb.Labels[runtime.LabelPool] == "" || sb.Labels[runtime.LabelPoolClaim] != "" {
			continue
		}
		if err := rt.Remove(ctx, sb.ID); err != nil {
			t.Errorf("cleanup: remove pool member %s: %v", sb.ID, err)
		}
	}
}
