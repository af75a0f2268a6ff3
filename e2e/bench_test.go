package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// BenchmarkColdAcquire compares, interleaved in one run, a cold acquire of
// a berth/base sandbox through the in-process orchestrator (REST, until
// READY: create, inject, start, agent healthy) with its Docker CLI
// equivalent (`docker run -d --rm berth/base sleep 60` plus `docker exec ID
// true`). It reports p50 and p99 of each, their ratios (target: ≤ 1.3), the
// p50 of a release (until RELEASED, container removed), and the delay from
// a lease's expires_at to its container being gone (target: ≤ 2s).
//
//	go test -run '^$' -bench ColdAcquire -benchtime 20x ./e2e/
func BenchmarkColdAcquire(b *testing.B) {
	requireImage(b, baseImage)
	dir, _ := newDataDir(b)
	o := startOrch(b, dir)
	b.Cleanup(func() { removeContainers(runLabel + "=" + runID) })

	var acquire, baseline, release []time.Duration
	orchOnce := func(i int) {
		t0 := time.Now()
		r, err := o.acquire(fmt.Sprintf("bench-%d", i), baseImage, "600s")
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if r.GetLease().GetState() != orchv1.LeaseState_LEASE_STATE_READY {
			b.Fatalf("acquire: %s", r.GetLease().GetState())
		}
		acquire = append(acquire, d)
		t1 := time.Now()
		if l := o.mustRelease(b, r.GetLease().GetId()); l.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
			b.Fatalf("release: %s", l.GetState())
		}
		release = append(release, time.Since(t1))
	}
	dockerOnce := func() {
		t0 := time.Now()
		id := mustDocker(b, "run", "-d", "--rm", "--label", runLabel+"="+runID, baseImage, "sleep", "60")
		mustDocker(b, "exec", id, "true")
		baseline = append(baseline, time.Since(t0))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, _ = dockerCLI(ctx, "rm", "-f", id) // may race with --rm: either removes it
		cancel()
	}

	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			orchOnce(i)
			dockerOnce()
		} else {
			dockerOnce()
			orchOnce(i)
		}
	}
	b.StopTimer()

	expiry := measureExpiry(b, o, min(b.N, 5))

	ap50, ap99 := percentile(acquire, 50), percentile(acquire, 99)
	dp50, dp99 := percentile(baseline, 50), percentile(baseline, 99)
	b.ReportMetric(0, "ns/op") // one iteration mixes both sides: meaningless
	b.ReportMetric(ms(ap50), "acquire-p50-ms")
	b.ReportMetric(ms(ap99), "acquire-p99-ms")
	b.ReportMetric(ms(dp50), "docker-p50-ms")
	b.ReportMetric(ms(dp99), "docker-p99-ms")
	b.ReportMetric(ms(ap50)/ms(dp50), "ratio-p50")
	b.ReportMetric(ms(ap99)/ms(dp99), "ratio-p99")
	b.ReportMetric(ms(percentile(release, 50)), "release-p50-ms")
	b.ReportMetric(ms(percentile(expiry, 50)), "expiry-gone-p50-ms")
	b.ReportMetric(ms(percentile(expiry, 100)), "expiry-gone-max-ms")
	b.Logf("N=%d: acquire p50 %s p99 %s | docker run+exec p50 %s p99 %s | ratio p50 %.2f p99 %.2f | release p50 %s | expiry→gone %v",
		b.N, ap50.Round(time.Millisecond), ap99.Round(time.Millisecond), dp50.Round(time.Millisecond), dp99.Round(time.Millisecond),
		ms(ap50)/ms(dp50), ms(ap99)/ms(dp99), percentile(release, 50).Round(time.Millisecond), roundAll(expiry))
}

// measureExpiry acquires n leases with ttl 2s at once and returns, for
// each, the time from its expires_at until the runtime no longer finds its
// container.
func measureExpiry(b *testing.B, o *orch, n int) []time.Duration {
	leases := make([]*orchv1.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := o.acquire(fmt.Sprintf("bench-expiry-%d", i), noShellImage, "2s")
			leases[i], errs[i] = r.GetLease(), err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	out := make([]time.Duration, n)
	for i, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			exp := l.GetExpiresAt().AsTime()
			deadline := exp.Add(30 * time.Second)
			for time.Now().Before(deadline) {
				gone, err := goneFast(context.Background(), l.GetContainerId())
				if err != nil {
					errs[i] = err
					return
				}
				if gone {
					out[i] = time.Since(exp)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			errs[i] = fmt.Errorf("container %s of lease %s not gone 30s after expiry", l.GetContainerId(), l.GetId())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return out
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
