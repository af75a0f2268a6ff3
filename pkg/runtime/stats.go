package runtime

import (
	"bufio"
	"context"
	"io"
	"strconv"
	"strings"
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
	// is FailedPrecondition, a missing one NotFound.
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
