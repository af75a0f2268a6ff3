package containerd

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"

	"github.com/berth-dev/berth/pkg/runtime"
)

func TestStatsFromMetrics(t *testing.T) {
	var v1 runtime.Stats
	statsFromMetrics(&v1stats.Metrics{
		CPU:    &v1stats.CPUStat{Usage: &v1stats.CPUUsage{Total: 7e8}},
		Memory: &v1stats.MemoryStat{Usage: &v1stats.MemoryEntry{Usage: 5000, Max: 9000, Limit: 1 << 63}, TotalInactiveFile: 1000},
		Pids:   &v1stats.PidsStat{Current: 4},
	}, &v1)
	if v1.CPUNanos != 7e8 || v1.MemoryBytes != 4000 || v1.MemoryPeakBytes != 9000 || v1.MemoryLimitBytes != 0 || v1.Processes != 4 {
		t.Errorf("v1: %+v", v1)
	}
	var v2 runtime.Stats
	statsFromMetrics(&v2stats.Metrics{
		CPU:    &v2stats.CPUStat{UsageUsec: 3000},
		Memory: &v2stats.MemoryStat{Usage: 6000, MaxUsage: 8000, UsageLimit: 1 << 20, InactiveFile: 6001},
		Pids:   &v2stats.PidsStat{Current: 2},
	}, &v2)
	if v2.CPUNanos != 3e6 || v2.MemoryBytes != 6000 || v2.MemoryPeakBytes != 8000 || v2.MemoryLimitBytes != 1<<20 || v2.Processes != 2 {
		t.Errorf("v2: %+v", v2)
	}
}

func TestSeekTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(p, []byte("one\ntwo\nthree\nfour"), 0o600); err != nil {
		t.Fatal(err)
	}
	for n, want := range map[int]string{1: "four", 2: "three\nfour", 10: "one\ntwo\nthree\nfour"} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := seekTail(f, n); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(f)
		f.Close()
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("tail %d = %q, want %q", n, got, want)
		}
	}
}
