package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/typeurl/v2"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

var _ runtime.StatsReader = (*Runtime)(nil)

// Stats reads a running sandbox's figures from its task's cgroup metrics
// (containerd's Metrics call: cgroup v1 or v2 stats) and its network
// counters from /proc/PID/net/dev of the task's init process (the
// sandbox's network namespace, which the metrics do not cover).
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if id == "" {
		return runtime.Stats{}, errdefs.InvalidArgument("id", "container id is required")
	}
	ctx = r.withNS(ctx)
	if _, err := r.getManaged(ctx, id); err != nil {
		return runtime.Stats{}, err
	}
	proc, err := r.taskProcess(ctx, id)
	if err != nil {
		return runtime.Stats{}, err
	}
	if proc == nil || proc.GetStatus() != tasktypes.Status_RUNNING {
		st := "not running"
		if proc != nil {
			st = proc.GetStatus().String()
		}
		return runtime.Stats{}, errdefs.FailedPrecondition("sandbox %s is %s: no live figures", id, st)
	}
	resp, err := r.cli.TaskService().Metrics(ctx, &tasks.MetricsRequest{Filters: []string{"id==" + id}})
	if err != nil {
		return runtime.Stats{}, r.mapErr(err, "task metrics", id)
	}
	out := runtime.Stats{At: time.Now()}
	for _, m := range resp.GetMetrics() {
		if m.GetID() != id || m.GetData() == nil {
			continue
		}
		v, err := typeurl.UnmarshalAny(m.GetData())
		if err != nil {
			return runtime.Stats{}, fmt.Errorf("containerd: task metrics %s: %w", id, err)
		}
		statsFromMetrics(v, &out)
		if ts := m.GetTimestamp(); ts != nil {
			out.At = ts.AsTime()
		}
	}
	if pid := proc.GetPid(); pid > 0 {
		if f, err := os.Open(filepath.Join("/proc", strconv.Itoa(int(pid)), "net", "dev")); err == nil {
			out.NetworkRxBytes, out.NetworkTxBytes = runtime.ReadNetDev(f)
			f.Close()
		}
	}
	return out, nil
}

// statsFromMetrics fills out from cgroup v1 or v2 metrics. Memory is
// usage minus inactive file cache (as docker stats counts it).
func statsFromMetrics(v any, out *runtime.Stats) {
	sub := func(a, b uint64) int64 {
		if b < a {
			return int64(a - b)
		}
		return int64(a)
	}
	switch m := v.(type) {
	case *v1stats.Metrics:
		out.CPUNanos = int64(m.GetCPU().GetUsage().GetTotal())
		mem := m.GetMemory()
		out.MemoryBytes = sub(mem.GetUsage().GetUsage(), mem.GetTotalInactiveFile())
		out.MemoryPeakBytes = int64(mem.GetUsage().GetMax())
		if lim := mem.GetUsage().GetLimit(); lim < 1<<62 { // v1 "unlimited" is near MaxInt64
			out.MemoryLimitBytes = int64(lim)
		}
		out.Processes = int64(m.GetPids().GetCurrent())
		for _, n := range m.GetNetwork() {
			out.NetworkRxBytes += int64(n.GetRxBytes())
			out.NetworkTxBytes += int64(n.GetTxBytes())
		}
	case *v2stats.Metrics:
		out.CPUNanos = int64(m.GetCPU().GetUsageUsec()) * 1000
		mem := m.GetMemory()
		out.MemoryBytes = sub(mem.GetUsage(), mem.GetInactiveFile())
		out.MemoryPeakBytes = int64(mem.GetMaxUsage())
		if lim := mem.GetUsageLimit(); lim < 1<<62 {
			out.MemoryLimitBytes = int64(lim)
		}
		out.Processes = int64(m.GetPids().GetCurrent())
		for _, n := range m.GetNetwork() {
			out.NetworkRxBytes += int64(n.GetRxBytes())
			out.NetworkTxBytes += int64(n.GetTxBytes())
		}
	}
}
