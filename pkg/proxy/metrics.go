package proxy

import (
	"fmt"
	"io"
	"sync/atomic"

	"google.golang.org/grpc/codes"
)

// metrics are the proxy's counters; every field is updated atomically.
type metrics struct {
	httpStatus     [600]atomic.Uint64 // by HTTP status
	grpcCode       [17]atomic.Uint64  // by gRPC code
	inFlight       atomic.Int64       // HTTP requests and gRPC calls being proxied
	operatorAccess atomic.Uint64
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

// Stats is a snapshot of the proxy's counters.
type Stats struct {
	// HTTP counts finished HTTP requests by status (including the proxy's
	// own 401/404/409/410/499/502/504 and upstream statuses).
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

// WriteMetrics writes the counters in the Prometheus text exposition
// format (berth_proxy_http_requests_total{code}, berth_proxy_grpc_calls_total{code},
// berth_proxy_in_flight, berth_proxy_operator_access_total), for the
// orchestrator's /metrics.
func (p *Proxy) WriteMetrics(w io.Writer) error {
	s := p.Stats()
	var err error
	pr := func(format string, args ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, args...)
		}
	}
	pr("# HELP berth_proxy_http_requests_total HTTP requests proxied to sandboxes, by status.\n")
	pr("# TYPE berth_proxy_http_requests_total counter\n")
	for i := range p.metrics.httpStatus {
		if n, ok := s.HTTP[i]; ok {
			pr("berth_proxy_http_requests_total{code=\"%d\"} %d\n", i, n)
		}
	}
	pr("# HELP berth_proxy_grpc_calls_total gRPC calls proxied to sandboxes, by code.\n")
	pr("# TYPE berth_proxy_grpc_calls_total counter\n")
	for i := range p.metrics.grpcCode {
		if n, ok := s.GRPC[codes.Code(i)]; ok {
			pr("berth_proxy_grpc_calls_total{code=%q} %d\n", codes.Code(i).String(), n)
		}
	}
	pr("# HELP berth_proxy_in_flight Requests and calls being proxied.\n")
	pr("# TYPE berth_proxy_in_flight gauge\n")
	pr("berth_proxy_in_flight %d\n", s.InFlight)
	pr("# HELP berth_proxy_operator_access_total Requests and calls opened with the operator token.\n")
	pr("# TYPE berth_proxy_operator_access_total counter\n")
	pr("berth_proxy_operator_access_total %d\n", s.OperatorAccesses)
	return err
}
