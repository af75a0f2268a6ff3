package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/kubernetes"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// Warm pools shared by the replicas of a fleet on the test cluster
// (docs/pools.md "Several replicas, one fleet"): real `orchestrator serve`
// replicas on the kubernetes runtime and the cluster lease store.

// poolPods returns the Pods of warm pool name, by the admin view.
func poolPods(t *testing.T, rt *kubernetes.Runtime, name string) []runtime.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sbs, err := rt.List(ctx, runtime.Selector{runtime.LabelPool: name})
	if err != nil {
		t.Fatalf("list the pods of pool %s: %v", name, err)
	}
	return sbs
}

// unclaimedRunning counts the running, unclaimed members among sbs.
func unclaimedRunning(sbs []runtime.Sandbox) int {
	n := 0
	for _, sb := range sbs {
		if sb.State == runtime.StateRunning && sb.Labels[runtime.LabelPoolClaim] == "" {
			n++
		}
	}
	return n
}

// acquireEnv acquires conversation conv on r with env var POOL_I=i.
func (r *fleetReplica) acquireEnv(conv string, i int) (*orchv1.AcquireResponse, error) {
	code, _, b, err := r.call(http.MethodPost, "/v1/leases", map[string]any{"conversationId": conv, "image": minimalImage, "ttl": "300s",
		"env": map[string]string{"POOL_I": fmt.Sprint(i)}})
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("acquire %s on %s: HTTP %d: %s", conv, r.name, code, b)
	}
	var res orchv1.AcquireResponse
	return &res, decode(b, &res)
}

