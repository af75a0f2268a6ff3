package proxy

import (
	"bufio"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	gwruntime "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Route kinds, indexes of routeKinds: the "kind" label of
// berth_proxy_request_duration_seconds.
const (
	kindREST      = iota // the agent's REST API (and its raw file routes)
	kindWebSocket        // an upgrade to the agent or a preview port
	kindPreview          // a preview port, path or host form
	kindGRPC             // a gRPC call to the agent
)

var (
	routeKinds    = [...]string{kindREST: "rest", kindWebSocket: "websocket", kindPreview: "preview", kindGRPC: "grpc"}
	statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}
)

// durationBuckets are the request duration histogram's upper bounds in
// seconds: from a cached answer to a long exec stream.
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// metrics are the proxy's counters; every field is updated atomically.
// The duration histogram's children are resolved once (New), so a request
// costs one Observe and no label lookup.
type metrics struct {
	httpStatus     [600]atomic.Uint64 // by HTTP status
	grpcCode       [17]atomic.Uint64  // by gRPC code
	inFlight       atomic.Int64       // HTTP requests and gRPC calls being proxied
	operatorAccess atomic.Uint64

	duration *prometheus.HistogramVec
	observe  [len(routeKinds)][len(statusClasses)]prometheus.Observer
}

func (m *metrics) init() {
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_proxy_request_duration_seconds",
		Help:    "Duration of requests and calls proxied to sandboxes, by route kind (rest, websocket, preview, grpc) and status class (gRPC codes mapped to their HTTP status); a WebSocket or stream is timed until it ends.",
		Buckets: durationBuckets,
	}, []string{"kind", "code"})
	for i, k := range routeKinds {
		for j, c := range statusClasses {
			m.observe[i][j] = m.duration.WithLabelValues(k, c)
		}
	}
}

func (m *metrics) http(status int) {
	if status < 100 || status >= len(m.httpStatus) {
		status = 0 // unknown: counted as 0
	}
	m.httpStatus[status].Add(1)
}

func (m *metrics) grpc(c codes.Code) {
	if int(c) >= len(m.grpcCode) {
		c = codes.Unknown
	}
	m.grpcCode[c].Add(1)
}

// observeDuration records one request of kind (an index into routeKinds)
// that ended with HTTP status st after d.
func (m *metrics) observeDuration(kind, st int, d time.Duration) {
	c := st/100 - 1
	if c < 0 || c >= len(statusClasses) {
		c = 1 // nothing written: net/http answers 200
	}
	m.observe[kind][c].Observe(d.Seconds())
}

// AgentMetricsPath is the agent's Prometheus route. Through the proxy only
// the operator token reads it (the counts describe the sandbox, not the
// lease's work, and are the operator's to scrape); a lease token gets 403.
const AgentMetricsPath = "/metrics"

// operatorOnly refuses an agent path reserved to the operator to any other
// access.
func operatorOnly(p string, acc access) *routeError {
	if acc != accessOperator && path.Clean(p) == AgentMetricsPath {
		return newRouteError(http.StatusForbidden, errdefs.ErrPermissionDenied,
			"the agent's %s is served to the operator token only", AgentMetricsPath)
	}
	return nil
}

// Stats is a snapshot of the proxy's counters.
type Stats struct {
	// HTTP counts finished HTTP requests by status (including the proxy's
	// own 401/403/404/409/410/499/502/504 and upstream statuses).
	HTTP map[int]uint64
	// GRPC counts finished gRPC calls by code.
	GRPC map[codes.Code]uint64
	// InFlight is the number of requests and calls being proxied now.
	InFlight int64
	// OperatorAccesses counts requests and calls opened with the operator token.
	OperatorAccesses uint64
}

// Stats returns the current counters.
func (p *Proxy) Stats() Stats {
	s := Stats{HTTP: map[int]uint64{}, GRPC: map[codes.Code]uint64{},
		InFlight: p.metrics.inFlight.Load(), OperatorAccesses: p.metrics.operatorAccess.Load()}
	for i := range p.metrics.httpStatus {
		if n := p.metrics.httpStatus[i].Load(); n > 0 {
			s.HTTP[i] = n
		}
	}
	for i := range p.metrics.grpcCode {
		if n := p.metrics.grpcCode[i].Load(); n > 0 {
			s.GRPC[codes.Code(i)] = n
		}
	}
	return s
}

