package runtime

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Stats are a sandbox's live resource figures, read from the engine at one
// moment (Docker's stats API, containerd's task metrics, and the cgroup or
// /proc files where those lack a figure). A figure the backend cannot read
// is zero.
type Stats struct {
	// CPUNanos is the CPU time all the sandbox's processes used since it
	// started (user and system), in nanoseconds. Callers compute a CPU
	// percentage from two samples.
	CPUNanos int64
	// MemoryBytes is the memory in use (the cgroup's usage minus inactive
	// file cache, as `docker stats` shows it).
	MemoryBytes int64
	// MemoryPeakBytes is the highest usage the kernel recorded (cgroup v1
	// max_usage_in_bytes, v2 memory.peak); 0 when unknown.
	MemoryPeakBytes int64
	// MemoryLimitBytes is the memory limit; 0 when none.
	MemoryLimitBytes int64
	// NetworkRxBytes and NetworkTxBytes count the bytes received and sent
	// by the sandbox's interfaces (loopback excluded).
	NetworkRxBytes, NetworkTxBytes int64
	// Processes is the number of tasks (processes and threads) in the
	// sandbox's pids cgroup (pids.current).
	Processes int64
	// At is when the figures were read.
	At time.Time
}

// StatsReader is the optional part of a Runtime that reads a sandbox's
// live figures (Docker and containerd implement it). Callers type-assert:
// rt.(runtime.StatsReader). One call costs one engine round trip (tens of
// milliseconds on Docker), so callers cache and poll sparingly.
type StatsReader interface {
	// Stats reads sandbox id's figures now. A sandbox that is not running
	// is FailedPrecondition (a paused one may report its frozen figures),
	// a missing one NotFound.
	Stats(ctx context.Context, id string) (Stats, error)
}

// LogStream names where a line of a sandbox's output came from.
const (
	LogStdout = "stdout"
	LogStderr = "stderr"
	// LogOutput is a line from a backend that does not tell stdout and
	// stderr apart (containerd's log file).
	LogOutput = "output"
)

// LogLine is one line of a sandbox's container output.
type LogLine struct {
	// Time is when the engine received the line (zero when it does not say).
	Time time.Time
	// Stream is LogStdout, LogStderr or LogOutput.
	Stream string
	// Text is the line without its newline.
	Text string
}

// LogOptions select a sandbox's output.
type LogOptions struct {
	// Tail limits the output to its last lines; 0 means all.
	Tail int
	// Since skips lines before this time (where the backend knows times).
	Since time.Time
	// Follow keeps reading new lines until ctx ends or the sandbox stops.
	Follow bool
}

// LogStreamer is the optional part of a Runtime that reads a sandbox's
// container output: the agent's own log and whatever the container's main
// process and its children write to stdout and stderr (Docker's logs API;
// containerd's per-sandbox log file). Callers type-assert.
type LogStreamer interface {
	// StreamLogs calls fn with each line of sandbox id's output, oldest
	// first, until the output ends (or, with Follow, until ctx ends or the
	// sandbox stops), or fn returns an error (which it returns). A missing
	// sandbox is NotFound.
	StreamLogs(ctx context.Context, id string, opts LogOptions, fn func(LogLine) error) error
}

// ReadNetDev sums the receive and transmit byte counters of a
// /proc/PID/net/dev table, skipping the loopback interface.
func ReadNetDev(r io.Reader) (rx, tx int64) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue
		}
		r, err1 := strconv.ParseInt(f[0], 10, 64)
		t, err2 := strconv.ParseInt(f[8], 10, 64)
		if err1 == nil && err2 == nil {
			rx += r
			tx += t
		}
	}
	return rx, tx
}

// cgroupRoot is where the cgroup file systems are mounted and procRoot
// where proc is (variables for tests).
var (
	cgroupRoot = "/sys/fs/cgroup"
	procRoot   = "/proc"
)

