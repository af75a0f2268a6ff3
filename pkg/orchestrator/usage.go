package orchestrator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/periodic"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"github.com/prometheus/client_golang/prometheus"
)

// usageFresh is the shortest staleness bound of the metrics' samples.
const usageFresh = time.Second

// usageParallel bounds the concurrent engine calls of one sampling round.
const usageParallel = 4

// usageTracker samples the live figures of sandboxes (runtime.StatsReader)
// and keeps the last two samples per lease, from which it derives a CPU
// percentage. Get samples its lease on demand; a background loop samples
// every READY lease each Config.UsageInterval for the metrics. Without a
// StatsReader it reports nothing.
type usageTracker struct {
	rt       runtime.StatsReader // nil: the backend cannot
	m        *lease.Manager
	interval time.Duration
	perLease bool
	log      *slog.Logger

	mu   sync.Mutex
	last map[string]usageSample // by lease id
}

// usageSample is one lease's latest figures and the CPU percentage
// between it and the sample before.
type usageSample struct {
	container string
	stats     runtime.Stats
	percent   float64
}

func newUsageTracker(rt runtime.Runtime, m *lease.Manager, cfg Config, log *slog.Logger) *usageTracker {
	sr, _ := rt.(runtime.StatsReader)
	return &usageTracker{rt: sr, m: m, interval: time.Duration(cfg.UsageInterval), perLease: cfg.MetricsPerLease,
		log: log, last: map[string]usageSample{}}
}

// start runs the sampling loop until ctx ends (nothing when sampling is off).
func (u *usageTracker) start(ctx context.Context) {
	if u.rt == nil || u.interval <= 0 {
		return
	}
	go periodic.Run(ctx, u.interval, u.round)
}

// round samples every READY lease (usageParallel at a time) and forgets
// the leases that are no longer READY.
func (u *usageTracker) round(ctx context.Context) {
	var ls []lease.Lease
	f := lease.Filter{States: []lease.State{lease.StateReady}, PageSize: lease.MaxPageSize}
	for {
		page, next, err := u.m.List(ctx, f)
		if err != nil {
			return
		}
		ls = append(ls, page...)
		if next == "" {
			break
		}
		f.PageToken = next
	}
	live := make(map[string]bool, len(ls))
	sem := make(chan struct{}, usageParallel)
	var wg sync.WaitGroup
	for _, l := range ls {
		live[l.ID] = true
		if l.ContainerID == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(id, cid string) {
			defer wg.Done()
			defer func() { <-sem }()
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := u.sample(sctx, id, cid); err != nil {
				u.log.Debug("usage sample failed", "lease_id", id, "container_id", cid, "error", err)
			}
		}(l.ID, l.ContainerID)
	}
	wg.Wait()
	u.mu.Lock()
	for id := range u.last {
		if !live[id] {
			delete(u.last, id)
		}
	}
	u.mu.Unlock()
}

