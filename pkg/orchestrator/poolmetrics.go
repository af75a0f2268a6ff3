package orchestrator

import (
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector exposes the warm pools' figures (lease.Manager.PoolStats),
// read at scrape time.
type poolCollector struct{ m *lease.Manager }

var (
	descPoolReady    = desc("berth_pool_sandboxes", "Ready, unclaimed sandboxes of each warm pool.", "pool")
	descPoolCreating = desc("berth_pool_creating", "Sandboxes of each warm pool being created.", "pool")
	descPoolTarget   = desc("berth_pool_target", "How many ready sandboxes each warm pool fills towards.", "pool")
	descPoolHits     = desc("berth_pool_hits_total", "Acquires that claimed a warm pool's sandbox.", "pool")
	descPoolMisses   = desc("berth_pool_misses_total", "Acquires of a pool's profile that found it empty and created a sandbox cold.", "pool")
	descPoolFails    = desc("berth_pool_create_failures_total", "Warm pool sandboxes that failed to be created.", "pool")
	descPoolRefill   = desc("berth_pool_refill_duration_seconds", "Time to create one warm pool sandbox until its agent is ready.", "pool")
	poolDescs        = []*prometheus.Desc{descPoolReady, descPoolCreating, descPoolTarget, descPoolHits, descPoolMisses, descPoolFails, descPoolRefill}
)

// Describe implements prometheus.Collector.
func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range poolDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.m.PoolStats() {
		ch <- mustMetric(descPoolReady, gauge, float64(p.Ready), p.Name)
		ch <- mustMetric(descPoolCreating, gauge, float64(p.Creating), p.Name)
		ch <- mustMetric(descPoolTarget, gauge, float64(p.Target), p.Name)
		ch <- mustMetric(descPoolHits, counter, float64(p.Hits), p.Name)
		ch <- mustMetric(descPoolMisses, counter, float64(p.Misses), p.Name)
		ch <- mustMetric(descPoolFails, counter, float64(p.CreateFailures), p.Name)
		buckets := make(map[float64]uint64, len(lease.RefillBuckets))
		for i, b := range lease.RefillBuckets {
			if i < len(p.RefillBuckets) {
				buckets[b] = p.RefillBuckets[i]
			} else {
				buckets[b] = 0
			}
		}
		ch <- prometheus.MustNewConstHistogram(descPoolRefill, p.RefillCount, p.RefillSum, buckets, p.Name)
	}
}
