package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// clockTick is the unit of /proc/PID/stat's times (USER_HZ: 100 on every
// Linux that Docker supports).
const clockTick = 10 * time.Millisecond

// cpuMeter reads the CPU time (user + system) that the parts of the hot
// path have used, so that a benchmark can report CPU per operation, a
// figure that other work on the machine does not change (unlike latency):
//
//   - "agents": the sandboxes' agents (the supervisor at PID 1 and the
//     server), with the children they reaped (the commands they ran);
//   - "fuse-overlayfs": the processes serving the sandboxes' root file
//     systems, on hosts whose storage driver is fuse-overlayfs;
//   - "engine": every dockerd, containerd and containerd-shim process
//     (other containers of the machine count too);
//   - "this process": the test binary, i.e. the orchestrator running in
//     it and the load generator.
type cpuMeter struct {
	agents []int // supervisor pids
	fuse   []int
}

// newCPUMeter finds the processes of the containers ids of the machine's
// Docker Engine.
func newCPUMeter(tb testing.TB, ids []string) *cpuMeter { return newCPUMeterOn(tb, "", ids) }

// newCPUMeterOn finds the processes of the containers ids of the Docker
// Engine at host (a DOCKER_HOST; "" for the machine's).
func newCPUMeterOn(tb testing.TB, host string, ids []string) *cpuMeter {
	tb.Helper()
	m := &cpuMeter{}
	merged := map[string]bool{}
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		args := []string{"inspect", "-f", "{{.State.Pid}} {{index .GraphDriver.Data \"MergedDir\"}}", id}
		if host != "" {
			args = append([]string{"-H", host}, args...)
		}
		out, err := dockerCLI(ctx, args...)
		cancel()
		if err != nil {
			tb.Fatalf("docker inspect %s: %v: %s", id, err, out)
		}
		pid, dir, _ := strings.Cut(strings.TrimSpace(out), " ")
		n, err := strconv.Atoi(pid)
		if err != nil || n <= 0 {
			tb.Fatalf("docker inspect %s: no pid in %q", id, out)
		}
		m.agents = append(m.agents, n)
		if dir != "" && dir != "<no value>" {
			merged[dir] = true
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("fuse-overlayfs")) {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for _, a := range args {
			if merged[a] {
				if n, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
					m.fuse = append(m.fuse, n)
				}
			}
		}
	}
	return m
}

// newCtrdCPUMeter finds the processes of the containerd backend's
// sandboxes ids (their tasks' pids); their root file systems are the
// kernel's overlayfs, so there is no FUSE daemon to count.
func newCtrdCPUMeter(tb testing.TB, ids []string) *cpuMeter {
	tb.Helper()
	rt := requireContainerd(tb)
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	m := &cpuMeter{}
	for _, id := range ids {
		res, err := rt.Client().TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id})
		if err != nil {
			tb.Fatalf("task of %s: %v", id, err)
		}
		m.agents = append(m.agents, int(res.GetProcess().GetPid()))
	}
	return m
}

// procCPU returns a process's utime+stime, plus cutime+cstime when
// children is set.
func procCPU(pid int, children bool) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime 15, cutime 16, cstime 17.
	if len(f) < 15 {
		return 0
	}
	var ticks int64
	last := 13
	if children {
		last = 15
	}
	for k := 11; k < last; k++ {
		v, _ := strconv.ParseInt(f[k], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * clockTick
}

// childrenOf returns the pids of pid's children.
func childrenOf(pid int) []int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// engineCPU sums the CPU time of the engine's processes, by name.
func engineCPU() time.Duration {
	var d time.Duration
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(b)) {
		case "dockerd", "containerd", "containerd-shim":
			if n, err := strconv.Atoi(filepath.Base(filepath.Dir(c))); err == nil {
				d += procCPU(n, false)
			}
		}
	}
	return d
}

// read returns the CPU time used so far by each part (see cpuMeter).
func (m *cpuMeter) read() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, pid := range m.agents {
		out["agents"] += procCPU(pid, false)
		for _, c := range childrenOf(pid) {
			out["agents"] += procCPU(c, true)
		}
	}
	for _, pid := range m.fuse {
		out["fuse-overlayfs"] += procCPU(pid, false)
	}
	out["engine"] = engineCPU()
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out["this process"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return out
}

// cpuParts is the order in which cpuMeter's parts are printed.
var cpuParts = []string{"this process", "agents", "fuse-overlayfs", "engine"}
