package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// BenchmarkWarmAcquireParallel is the warm claim under a burst: a pool of
// 10 berth/base sandboxes, full, and 10 callers that acquire its profile
// (with env and a secret, over REST, request to READY response) at the
// same moment; every round waits until the pool is full again, then
// releases the leases. It reports p50 and p99 of the claims over all
// rounds (targets: p50 < 10 ms, p99 < 30 ms), and the p50 of one claim
// alone, measured between the rounds, for comparison; and the CPU that
// the claims cost the machine, the orchestrator and the sandboxes (how
// busy two cores are during a burst tells whether it waits for CPU).
//
//	go test -run '^$' -bench WarmAcquireParallel -benchtime 10x ./e2e/
func BenchmarkWarmAcquireParallel(b *testing.B) {
	const callers = 10
	requireImage(b, baseImage)
	dir, instance := newDataDir(b)
	o := startOrch(b, dir, func(c *orchestrator.Config) {
		c.Pools = []orchestrator.Pool{{Name: "burst", Image: baseImage, Min: callers, Max: callers}}
	})
	b.Cleanup(func() { removeContainers(runLabel + "=" + runID) })
	m := o.srv.Manager()
	full := func() {
		if !eventually(5*time.Minute, 5*time.Millisecond, func() bool {
			for _, p := range m.PoolStats() {
				if p.Name == "burst" {
					return p.Ready == callers
				}
			}
			return false
		}) {
			b.Fatalf("pool not refilled: %+v", m.PoolStats())
		}
	}
	claimBody := func(conv string) map[string]any {
		return map[string]any{"conversationId": conv, "image": baseImage, "ttl": "600s",
			"env": map[string]string{"A": "1"}, "secrets": map[string]string{"S": "bench-secret-value"}}
	}
	acquire := func(conv string) (string, time.Duration, error) {
		body := claimBody(conv)
		t0 := time.Now()
		code, _, raw, err := o.call(http.MethodPost, "/v1/leases", body)
		d := time.Since(t0)
		var r orchv1.AcquireResponse
		if err != nil || code != http.StatusOK || decode(raw, &r) != nil || r.GetLease().GetState() != orchv1.LeaseState_LEASE_STATE_READY {
			return "", d, fmt.Errorf("acquire %s: HTTP %d, %v: %s", conv, code, err, raw)
		}
		id := r.GetLease().GetId()
		if l, _ := m.Get(context.Background(), id); l.Pool == "" {
			return id, d, fmt.Errorf("acquire %s missed the pool", conv)
		}
		return id, d, nil
	}

	var burst, alone []time.Duration
	// Where the claims' CPU went, summed over the bursts only (and over
	// the claims alone): the machine's cores (busy, stolen by the
	// hypervisor), this process (the orchestrator and the clients) and
	// the pooled sandboxes (their agents); the rest is the engine's, the
	// kernel's and any other process's (a claim alone starts its pool's
	// refill at once; a burst holds it until the burst ends).
	var spent machineTimes
	var wall, self, sandboxes time.Duration
	var aloneCPU, floorCPU struct{ machine, self, sandboxes time.Duration }
	// The machine's floor for the same burst, measured between the rounds
	// (bench_floor_test.go).
	floor := newClaimFloor(b)
	var floorDs []time.Duration
	b.ResetTimer()
	for round := range b.N {
		full()
		ids := make([]string, callers)
		ds := make([]time.Duration, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ids[i], ds[i], errs[i] = acquire(fmt.Sprintf("burst-%d-%d", round, i))
			}()
		}
		boxes, _ := poolSandboxes(b, instance, callers)
		boxes.settle()
		x0, s0 := boxes.read(), selfCPU()
		m0, t0 := readMachineTimes(), time.Now()
		close(start)
		wg.Wait()
		m1 := readMachineTimes().sub(m0) // first: the pool's refill starts now
		wall += time.Since(t0)
		self += selfCPU() - s0
		sandboxes += boxes.read() - x0
		spent = machineTimes{busy: spent.busy + m1.busy, steal: spent.steal + m1.steal}
		for i, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
			o.mustRelease(b, ids[i])
		}
		burst = append(burst, ds...)
		full()
		boxes, endpoints := poolSandboxes(b, instance, callers)
		floor.prepare(b, endpoints)
		boxes.settle()
		m0, x0, s0 = readMachineTimes(), boxes.read(), selfCPU()
		floorDs = append(floorDs, floor.burst(b, callers, claimBody(fmt.Sprintf("floor-%d", round)))...)
		floorCPU.self += selfCPU() - s0
		floorCPU.sandboxes += boxes.read() - x0
		floorCPU.machine += readMachineTimes().sub(m0).busy
		floor.closeConns()
		boxes.settle()
		m0, x0, s0 = readMachineTimes(), boxes.read(), selfCPU()
		id, d, err := acquire(fmt.Sprintf("alone-%d", round))
		if err != nil {
			b.Fatal(err)
		}
		aloneCPU.self += selfCPU() - s0
		aloneCPU.sandboxes += boxes.read() - x0
		aloneCPU.machine += readMachineTimes().sub(m0).busy
		o.mustRelease(b, id)
		alone = append(alone, d)
	}
	b.StopTimer()
	p50, p99 := percentile(burst, 50), percentile(burst, 99)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(p50), "burst-p50-ms")
	b.ReportMetric(ms(p99), "burst-p99-ms")
	b.ReportMetric(ms(percentile(alone, 50)), "alone-p50-ms")
	b.Logf("WARM-BURST %d rounds of %d parallel warm acquires (REST, env + secret): p50 %s p99 %s (targets: p50 < 10ms, p99 < 30ms) | one alone: p50 %s",
		b.N, callers, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), percentile(alone, 50).Round(10*time.Microsecond))
	claims := time.Duration(len(burst))
	if capacity := wall * time.Duration(goruntime.NumCPU()); capacity > 0 {
		pct := func(d time.Duration) float64 { return 100 * float64(d) / float64(capacity) }
		per := func(d time.Duration) time.Duration { return (d / claims).Round(10 * time.Microsecond) }
		b.ReportMetric(float64(spent.busy/claims)/float64(time.Microsecond), "machine-cpu-us/claim")
		b.Logf("WARM-BURST CPU during the bursts (%s of wall time on %d cores): busy %.0f%%, stolen by the hypervisor %.0f%% (/proc/stat, ticks of %s); per claim: the machine %s, of it this process (orchestrator and clients) %s, the sandboxes %s, the rest (engine, kernel, others) %s",
			wall.Round(time.Millisecond), goruntime.NumCPU(), pct(spent.busy), pct(spent.steal), clockTick,
			per(spent.busy), per(self), per(sandboxes), per(spent.busy-self-sandboxes))
		n := time.Duration(len(alone))
		b.Logf("WARM-BURST CPU of one claim alone: the machine %s, of it this process %s, the sandboxes %s, the rest %s",
			(aloneCPU.machine / n).Round(10*time.Microsecond), (aloneCPU.self / n).Round(10*time.Microsecond),
			(aloneCPU.sandboxes / n).Round(10*time.Microsecond), ((aloneCPU.machine - aloneCPU.self - aloneCPU.sandboxes) / n).Round(10*time.Microsecond))
	}
	fp50, fp99 := percentile(floorDs, 50), percentile(floorDs, 99)
	b.ReportMetric(ms(fp50), "floor-p50-ms")
	fn := time.Duration(len(floorDs))
	b.Logf("WARM-BURST FLOOR the same bursts to a bare HTTP server whose handler makes one gRPC call to an idle pooled agent and one fsync'd write: p50 %s p99 %s; CPU per claim: the machine %s, this process %s, the sandboxes %s | berth's burst: p50 %.2fx, p99 %.2fx the floor's",
		fp50.Round(10*time.Microsecond), fp99.Round(10*time.Microsecond),
		(floorCPU.machine / fn).Round(10*time.Microsecond), (floorCPU.self / fn).Round(10*time.Microsecond), (floorCPU.sandboxes / fn).Round(10*time.Microsecond),
		float64(p50)/float64(fp50), float64(p99)/float64(fp99))
}

