package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
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
//     server);
//   - "commands": the programs the servers ran and reaped (the kernel
//     adds a reaped child's CPU to its parent's cutime and cstime), the
//     part no agent, proxy or engine could remove;
//   - "fuse-overlayfs": the processes serving the sandboxes' root file
//     systems, on hosts whose storage driver is fuse-overlayfs;
//   - "engine": every dockerd, containerd and containerd-shim process
//     running when the meter was made (other containers of the machine
//     count too);
//   - "this process": the test binary, i.e. the orchestrator running in
//     it and the load generator.
type cpuMeter struct {
	agents []int // supervisor pids
	fuse   []int
	engine []int
}

// newCPUMeter finds the processes of the containers ids of the machine's
// Docker Engine.
func newCPUMeter(tb testing.TB, ids []string) *cpuMeter { return newCPUMeterOn(tb, "", ids) }

// newCPUMeterOn finds the processes of the containers ids of the Docker
// Engine at host (a DOCKER_HOST; "" for the machine's).
func newCPUMeterOn(tb testing.TB, host string, ids []string) *cpuMeter {
	tb.Helper()
	m := &cpuMeter{engine: enginePIDs()}
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
	m := &cpuMeter{engine: enginePIDs()}
	for _, id := range ids {
		res, err := rt.Client().TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id})
		if err != nil {
			tb.Fatalf("task of %s: %v", id, err)
		}
		m.agents = append(m.agents, int(res.GetProcess().GetPid()))
	}
	return m
}

// procCPU returns a process's own CPU time (utime+stime) and that of the
// children it has reaped (cutime+cstime), in clock ticks: exact sums
// (threads that ended count), rounded to a tick, so fine over the
// seconds of a load run, too coarse for a burst of a few milliseconds
// (sandboxCPU).
func procCPU(pid int) (own, reaped time.Duration) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	// The fields after the command name (which may hold spaces).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime 15, cutime 16, cstime 17.
	if len(f) < 15 {
		return 0, 0
	}
	tick := func(k int) time.Duration {
		v, _ := strconv.ParseInt(f[k], 10, 64)
		return time.Duration(v) * clockTick
	}
	return tick(11) + tick(12), tick(13) + tick(14)
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

// enginePIDs returns the pids of the engine's processes, by name. They
// are found once, when a meter is made: a process that starts later (a
// new container's shim) would add all its CPU time at once, and one that
// ends would take its away.
func enginePIDs() []int {
	var pids []int
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(b)) {
		case "dockerd", "containerd", "containerd-shim":
			if n, err := strconv.Atoi(filepath.Base(filepath.Dir(c))); err == nil {
				pids = append(pids, n)
			}
		}
	}
	return pids
}

// read returns the CPU time used so far by each part (see cpuMeter).
func (m *cpuMeter) read() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, pid := range m.agents {
		own, _ := procCPU(pid)
		out["agents"] += own
		for _, c := range childrenOf(pid) {
			own, reaped := procCPU(c)
			out["agents"] += own
			out["commands"] += reaped
		}
	}
	for _, pid := range m.fuse {
		own, _ := procCPU(pid)
		out["fuse-overlayfs"] += own
	}
	for _, pid := range m.engine {
		own, _ := procCPU(pid)
		out["engine"] += own
	}
	out["this process"] = selfCPU()
	return out
}

// cpuParts is the order in which cpuMeter's parts are printed.
var cpuParts = []string{"this process", "agents", "commands", "fuse-overlayfs", "engine"}

// machineTimes is the CPU time of all the machine's cores by kind, from
// the first line of /proc/stat (in clock ticks); busy is the root
// cgroup's CPU usage in nanoseconds instead where there is one.
type machineTimes struct {
	busy  time.Duration // user, nice, system, irq, softirq
	steal time.Duration // taken by the hypervisor for other guests
}

// readMachineTimes returns the machine's CPU times so far.
func readMachineTimes() machineTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // "cpu" user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return machineTimes{}
	}
	t := func(k int) time.Duration {
		v, _ := strconv.ParseInt(f[k], 10, 64)
		return time.Duration(v) * clockTick
	}
	m := machineTimes{busy: t(1) + t(2) + t(3) + t(6) + t(7), steal: t(8)}
	if ns, ok := rootCgroupUsage(); ok {
		m.busy = ns
	}
	return m
}

// rootCgroupUsage returns the CPU time of every task of the machine in
// nanoseconds: the root cgroup's usage (cgroupUsage) on cgroup v1 or v2.
func rootCgroupUsage() (time.Duration, bool) {
	for _, f := range []string{"/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/unified/cpu.stat"} {
		if d, ok := cgroupUsage(f); ok {
			return d, true
		}
	}
	return 0, false
}

// cgroupUsage reads a cgroup's CPU usage from file: cgroup v1's
// cpuacct.usage (nanoseconds) or cgroup v2's cpu.stat (its usage_usec).
func cgroupUsage(file string) (time.Duration, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	if !strings.HasSuffix(file, "cpu.stat") {
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(n), err == nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(n) * time.Microsecond, err == nil
		}
	}
	return 0, false
}

// sub returns the times used between o and m.
func (m machineTimes) sub(o machineTimes) machineTimes {
	return machineTimes{busy: m.busy - o.busy, steal: m.steal - o.steal}
}

// selfCPU returns this process's user+system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sandboxCPU reads the CPU time of a set of sandboxes from their cgroups
// (cpuacct.usage on cgroup v1, cpu.stat's usage_usec on v2): nanoseconds,
// every process of the sandbox (the agent and what it runs), and one file
// each, so a read is quick enough for an interval of a few milliseconds.
type sandboxCPU []string

// newSandboxCPU finds the cgroups of the processes pids.
func newSandboxCPU(tb testing.TB, pids []int) sandboxCPU {
	tb.Helper()
	var files []string
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		if err != nil {
			tb.Fatalf("cgroup of %d: %v", pid, err)
		}
		file := ""
		for _, l := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(l, ":", 3)
			if len(parts) != 3 {
				continue
			}
			if slices.Contains(strings.Split(parts[1], ","), "cpuacct") {
				file = filepath.Join("/sys/fs/cgroup/cpuacct", parts[2], "cpuacct.usage")
				break
			}
			if parts[0] == "0" && parts[1] == "" && file == "" {
				file = filepath.Join("/sys/fs/cgroup", parts[2], "cpu.stat")
			}
		}
		if _, err := os.Stat(file); file == "" || err != nil {
			tb.Fatalf("no CPU usage file for the cgroup of %d (%q): %v", pid, file, err)
		}
		files = append(files, file)
	}
	return files
}

// read returns the CPU time the sandboxes have used so far.
func (s sandboxCPU) read() time.Duration {
	var d time.Duration
	for _, f := range s {
		n, _ := cgroupUsage(f)
		d += n
	}
	return d
}

// settle waits (up to 10 s) until the sandboxes are idle: less than 1 ms
// of CPU among them over 50 ms, so that a short interval measured next
// does not count the end of their start-up.
func (s sandboxCPU) settle() {
	prev := s.read()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // a sampling interval, not a wait for an event
		now := s.read()
		if now-prev < time.Millisecond {
			return
		}
		prev = now
	}
}
