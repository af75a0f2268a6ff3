package docker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/docker/docker/api/types/container"
)

var _ runtime.StatsReader = (*Runtime)(nil)

// Stats reads a running sandbox's figures: one inspect (the sandbox must
// be berth's and running; it gives the container's pid, remembered for
// the next calls while it stays the container's), then the
// container's cgroup files and /proc/PID/net/dev when this process sees
// the host's (runtime.CgroupStats), else one one-shot stats call (GET
// /containers/{id}/stats?stream=false&one-shot=true, which Engine 20.10
// answers in up to a second). Memory is usage minus inactive file cache,
// as `docker stats` shows it; the peak is max_usage (cgroup v1) or, on
// cgroup v2 where the engine has none, the container cgroup's memory.peak
// when this host's /sys/fs/cgroup shows it.
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	r.negotiate(ctx)
	if id == "" {
		return runtime.Stats{}, errdefs.InvalidArgument("id", "container id is required")
	}
	// A pid seen by an earlier call is tried first: CgroupStats checks that
	// its cgroup is still this container's (a restart or an exit changes
	// the pid, and then the inspect below runs again).
	if pid, ok := r.statsPids.Load(id); ok {
		if st, err := runtime.CgroupStats(pid.(int), id); err == nil {
			return st, nil
		}
		r.statsPids.Delete(id)
	}
	ins, err := r.inspectManaged(ctx, id)
	if err != nil {
		return runtime.Stats{}, err
	}
	if ins.State == nil || !ins.State.Running || ins.State.Paused {
		st := "not running"
		if ins.State != nil && ins.State.Paused {
			st = "paused"
		}
		return runtime.Stats{}, errdefs.FailedPrecondition("sandbox %s is %s: no live figures", id, st)
	}
	// The cgroup files answer in microseconds; the engine's one-shot
	// stats take up to a second (it waits for its collector's next tick).
	if st, err := runtime.CgroupStats(ins.State.Pid, ins.ID); err == nil {
		if ins.ID == id {
			r.statsPids.Store(id, ins.State.Pid)
		}
		return st, nil
	}
	resp, err := r.cli.ContainerStatsOneShot(ctx, id)
	if err != nil {
		return runtime.Stats{}, r.mapErr(err, "container stats", id)
	}
	defer resp.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return runtime.Stats{}, fmt.Errorf("docker: container stats %s: decode: %w", id, err)
	}
	out := statsFrom(s)
	if out.MemoryPeakBytes == 0 && ins.State.Pid > 0 {
		out.MemoryPeakBytes = cgroup2Peak(ins.State.Pid)
	}
	if out.At.IsZero() {
		out.At = time.Now()
	}
	return out, nil
}

// statsFrom converts the engine's stats document.
func statsFrom(s container.StatsResponse) runtime.Stats {
	out := runtime.Stats{
		CPUNanos:         int64(s.CPUStats.CPUUsage.TotalUsage),
		MemoryBytes:      int64(s.MemoryStats.Usage),
		MemoryPeakBytes:  int64(s.MemoryStats.MaxUsage),
		MemoryLimitBytes: int64(s.MemoryStats.Limit),
		Processes:        int64(s.PidsStats.Current),
		At:               s.Read,
	}
	// The docker CLI subtracts inactive file pages from usage: cgroup v1
	// total_inactive_file, v2 inactive_file.
	inactive := s.MemoryStats.Stats["total_inactive_file"]
	if v, ok := s.MemoryStats.Stats["inactive_file"]; ok && inactive == 0 {
		inactive = v
	}
	if inactive < s.MemoryStats.Usage {
		out.MemoryBytes = int64(s.MemoryStats.Usage - inactive)
	}
	for name, n := range s.Networks {
		if name == "lo" {
			continue
		}
		out.NetworkRxBytes += int64(n.RxBytes)
		out.NetworkTxBytes += int64(n.TxBytes)
	}
	return out
}

// cgroup2Peak reads memory.peak of the cgroup v2 that process pid is in,
// or 0 (cgroup v1, another cgroup namespace, an older kernel).
func cgroup2Peak(pid int) int64 {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rel, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", filepath.Clean("/"+rel), "memory.peak"))
			if err != nil {
				return 0
			}
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return n
		}
	}
	return 0
}
