package docker

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/docker/docker/api/types/container"
)

// TestStatsFrom converts an Engine stats document (cgroup v1 shape).
func TestStatsFrom(t *testing.T) {
	const doc = `{"read":"2026-01-02T03:04:05Z","pids_stats":{"current":9},
	 "cpu_stats":{"cpu_usage":{"total_usage":1500000000}},
	 "memory_stats":{"usage":50000,"max_usage":80000,"limit":536870912,"stats":{"total_inactive_file":10000}},
	 "networks":{"eth0":{"rx_bytes":100,"tx_bytes":50},"eth1":{"rx_bytes":1,"tx_bytes":2}}}`
	var s container.StatsResponse
	if err := json.Unmarshal([]byte(doc), &s); err != nil {
		t.Fatal(err)
	}
	got := statsFrom(s)
	want := runtime.Stats{CPUNanos: 1.5e9, MemoryBytes: 40000, MemoryPeakBytes: 80000, MemoryLimitBytes: 536870912,
		NetworkRxBytes: 101, NetworkTxBytes: 52, Processes: 9, At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if got != want {
		t.Fatalf("statsFrom = %+v, want %+v", got, want)
	}
}

func TestParseTimestamped(t *testing.T) {
	l := parseTimestamped("2026-01-02T03:04:05.123456789Z hello world", runtime.LogStderr)
	if l.Text != "hello world" || l.Stream != runtime.LogStderr || l.Time.Nanosecond() != 123456789 {
		t.Errorf("parsed %+v", l)
	}
	if l := parseTimestamped("no time here", runtime.LogStdout); l.Text != "no time here" || !l.Time.IsZero() {
		t.Errorf("parsed %+v", l)
	}
}
