package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// threadsCPU is the CPU time process pid has used, summed over its threads
// (/proc/PID/task/*/schedstat: nanoseconds, unlike the clock ticks of
// /proc/PID/stat).
func threadsCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no schedstat for pid %d: %v", pid, err)
	}
	var sum time.Duration
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		if fields := strings.Fields(string(b)); len(fields) > 0 {
			n, _ := strconv.ParseInt(fields[0], 10, 64)
			sum += time.Duration(n)
		}
	}
	return sum
}

// BenchmarkConfigureCPU measures the agent's share of a warm claim where
// nothing else runs: the CPU a fresh, idle agent process spends on the
// orchestrator's Configure (the lease's env and one secret, on a
// connection opened and used once ahead, as the orchestrator's Prepare
// does), beside a health check on the same connection after the same
// idle time (what the claim floor of WarmAcquireParallel asks an agent).
// Each iteration starts its own agent, with the two Ps it has in a
// sandbox with the default limit of one CPU; figures are medians. The idle gap
// matters: a call that wakes an idle Go process costs it several times
// what the same call costs back to back (docs/benchmarks.md).
func BenchmarkConfigureCPU(b *testing.B) {
	bin := buildAgent(b)
	const token = "bench-token-0123456789"
	const idle = 200 * time.Millisecond
	var prepare, configure, health []time.Duration
	for range b.N {
		dir := b.TempDir()
		addr := freePort(b)
		cmd := exec.Command(bin, "--listen", addr, "--workdir", filepath.Join(dir, "w"), "--state-file", filepath.Join(dir, "state", "configure.json"))
		// GOMAXPROCS=2: what Go gives the agent in a sandbox with the
		// default limit of one CPU (its cgroup-aware default never goes
		// below two), whatever this host's count of CPUs.
		cmd.Env = append(os.Environ(), "BERTH_AGENT_TOKEN="+token, "GOMAXPROCS=2")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
		b.Cleanup(stop)
		waitHealthy(b, addr)
		time.Sleep(idle)
		pid := cmd.Process.Pid
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		hc := healthpb.NewHealthClient(cc)
		// The base of each figure: what the agent spends idle over the same time.
		c0 := threadsCPU(b, pid)
		time.Sleep(idle)
		idleCPU := threadsCPU(b, pid) - c0

		c0 = threadsCPU(b, pid)
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			b.Fatal(err)
		}
		time.Sleep(idle)
		c1 := threadsCPU(b, pid)
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
		if _, err := agentv1.NewConfigServiceClient(cc).Configure(ctx, &agentv1.ConfigureRequest{
			Env: map[string]string{"A": "1"}, Secrets: map[string]string{"S": "bench-secret-value"}}); err != nil {
			b.Fatal(err)
		}
		time.Sleep(idle)
		c2 := threadsCPU(b, pid)
		if kept, err := os.ReadFile(filepath.Join(dir, "state", "configure.json")); err != nil || !strings.Contains(string(kept), "bench-secret-value") {
			b.Fatalf("the state file after Configure: %q, %v", kept, err)
		}
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			b.Fatal(err)
		}
		time.Sleep(idle)
		c3 := threadsCPU(b, pid)
		cc.Close()
		stop()
		prepare = append(prepare, c1-c0-idleCPU)
		configure = append(configure, c2-c1-idleCPU)
		health = append(health, c3-c2-idleCPU)
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	pm, cm, hm := med(prepare), med(configure), med(health)
	b.ReportMetric(float64(cm.Microseconds()), "configure-cpu-µs")
	b.ReportMetric(float64(hm.Microseconds()), "health-cpu-µs")
	b.ReportMetric(float64(cm)/float64(hm), "configure/health")
	b.Logf("CONFIGURE-BENCH agent CPU, median of %d fresh agents idle %v before each call: Configure %v, a health check %v (%.2fx); a new connection and its first health check (Prepare) %v",
		b.N, idle, cm.Round(time.Microsecond), hm.Round(time.Microsecond), float64(cm)/float64(hm), pm.Round(time.Microsecond))
}

// waitHealthy waits until the agent at addr answers a gRPC health check,
// over a connection it then closes.
func waitHealthy(tb testing.TB, addr string) {
	tb.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// WaitForReady: the call waits for the agent to listen, not a sleep.
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		tb.Fatalf("agent at %s not healthy: %v", addr, err)
	}
}
