package orchestrator

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/prometheus/client_golang/prometheus"
)

// scriptedStats returns the queued figures one call at a time.
type scriptedStats struct {
	mu    sync.Mutex
	queue []runtime.Stats
}

func (s *scriptedStats) Stats(context.Context, string) (runtime.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.queue[0]
	s.queue = s.queue[1:]
	return st, nil
}

// TestUsageSamplePercent: the CPU percentage is the CPU time between two
// samples over the wall time between them; a sample too close to the last
// keeps the last rate; a new container starts over.
func TestUsageSamplePercent(t *testing.T) {
	t0 := time.Now()
	rt := &scriptedStats{queue: []runtime.Stats{
		{CPUNanos: 1e9, At: t0},
		{CPUNanos: 2e9, At: t0.Add(2 * time.Second)},                     // 1s of CPU in 2s: 50%
		{CPUNanos: 2.01e9, At: t0.Add(2*time.Second + time.Millisecond)}, // too close: keeps 50
		{CPUNanos: 5e8, At: t0.Add(3 * time.Second)},                     // another container
	}}
	u := &usageTracker{rt: rt, log: slog.New(slog.NewTextHandler(io.Discard, nil)), last: map[string]usageSample{}}
	want := []float64{0, 50, 50, 0}
	for i, w := range want {
		cid := "c1"
		if i == 3 {
			cid = "c2"
		}
		s, err := u.sample(context.Background(), "L", cid)
		if err != nil {
			t.Fatal(err)
		}
		if s.percent != w {
			t.Errorf("sample %d: %.2f%%, want %.2f%%", i, s.percent, w)
		}
	}
}

// TestUsageCollect: aggregate gauges always; per-lease series only when
// opted in; stale samples are left out.
func TestUsageCollect(t *testing.T) {
	now := time.Now()
	for _, perLease := range []bool{false, true} {
		u := &usageTracker{interval: time.Second, perLease: perLease, last: map[string]usageSample{
			"a": {container: "ca", percent: 10, stats: runtime.Stats{CPUNanos: 3e9, MemoryBytes: 100, Processes: 2, NetworkRxBytes: 5, At: now}},
			"b": {container: "cb", percent: 20, stats: runtime.Stats{MemoryBytes: 50, Processes: 1, At: now}},
			"c": {container: "cc", percent: 99, stats: runtime.Stats{MemoryBytes: 1 << 30, At: now.Add(-time.Hour)}},
		}}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(u)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		series := map[string]int{}
		for _, mf := range mfs {
			series[mf.GetName()] = len(mf.GetMetric())
			for _, m := range mf.GetMetric() {
				got[mf.GetName()] += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		for name, want := range map[string]float64{"berth_usage_memory_bytes": 150, "berth_usage_cpu_percent": 30,
			"berth_usage_sandboxes_sampled": 2, "berth_usage_processes": 3, "berth_usage_network_receive_bytes": 5} {
			if got[name] != want {
				t.Errorf("perLease=%v: %s = %v, want %v", perLease, name, got[name], want)
			}
		}
		if n := series["berth_lease_cpu_seconds_total"]; (perLease && n != 2) || (!perLease && n != 0) {
			t.Errorf("perLease=%v: %d per-lease cpu series", perLease, n)
		}
		if perLease && got["berth_lease_cpu_seconds_total"] != 3 {
			t.Errorf("per-lease cpu seconds %v, want 3", got["berth_lease_cpu_seconds_total"])
		}
	}
}
