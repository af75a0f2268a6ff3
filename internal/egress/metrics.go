package egress

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Apply results (label result of berth_egress_policy_applications_total).
const (
	resultOK    = "ok"
	resultError = "error"
)

// DNS outcomes (label result of berth_egress_dns_queries_total).
const (
	// dnsAnswered: forwarded upstream and the answer returned.
	dnsAnswered = "answered"
	// dnsDenied: the sandbox's policy refuses the name (NXDOMAIN).
	dnsDenied = "denied"
	// dnsRefused: not a query berth answers (unknown source, not one
	// question, not a QUERY): REFUSED.
	dnsRefused = "refused"
	// dnsFailed: the upstream servers failed, or opening the answered
	// addresses did (SERVFAIL).
	dnsFailed = "failed"
)

// applyBuckets are the apply duration histogram's upper bounds in seconds:
// one iptables-save and one iptables-restore, typically 5-50 ms.
var applyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// Metrics are an Enforcer's Prometheus figures: policy applications by
// result, their duration, and the resolver's queries by outcome. Labels
// are fixed sets (no lease ids, no names), so cardinality is bounded. A
// Metrics is a prometheus.Collector; register it once in one registry.
// The zero value is not usable: use NewMetrics.
type Metrics struct {
	applies  *prometheus.CounterVec
	duration prometheus.Histogram
	queries  *prometheus.CounterVec
}

// NewMetrics returns Metrics with every series at zero (so they are
// exposed before the first event, and also when nothing is enforced).
func NewMetrics() *Metrics {
	m := &Metrics{
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_egress_policy_applications_total",
			Help: "Network policy applications to a sandbox (acquire, change, restart, orchestrator start), by result (ok, error).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "berth_egress_apply_duration_seconds",
			Help:    "Duration of network policy applications (programming the host's iptables rules), errors included.",
			Buckets: applyBuckets,
		}),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_egress_dns_queries_total",
			Help: "DNS queries of sandboxes to berth's resolver, by result (answered; denied by the policy: NXDOMAIN; refused: unknown source or malformed; failed: upstream or rule error).",
		}, []string{"result"}),
	}
	for _, r := range []string{resultOK, resultError} {
		m.applies.WithLabelValues(r)
	}
	for _, r := range []string{dnsAnswered, dnsDenied, dnsRefused, dnsFailed} {
		m.queries.WithLabelValues(r)
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.applies.Describe(ch)
	m.duration.Describe(ch)
	m.queries.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.applies.Collect(ch)
	m.duration.Collect(ch)
	m.queries.Collect(ch)
}

// applied records one application that started at start.
func (m *Metrics) applied(start time.Time, err error) {
	r := resultOK
	if err != nil {
		r = resultError
	}
	m.applies.WithLabelValues(r).Inc()
	m.duration.Observe(time.Since(start).Seconds())
}

// query records one resolver query's outcome.
func (m *Metrics) query(result string) {
	m.queries.WithLabelValues(result).Inc()
}

var _ prometheus.Collector = (*Metrics)(nil)