// CgroupStats reads the figures of the cgroup that process pid (in this
// host's PID namespace) belongs to straight from the cgroup files (v1:
// cpuacct, memory, pids controllers; v2: the unified hierarchy) and its
// network counters from /proc/PID/net/dev. It takes microseconds, where
// an engine's stats API may take a second; backends use it when the
// orchestrator sees the host's /proc and /sys/fs/cgroup, and their API
// otherwise. It fails when a file is missing or pid's cgroup is the root
// (an orchestrator in a container with its own cgroup namespace sees its
// own cgroup as "/", which is not the sandbox's), or when its cgroup path
// does not contain mustContain (the container id: guards against a pid
// that means another process here, in another PID namespace).
func CgroupStats(pid int, mustContain string) (Stats, error) {
	if pid <= 0 {
		return Stats{}, fmt.Errorf("cgroup stats: no process")
	}
	proc := filepath.Join(procRoot, strconv.Itoa(pid))
	b, err := os.ReadFile(filepath.Join(proc, "cgroup"))
	if err != nil {
		return Stats{}, fmt.Errorf("cgroup stats: %w", err)
	}
	v1 := map[string]string{} // controller -> path
	v2 := ""
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
			continue
		}
		for c := range strings.SplitSeq(parts[1], ",") {
			v1[c] = parts[2]
		}
	}
	for _, p := range append([]string{v2}, v1["memory"], v1["cpuacct"]) {
		if p != "" && !strings.Contains(p, mustContain) {
			return Stats{}, fmt.Errorf("cgroup stats: process %d is in cgroup %s, not one of %s", pid, p, mustContain)
		}
	}
	out := Stats{At: time.Now()}
	num := func(path string) (int64, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, nil
		}
		return strconv.ParseInt(s, 10, 64)
	}
	statKey := func(path, key string) int64 {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == key {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
		return 0
	}
	if mem, ok := v1["memory"]; ok && v1["cpuacct"] != "" {
		if mem == "/" || v1["cpuacct"] == "/" {
			return Stats{}, fmt.Errorf("cgroup stats: process %d is in the root cgroup (another cgroup namespace?)", pid)
		}
		dir := func(c string) string { return filepath.Join(cgroupRoot, controllerDir(c), v1[c]) }
		if out.CPUNanos, err = num(filepath.Join(dir("cpuacct"), "cpuacct.usage")); err != nil {
			return Stats{}, fmt.Errorf("cgroup stats: %w", err)
		}
		usage, err := num(filepath.Join(dir("memory"), "memory.usage_in_bytes"))
		if err != nil {
			return Stats{}, fmt.Errorf("cgroup stats: %w", err)
		}
		out.MemoryBytes = max(usage-statKey(filepath.Join(dir("memory"), "memory.stat"), "total_inactive_file"), 0)
		out.MemoryPeakBytes, _ = num(filepath.Join(dir("memory"), "memory.max_usage_in_bytes"))
		if lim, _ := num(filepath.Join(dir("memory"), "memory.limit_in_bytes")); lim < 1<<62 {
			out.MemoryLimitBytes = lim
		}
		if _, ok := v1["pids"]; ok {
			out.Processes, _ = num(filepath.Join(dir("pids"), "pids.current"))
		}
	} else if v2 != "" {
		if v2 == "/" {
			return Stats{}, fmt.Errorf("cgroup stats: process %d is in the root cgroup (another cgroup namespace?)", pid)
		}
		dir := filepath.Join(cgroupRoot, filepath.Clean("/"+v2))
		usage, err := num(filepath.Join(dir, "memory.current"))
		if err != nil {
			return Stats{}, fmt.Errorf("cgroup stats: %w", err)
		}
		out.CPUNanos = statKey(filepath.Join(dir, "cpu.stat"), "usage_usec") * 1000
		out.MemoryBytes = max(usage-statKey(filepath.Join(dir, "memory.stat"), "inactive_file"), 0)
		out.MemoryPeakBytes, _ = num(filepath.Join(dir, "memory.peak"))
		out.MemoryLimitBytes, _ = num(filepath.Join(dir, "memory.max"))
		out.Processes, _ = num(filepath.Join(dir, "pids.current"))
	} else {
		return Stats{}, fmt.Errorf("cgroup stats: process %d: no cpuacct and memory controllers", pid)
	}
	if f, err := os.Open(filepath.Join(proc, "net", "dev")); err == nil {
		out.NetworkRxBytes, out.NetworkTxBytes = ReadNetDev(f)
		f.Close()
	}
	return out, nil
}