// Collector returns the proxy's metrics for a prometheus.Registry:
// berth_proxy_http_requests_total{code}, berth_proxy_grpc_calls_total{code},
// berth_proxy_in_flight, berth_proxy_operator_access_total and the
// histogram berth_proxy_request_duration_seconds{kind,code}. The counters
// are read at scrape time from the atomics the request paths update.
func (p *Proxy) Collector() prometheus.Collector { return (*collector)(p) }

type collector Proxy

var (
	descHTTP = prometheus.NewDesc("berth_proxy_http_requests_total",
		"HTTP requests proxied to sandboxes, by status.", []string{"code"}, nil)
	descGRPC = prometheus.NewDesc("berth_proxy_grpc_calls_total",
		"gRPC calls proxied to sandboxes, by code.", []string{"code"}, nil)
	descInFlight = prometheus.NewDesc("berth_proxy_in_flight",
		"Requests and calls being proxied.", nil, nil)
	descOperator = prometheus.NewDesc("berth_proxy_operator_access_total",
		"Requests and calls opened with the operator token.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descHTTP
	ch <- descGRPC
	ch <- descInFlight
	ch <- descOperator
	c.metrics.duration.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := &c.metrics
	for i := range m.httpStatus {
		if n := m.httpStatus[i].Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(descHTTP, prometheus.CounterValue, float64(n), strconv.Itoa(i))
		}
	}
	for i := range m.grpcCode {
		if n := m.grpcCode[i].Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(descGRPC, prometheus.CounterValue, float64(n), codes.Code(i).String())
		}
	}
	ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(m.inFlight.Load()))
	ch <- prometheus.MustNewConstMetric(descOperator, prometheus.CounterValue, float64(m.operatorAccess.Load()))
	m.duration.Collect(ch)
}

// ServeHTTP proxies one HTTP request (route) and times it for
// berth_proxy_request_duration_seconds.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	kind := p.routeKind(r)
	start := time.Now()
	defer func() { p.metrics.observeDuration(kind, sw.status, time.Since(start)) }()
	p.route(sw, r)
}

// routeKind classifies r as an index into routeKinds, from the same
// request facts route reads: an upgrade is a WebSocket, a host-form label
// with a port or a path with /ports/ a preview, anything else REST.
func (p *Proxy) routeKind(r *http.Request) int {
	if isWebSocketUpgrade(r.Header) {
		return kindWebSocket
	}
	if label, ok := p.hostLabel(r.Host); ok {
		if port, _, ok := parseHostLabel(label); ok && port != 0 {
			return kindPreview
		}
		return kindREST
	}
	for _, prefix := range []string{RoutePrefix, SignedPrefix} {
		if rest, ok := strings.CutPrefix(r.URL.Path, prefix); ok {
			if _, after, _ := strings.Cut(rest, "/"); strings.HasPrefix(after, "ports/") {
				return kindPreview
			}
		}
	}
	return kindREST
}

// timedGRPC is the gRPC handler of GRPCHandler: handleGRPC, timed for
// berth_proxy_request_duration_seconds (kind grpc, the code's HTTP class).
func (p *Proxy) timedGRPC(srv any, ss grpc.ServerStream) error {
	start := time.Now()
	err := p.handleGRPC(srv, ss)
	p.metrics.observeDuration(kindGRPC, gwruntime.HTTPStatusFromCode(status.Code(err)), time.Since(start))
	return err
}

// statusWriter records the status written through it. It keeps the
// writer's optional features: Flush and Hijack here (a hijacked
// connection counts as 101), the rest through Unwrap for
// http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 || w.status < 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (w *statusWriter) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// FlushError is http.ResponseController's flush.
func (w *statusWriter) FlushError() error {
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack implements http.Hijacker.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.status = http.StatusSwitchingProtocols
	}
	return c, rw, err
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