// TestKubernetesPoolReplicas: one warm pool shared by two replicas.
//   - only the elected replica creates members; both hand them out;
//   - concurrent acquires on both replicas claim each member once (no two
//     leases share a Pod), each claimed Pod becomes its claimer's (claim
//     and instance labels), and its agent has the lease's env (Configure);
//   - a replica killed with kill -9 mid-claim leaves no member claimed
//     twice and none leaked: a member it claimed without recording a lease
//     is removed by the elected replica after the claim grace, every other
//     claimed Pod is a recorded lease's, and the pool refills.
func TestKubernetesPoolReplicas(t *testing.T) {
	pool := "p-" + randHex(4)
	const size = 4
	reps, rt, fleet := k8sFleet(t, 2, "BERTH_POOLS=name="+pool+",image="+minimalImage+fmt.Sprintf(",min=%d,max=%d", size, size),
		"BERTH_POOL_CLAIM_GRACE=3s")
	byName := map[string]*fleetReplica{reps[0].name: reps[0], reps[1].name: reps[1]}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var leader string
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
		l, err := rt.LeaderOf(ctx, kubernetes.LeaderLeaseOf(fleet))
		leader = l
		return err == nil && byName[l] != nil
	}) {
		t.Fatalf("no replica of fleet %s is elected (holder %q)", fleet, leader)
	}
	elected := byName[leader]
	other := reps[0]
	if other == elected {
		other = reps[1]
	}
	filled := func(t *testing.T) {
		t.Helper()
		if !eventually(120*time.Second, 100*time.Millisecond, func() bool { return unclaimedRunning(poolPods(t, rt, pool)) == size }) {
			t.Fatalf("pool %s: %d running unclaimed members, want %d: %+v", pool, unclaimedRunning(poolPods(t, rt, pool)), size, poolPods(t, rt, pool))
		}
	}
	filled(t)
	for _, sb := range poolPods(t, rt, pool) {
		if sb.InstanceID != elected.name {
			t.Fatalf("member %s created by %q, want the elected replica %s", sb.ID, sb.InstanceID, elected.name)
		}
	}

	t.Run("ConcurrentClaims", func(t *testing.T) {
		for _, r := range reps { // each replica's view of the fleet's members, not only the cluster's
			waitPoolMetric(t, r.api, pool, size)
		}
		const n = 2 * size
		res := make([]*orchv1.AcquireResponse, n)
		var wg sync.WaitGroup
		began := time.Now()
		for i := range n {
			r := reps[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if res[i], err = r.acquireEnv(fmt.Sprintf("pool-%s-%d", randHex(3), i), i); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		t.Logf("%d concurrent acquires on 2 replicas with %d warm members: %s", n, size, time.Since(began).Round(time.Millisecond))
		pods := map[string]string{}
		warm := 0
		for i, r := range res {
			l := r.GetLease()
			if prev, ok := pods[l.GetContainerId()]; ok {
				t.Fatalf("leases %s and %s share Pod %s", prev, l.GetId(), l.GetContainerId())
			}
			pods[l.GetContainerId()] = l.GetId()
			home := reps[i%2]
			if l.GetPool() == pool {
				warm++
				sbs := podsOf(t, rt, l.GetId())
				if len(sbs) != 1 || sbs[0].Labels[runtime.LabelPoolClaim] != home.name || sbs[0].InstanceID != home.name {
					t.Fatalf("warm lease %s acquired on %s: pods %+v, want one claimed by and belonging to %s", l.GetId(), home.name, sbs, home.name)
				}
			}
			out := home.mustProxyExec(t, l.GetId(), r.GetToken(), "sh", "-c", "echo $POOL_I")
			if want := fmt.Sprintf("%d\n", i); out.Stdout != want {
				t.Errorf("lease %s (pool %q): POOL_I=%q, want %q", l.GetId(), l.GetPool(), out.Stdout, want)
			}
		}
		if warm == 0 {
			t.Fatalf("no acquire claimed a warm member")
		}
		t.Logf("%d of %d leases claimed from the pool", warm, n)
		for i, r := range res {
			reps[(i+1)%2].mustRelease(t, r.GetLease().GetId()) // through the replica that is not its home
		}
		if !eventually(60*time.Second, 100*time.Millisecond, func() bool {
			for _, r := range res {
				if len(podsOf(t, rt, r.GetLease().GetId())) != 0 {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("released leases' Pods not removed")
		}
		filled(t)
	})

	t.Run("Kill9MidClaim", func(t *testing.T) {
		victim, survivor := other, elected
		// The victim hands out members from its own view of the fleet's,
		// which follows the cluster's within its sync interval (about a
		// second): right after the refill it may not have them yet, and
		// its acquires would all go cold.
		waitPoolMetric(t, victim.api, pool, size)
		// The state a kill -9 between the claim and the lease record
		// leaves, made certain: one member claimed in the victim's name.
		members := poolPods(t, rt, pool)
		staged := members[0]
		if err := rt.ClaimMember(ctx, staged.ID, victim.name); err != nil {
			t.Fatalf("claim %s as %s: %v", staged.ID, victim.name, err)
		}
		// And the real thing: a burst of acquires on the victim, killed as
		// soon as one of its own claims shows.
		const n = size
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = victim.acquireEnv(fmt.Sprintf("kill-%s-%d", randHex(3), i), i) // cut by the kill
			}()
		}
		if !eventually(60*time.Second, 5*time.Millisecond, func() bool {
			for _, sb := range poolPods(t, rt, pool) {
				if sb.ID != staged.ID && sb.Labels[runtime.LabelPoolClaim] == victim.name {
					return true
				}
			}
			return false
		}) {
			t.Fatalf("no claim by %s showed", victim.name)
		}
		victim.kill9(t)
		wg.Wait()
		claimedAtKill := 0
		for _, sb := range poolPods(t, rt, pool) {
			if sb.Labels[runtime.LabelPoolClaim] == victim.name {
				claimedAtKill++
			}
		}
		t.Logf("%s killed with %d members claimed in its name (1 staged)", victim.name, claimedAtKill)

		// No member leaked: every claimed Pod left is a recorded lease's
		// (the survivor knows it); the unrecorded claims are removed.
		began := time.Now()
		var bad []string
		if !eventually(60*time.Second, 200*time.Millisecond, func() bool {
			bad = nil
			for _, sb := range poolPods(t, rt, pool) {
				if sb.Labels[runtime.LabelPoolClaim] != "" && survivor.leaseState(sb.LeaseID) == "" {
					bad = append(bad, sb.ID)
				}
			}
			return len(bad) == 0
		}) {
			t.Fatalf("claimed Pods without a lease record still there: %v", bad)
		}
		t.Logf("unrecorded claims removed by %s %s after the kill (claim grace 3 s)", survivor.name, time.Since(began).Round(time.Millisecond))
		if len(podsOf(t, rt, staged.LeaseID)) != 0 {
			t.Fatalf("the staged claim %s was not removed", staged.ID)
		}
		// None claimed twice: the survivor's acquires take unclaimed
		// members only, each once.
		filled(t)
		seen := map[string]bool{}
		for i := range size {
			res, err := survivor.acquireEnv(fmt.Sprintf("after-%s-%d", randHex(3), i), i)
			if err != nil {
				t.Fatal(err)
			}
			l := res.GetLease()
			if seen[l.GetContainerId()] || l.GetId() == staged.LeaseID {
				t.Fatalf("Pod %s handed out twice (lease %s)", l.GetContainerId(), l.GetId())
			}
			seen[l.GetContainerId()] = true
			survivor.mustRelease(t, l.GetId())
		}
		filled(t)
	})
}