// controllerDir is the directory a v1 controller is mounted on: its own
// name, or a co-mounted one ("cpu,cpuacct") when that is what exists.
func controllerDir(c string) string {
	if _, err := os.Stat(filepath.Join(cgroupRoot, c)); err == nil {
		return c
	}
	for _, combo := range []string{"cpu,cpuacct", "cpuacct,cpu"} {
		if strings.Contains(combo, c) {
			if _, err := os.Stat(filepath.Join(cgroupRoot, combo)); err == nil {
				return combo
			}
		}
	}
	return c
}

// MaxLogLine bounds one line of a sandbox's output that a LogStreamer
// passes on; longer lines are cut there.
const MaxLogLine = 64 << 10

// Bounds of LastWords.
const (
	// LastWordsSandboxes is how many removed sandboxes' output LastWords keeps.
	LastWordsSandboxes = 256
	// LastWordsLines is how many of a sandbox's last lines it keeps.
	LastWordsLines = 100
)

// LastWords keeps, in memory, the last lines of output of sandboxes that
// were removed after their container had exited (a crash, a kill, an OOM),
// so that a lease's log can still say why it failed once its container is
// gone (runtime.LogStreamer answers a removed sandbox from it). It holds
// at most LastWordsSandboxes sandboxes, the oldest dropped first, and is
// lost when the process exits. The zero value is ready to use.
type LastWords struct {
	mu    sync.Mutex
	order []string
	lines map[string][]LogLine
}

// Keep stores the last LastWordsLines of lines as sandbox id's last words.
func (w *LastWords) Keep(id string, lines []LogLine) {
	if len(lines) > LastWordsLines {
		lines = lines[len(lines)-LastWordsLines:]
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lines == nil {
		w.lines = map[string][]LogLine{}
	}
	if _, ok := w.lines[id]; !ok {
		w.order = append(w.order, id)
	}
	w.lines[id] = lines
	for len(w.order) > LastWordsSandboxes {
		delete(w.lines, w.order[0])
		w.order = w.order[1:]
	}
}

// Collect reads the last LastWordsLines lines of sandbox id's output from
// s and keeps them as its last words; a failed read, or no output, keeps
// nothing.
func (w *LastWords) Collect(ctx context.Context, s LogStreamer, id string) {
	var lines []LogLine
	err := s.StreamLogs(ctx, id, LogOptions{Tail: LastWordsLines}, func(l LogLine) error {
		lines = append(lines, l)
		return nil
	})
	if err == nil && len(lines) > 0 {
		w.Keep(id, lines)
	}
}

// Get returns sandbox id's last words, if kept.
func (w *LastWords) Get(id string) ([]LogLine, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l, ok := w.lines[id]
	return l, ok
}

// Replay calls fn with sandbox id's last words that opts selects (Tail,
// Since); ok is false when none were kept.
func (w *LastWords) Replay(id string, opts LogOptions, fn func(LogLine) error) (ok bool, err error) {
	lines, ok := w.Get(id)
	if !ok {
		return false, nil
	}
	if opts.Tail > 0 && len(lines) > opts.Tail {
		lines = lines[len(lines)-opts.Tail:]
	}
	for _, l := range lines {
		if !opts.Since.IsZero() && !l.Time.IsZero() && l.Time.Before(opts.Since) {
			continue
		}
		if err := fn(l); err != nil {
			return true, err
		}
	}
	return true, nil
}
