package agent

import (
	"context"
	"net/http"
	"time"

	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/agent/terminal"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// execBuckets are the exec duration histogram's upper bounds in seconds:
// from `true` to a long build.
var execBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// metrics is the agent's Prometheus registry (its own, so that in-process
// sandboxes in one test binary do not share one): the exec duration
// histogram, gauges of running processes and terminal sessions, and the Go
// runtime and process collectors. It is served at GET /metrics with the
// agent's token; through the orchestrator's proxy only the operator token
// reads it.
type metrics struct {
	reg  *prometheus.Registry
	exec *prometheus.HistogramVec // method, code
}

// newMetrics returns the registry with the exec histogram; gauges adds the
// gauges once the runner and the terminal manager exist.
func newMetrics() *metrics {
	mt := &metrics{
		reg: prometheus.NewRegistry(),
		exec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_agent_exec_duration_seconds",
			Help:    "Duration of Exec and ExecStream calls (REST ones included), by method (exec, exec_stream) and gRPC code; a command's non-zero exit is OK.",
			Buckets: execBuckets,
		}, []string{"method", "code"}),
	}
	mt.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		mt.exec,
	)
	return mt
}

// gauges registers the gauges read from runner and terms at scrape time.
func (mt *metrics) gauges(runner *process.Runner, terms *terminal.Manager) {
	mt.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "berth_agent_background_processes",
			Help: "Background processes (StartProcess) running now.",
		}, func() float64 {
			n := 0
			for _, p := range runner.List() {
				if p.State == process.StateRunning {
					n++
				}
			}
			return float64(n)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "berth_agent_terminal_sessions",
			Help: "Terminal sessions whose program is running now.",
		}, func() float64 {
			n := 0
			for _, s := range terms.List() {
				if s.Running {
					n++
				}
			}
			return float64(n)
		}),
	)
}

// handler serves the registry in the Prometheus exposition format.
func (mt *metrics) handler() http.Handler {
	return promhttp.HandlerFor(mt.reg, promhttp.HandlerOpts{Registry: mt.reg})
}

// unary times Exec.
func (mt *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if info.FullMethod != agentv1.ProcessService_Exec_FullMethodName {
		return next(ctx, req)
	}
	start := time.Now()
	resp, err := next(ctx, req)
	mt.exec.WithLabelValues("exec", code(err)).Observe(time.Since(start).Seconds())
	return resp, err
}

// code is err's gRPC code name, the code label.
func code(err error) string { return status.Code(errgrpc.ToGRPC(err)).String() }

// stream times ExecStream.
func (mt *metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	if info.FullMethod != agentv1.ProcessService_ExecStream_FullMethodName {
		return next(srv, ss)
	}
	start := time.Now()
	err := next(srv, ss)
	mt.exec.WithLabelValues("exec_stream", code(err)).Observe(time.Since(start).Seconds())
	return err
}