// poolSandboxes returns the CPU meter and the agents' endpoints of the n
// pooled sandboxes of a full pool: the only running containers of the
// orchestrator instance once the leases released before are gone, which it
// waits for.
func poolSandboxes(b *testing.B, instance string, n int) (sandboxCPU, []string) {
	b.Helper()
	var ids []string
	if !eventually(time.Minute, 10*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := dockerCLI(ctx, "ps", "-q", "--no-trunc", "--filter", "label="+runtime.LabelInstance+"="+instance, "--filter", "status=running")
		ids = strings.Fields(out)
		return err == nil && len(ids) == n
	}) {
		b.Fatalf("want the %d pooled containers running alone, have %d", n, len(ids))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := dockerCLI(ctx, append([]string{"inspect", "-f", "{{.State.Pid}} {{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"}, ids...)...)
	if err != nil {
		b.Fatalf("docker inspect: %v: %s", err, out)
	}
	var pids []int
	var endpoints []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			b.Fatalf("docker inspect: no pid and address in %q", line)
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil || pid <= 0 {
			b.Fatalf("docker inspect: no pid in %q", line)
		}
		pids = append(pids, pid)
		endpoints = append(endpoints, net.JoinHostPort(f[1], strconv.Itoa(runtime.AgentPort)))
	}
	return newSandboxCPU(b, pids), endpoints
}