// sample reads lease id's figures now and records them.
func (u *usageTracker) sample(ctx context.Context, id, container string) (usageSample, error) {
	st, err := u.rt.Stats(ctx, container)
	if err != nil {
		return usageSample{}, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	s := usageSample{container: container, stats: st}
	if prev, ok := u.last[id]; ok && prev.container == container {
		dt := st.At.Sub(prev.stats.At)
		switch {
		case dt < 100*time.Millisecond:
			// Too close to the last sample for a meaningful rate: keep
			// the rate measured before.
			s.percent = prev.percent
		case dt < 10*time.Minute && st.CPUNanos >= prev.stats.CPUNanos:
			s.percent = float64(st.CPUNanos-prev.stats.CPUNanos) / float64(dt.Nanoseconds()) * 100
		}
	}
	u.last[id] = s
	return s, nil
}

// fill adds lease l's live figures to out (Get), sampled now (one or two
// engine calls); the CPU percentage is over the time since the lease's
// previous sample (by Get, `lease top` or the sampling loop). A lease that
// is not READY, or a backend that cannot, leaves out as it is.
func (u *usageTracker) fill(ctx context.Context, l lease.Lease, out *orchv1.Lease) {
	if u == nil || u.rt == nil || l.State != lease.StateReady || l.ContainerID == "" {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := u.sample(sctx, l.ID, l.ContainerID)
	if err != nil {
		u.log.Debug("usage sample failed", "lease_id", l.ID, "container_id", l.ContainerID, "error", err)
		return
	}
	if out.Usage == nil {
		out.Usage = &orchv1.Usage{}
	}
	st := s.stats
	out.Usage.CpuNanos = st.CPUNanos
	out.Usage.CpuPercent = s.percent
	out.Usage.MemoryBytes = st.MemoryBytes
	out.Usage.MemoryPeakBytes = st.MemoryPeakBytes
	out.Usage.MemoryLimitBytes = st.MemoryLimitBytes
	out.Usage.NetworkRxBytes = st.NetworkRxBytes
	out.Usage.NetworkTxBytes = st.NetworkTxBytes
	out.Usage.Processes = st.Processes
	out.Usage.SampledAt = ts(st.At)
}

// The usage metrics: aggregate gauges always, per-lease series only with
// Config.MetricsPerLease (their number grows with the leases).
var (
	descUsageSampled  = desc("berth_usage_sandboxes_sampled", "READY sandboxes whose last usage sample is counted in the berth_usage_* sums.")
	descUsageCPU      = desc("berth_usage_cpu_percent", "CPU use of all sampled sandboxes between their last two samples, in percent of one CPU.")
	descUsageMemory   = desc("berth_usage_memory_bytes", "Memory in use by all sampled sandboxes (usage minus inactive file cache).")
	descUsageRx       = desc("berth_usage_network_receive_bytes", "Bytes received by all sampled sandboxes since each started.")
	descUsageTx       = desc("berth_usage_network_transmit_bytes", "Bytes sent by all sampled sandboxes since each started.")
	descUsageProcs    = desc("berth_usage_processes", "Processes (and threads) in all sampled sandboxes.")
	descLeaseCPU      = desc("berth_lease_cpu_seconds_total", "CPU time used by a lease's sandbox (opt-in: metricsPerLease).", "lease_id")
	descLeaseMemory   = desc("berth_lease_memory_bytes", "Memory in use by a lease's sandbox (opt-in: metricsPerLease).", "lease_id")
	descLeaseMemPeak  = desc("berth_lease_memory_peak_bytes", "Peak memory of a lease's sandbox (opt-in: metricsPerLease).", "lease_id")
	descLeaseRx       = desc("berth_lease_network_receive_bytes_total", "Bytes received by a lease's sandbox (opt-in: metricsPerLease).", "lease_id")
	descLeaseTx       = desc("berth_lease_network_transmit_bytes_total", "Bytes sent by a lease's sandbox (opt-in: metricsPerLease).", "lease_id")
	descLeaseProcs    = desc("berth_lease_processes", "Processes in a lease's sandbox (opt-in: metricsPerLease).", "lease_id")
	usageDescs        = []*prometheus.Desc{descUsageSampled, descUsageCPU, descUsageMemory, descUsageRx, descUsageTx, descUsageProcs}
	usagePerLeaseDesc = []*prometheus.Desc{descLeaseCPU, descLeaseMemory, descLeaseMemPeak, descLeaseRx, descLeaseTx, descLeaseProcs}
)

// Describe implements prometheus.Collector.
func (u *usageTracker) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range usageDescs {
		ch <- d
	}
	if u.perLease {
		for _, d := range usagePerLeaseDesc {
			ch <- d
		}
	}
}

// Collect implements prometheus.Collector: it reads the cached samples
// (never the engine), skipping those older than three intervals.
func (u *usageTracker) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	defer u.mu.Unlock()
	stale := 3 * max(u.interval, usageFresh)
	var n, cpu, mem, rx, tx, procs float64
	for id, s := range u.last {
		if time.Since(s.stats.At) > stale {
			continue
		}
		st := s.stats
		n++
		cpu += s.percent
		mem += float64(st.MemoryBytes)
		rx += float64(st.NetworkRxBytes)
		tx += float64(st.NetworkTxBytes)
		procs += float64(st.Processes)
		if u.perLease {
			ch <- mustMetric(descLeaseCPU, counter, float64(st.CPUNanos)/1e9, id)
			ch <- mustMetric(descLeaseMemory, gauge, float64(st.MemoryBytes), id)
			ch <- mustMetric(descLeaseMemPeak, gauge, float64(st.MemoryPeakBytes), id)
			ch <- mustMetric(descLeaseRx, counter, float64(st.NetworkRxBytes), id)
			ch <- mustMetric(descLeaseTx, counter, float64(st.NetworkTxBytes), id)
			ch <- mustMetric(descLeaseProcs, gauge, float64(st.Processes), id)
		}
	}
	ch <- mustMetric(descUsageSampled, gauge, n)
	ch <- mustMetric(descUsageCPU, gauge, cpu)
	ch <- mustMetric(descUsageMemory, gauge, mem)
	ch <- mustMetric(descUsageRx, gauge, rx)
	ch <- mustMetric(descUsageTx, gauge, tx)
	ch <- mustMetric(descUsageProcs, gauge, procs)
}
