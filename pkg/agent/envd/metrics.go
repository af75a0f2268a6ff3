package envd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// hostMetrics is the answer of GET /metrics, envd's resource figures.
type hostMetrics struct {
	TS         int64   `json:"ts"`
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   uint64  `json:"mem_total"`
	MemUsed    uint64  `json:"mem_used"`
	DiskUsed   uint64  `json:"disk_used"`
	DiskTotal  uint64  `json:"disk_total"`
}

// cpuSampler turns /proc/stat's cumulative counters into the share of
// CPU time busy since the previous sample (since boot for the first).
type cpuSampler struct {
	mu          sync.Mutex
	busy, total uint64
}

func (c *cpuSampler) usedPct() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0
	}
	var total, idle uint64
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		if i >= 8 { // guest time is already counted in user time
			break
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	busy := total - idle
	c.mu.Lock()
	defer c.mu.Unlock()
	db, dt := busy-c.busy, total-c.total
	if busy < c.busy || total <= c.total {
		db, dt = busy, total
	}
	c.busy, c.total = busy, total
	if dt == 0 {
		return 0
	}
	return math.Round(float64(db)/float64(dt)*10000) / 100
}

// memory returns the memory limit and use of the agent's cgroup when it
// has a limit below the machine's memory, else the machine's
// (/proc/meminfo: total, and total less available).
func memory() (total, used uint64) {
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var avail uint64
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			n, _ := strconv.ParseUint(f[1], 10, 64)
			switch f[0] {
			case "MemTotal:":
				total = n * 1024
			case "MemAvailable:":
				avail = n * 1024
			}
		}
		if avail <= total {
			used = total - avail
		}
	}
	for _, p := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		limit, err1 := readUint(p[0])
		usage, err2 := readUint(p[1])
		if err1 == nil && err2 == nil && limit > 0 && (total == 0 || limit < total) {
			return limit, usage
		}
	}
	return total, used
}

func readUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// metrics answers GET /metrics.
func (s *Service) metrics(w http.ResponseWriter, _ *http.Request) {
	m := hostMetrics{TS: time.Now().Unix(), CPUCount: runtime.NumCPU(), CPUUsedPct: s.cpu.usedPct()}
	m.MemTotal, m.MemUsed = memory()
	var st syscall.Statfs_t
	if syscall.Statfs("/", &st) == nil {
		bs := uint64(st.Bsize)
		m.DiskTotal, m.DiskUsed = st.Blocks*bs, (st.Blocks-st.Bfree)*bs
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(m)
}
