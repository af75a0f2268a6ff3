package orchestrator

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
)

// acquireBuckets are the acquire duration histogram's upper bounds in
// seconds: a cold start pulls nothing (images are local) but starts a
// container and waits for its agent.
var acquireBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10, 20, 30, 60, 120}

// metrics is one Server's Prometheus registry (private, not the global
// default, so that several servers can run in one process) with the lease
// manager's figures, the proxy's, the acquire histogram and the Go
// runtime and process collectors.
type metrics struct {
	reg     *prometheus.Registry
	acquire prometheus.Observer // kind="cold", backend=the runtime
	warm    prometheus.Observer // kind="warm": claimed from a pool
}

// newMetrics builds the registry of a server on backend (Config.Runtime)
// with lease manager m and proxy px.
func newMetrics(m *lease.Manager, px *proxy.Proxy, backend string) *metrics {
	acq := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_acquire_duration_seconds",
		Help:    "Duration of acquires that created a lease, by backend and kind (cold: a new container; warm: claimed from a pool), until the lease is READY.",
		Buckets: acquireBuckets,
	}, []string{"backend", "kind"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		leaseCollector{m},
		poolCollector{m}, // poolmetrics.go
		acq,
	)
	if px != nil {
		reg.MustRegister(px.Collector())
	}
	return &metrics{reg: reg, acquire: acq.WithLabelValues(backend, "cold"), warm: acq.WithLabelValues(backend, "warm")}
}

// handler serves the registry in the Prometheus exposition format. It is
// open (no token) like /healthz: it reveals counts only, and the listener
// is loopback by default.
func (mt *metrics) handler() http.Handler {
	return promhttp.HandlerFor(mt.reg, promhttp.HandlerOpts{Registry: mt.reg})
}

// unary times the acquires that create a sandbox (the response's created
// is true), REST ones included: the gateway calls the gRPC server.
func (mt *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if info.FullMethod != orchv1.LeaseService_Acquire_FullMethodName {
		return next(ctx, req)
	}
	start := time.Now()
	resp, err := next(ctx, req)
	if r, ok := resp.(*orchv1.AcquireResponse); ok && err == nil && r.GetCreated() {
		took := time.Since(start).Seconds()
		if r.GetLease().GetPool() != "" { // claimed from a warm pool
			mt.warm.Observe(took)
		} else {
			mt.acquire.Observe(took)
		}
	}
	return resp, err
}

// leaseCollector exposes lease.Manager's Stats and DiskStats, read at
// scrape time.
type leaseCollector struct{ m *lease.Manager }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	descLeases           = desc("berth_leases", "Leases by state (ended leases until purged).", "state")
	descLive             = desc("berth_leases_live", "Live leases (PENDING, READY, RELEASING).")
	descMax              = desc("berth_leases_max", "Maximum live leases.")
	descCreated          = desc("berth_leases_created_total", "Leases created since start.")
	descTransitions      = desc("berth_lease_transitions_total", "Transitions into each state since start.", "to")
	descUncleaned        = desc("berth_sandboxes_uncleaned", "Ended leases whose container removal has not succeeded yet.")
	descDiskLimited      = desc("berth_disk_limited_leases", "READY leases with a disk limit (resources.diskBytes).")
	descDiskUsed         = desc("berth_disk_used_bytes", "Last measured disk usage summed over READY leases with a disk limit.")
	descDiskOver         = desc("berth_disk_over_limit_leases", "READY leases over their disk limit (warned; stopped after the grace period).")
	descDiskKept         = desc("berth_disk_kept_sandboxes", "Stopped sandboxes kept after their lease failed past the disk limit.")
	descDiskMeasurements = desc("berth_disk_measurements_total", "Disk usage measurements since start.")
	descDiskStops        = desc("berth_disk_limit_stops_total", "Sandboxes stopped past their disk limit since start.")
	descOOMEvents        = desc("berth_sandbox_oom_events_total", "Processes in sandboxes killed by the OOM killer (the engine's oom events) since start; leases are not affected.")
	descRestarts         = desc("berth_sandbox_restarts_total", "In-place restarts of sandboxes whose container exited, since start.")
	descRestartFailures  = desc("berth_sandbox_restart_failures_total", "In-place restarts that failed (their lease failed) since start.")
	leaseCollectorDescs  = []*prometheus.Desc{descLeases, descLive, descMax, descCreated, descTransitions, descUncleaned, descDiskLimited, descDiskUsed, descDiskOver, descDiskKept, descDiskMeasurements, descDiskStops, descOOMEvents, descRestarts, descRestartFailures}
)

const (
	counter = prometheus.CounterValue
	gauge   = prometheus.GaugeValue
)

var mustMetric = prometheus.MustNewConstMetric

// Describe implements prometheus.Collector.
func (c leaseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range leaseCollectorDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c leaseCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.m.Stats()
	for _, s := range lease.States {
		if s != lease.StateUnspecified {
			ch <- mustMetric(descLeases, gauge, float64(st.ByState[s]), s.String())
		}
	}
	ch <- mustMetric(descLive, gauge, float64(st.Live))
	ch <- mustMetric(descMax, gauge, float64(st.MaxLive))
	ch <- mustMetric(descCreated, counter, float64(st.Created))
	for s, n := range st.Transitions {
		ch <- mustMetric(descTransitions, counter, float64(n), s.String())
	}
	ch <- mustMetric(descUncleaned, gauge, float64(st.Uncleaned))
	ds := c.m.DiskStats()
	ch <- mustMetric(descDiskLimited, gauge, float64(ds.Limited))
	ch <- mustMetric(descDiskUsed, gauge, float64(ds.UsedBytes))
	ch <- mustMetric(descDiskOver, gauge, float64(ds.Over))
	ch <- mustMetric(descDiskKept, gauge, float64(ds.Kept))
	ch <- mustMetric(descDiskMeasurements, counter, float64(ds.Measurements))
	ch <- mustMetric(descDiskStops, counter, float64(ds.Stops))
	ch <- mustMetric(descOOMEvents, counter, float64(st.OOMEvents))
	ch <- mustMetric(descRestarts, counter, float64(st.Restarts))
	ch <- mustMetric(descRestartFailures, counter, float64(st.RestartFailures))
}
