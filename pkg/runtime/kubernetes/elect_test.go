package kubernetes_test

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	k8s "github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// TestElection: two replicas (as the orchestrator's ServiceAccount, so the
// Role's coordination.k8s.io rule is exercised) elect one leader; when the
// leader dies without releasing the Lease, the other leads within the
// Lease's duration; a replica that stops cleanly hands over at once.
func TestElection(t *testing.T) {
	admin, dir := needCluster(t)
	rtA, rtB := newRuntime(t, dir), newRuntime(t, dir)
	lease := "berth-test-leader-" + time.Now().Format("150405.000")[7:]
	t.Cleanup(func() {
		_ = admin.CoordinationV1().Leases(rtA.Namespace()).Delete(context.Background(), lease, metav1.DeleteOptions{})
	})
	type leading struct {
		who string
		at  time.Time
	}
	events := make(chan leading, 8)
	var wg sync.WaitGroup
	run := func(rt *k8s.Runtime, who string, release bool) context.CancelFunc {
		ctx, cancel := context.WithCancel(context.Background())
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rt.RunElected(ctx, k8s.Election{Lease: lease, Identity: who, Release: release,
				LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond},
				func(ctx context.Context) { events <- leading{who, time.Now()}; <-ctx.Done() })
		}()
		return cancel
	}
	wait := func(want string) time.Time {
		t.Helper()
		select {
		case ev := <-events:
			if ev.who != want {
				t.Fatalf("%s leads, want %s", ev.who, want)
			}
			return ev.at
		case <-time.After(20 * time.Second):
			t.Fatalf("no leader within 20 s (want %s)", want)
		}
		return time.Time{}
	}
	stopA := run(rtA, "replica-a", false)
	wait("replica-a")
	stopB := run(rtB, "replica-b", true)
	time.Sleep(time.Second)
	select {
	case ev := <-events:
		t.Fatalf("%s leads while replica-a holds the Lease", ev.who)
	default:
	}
	// replica-a dies without releasing: replica-b takes over after the
	// Lease expires.
	died := time.Now()
	stopA()
	took := wait("replica-b").Sub(died)
	t.Logf("leader died without releasing: the other replica led after %s (lease duration 3 s)", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("takeover took %s", took)
	}
	// replica-b stops cleanly (releases); a new replica-a leads at once.
	stopB()
	stopped := time.Now()
	stopA2 := run(rtA, "replica-a2", false)
	defer stopA2()
	took = wait("replica-a2").Sub(stopped)
	t.Logf("leader released the Lease: the next replica led after %s", took.Round(time.Millisecond))
	stopA2()
	wg.Wait()
}
