package runtime

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const netDev = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  999999      10    0    0    0     0          0         0   999999      10    0    0    0     0       0          0
  eth0:    1500      12    0    0    0     0          0         0      700       9    0    0    0     0       0          0
  eth1:     500       2    0    0    0     0          0         0      300       1    0    0    0     0       0          0
`

func TestReadNetDev(t *testing.T) {
	rx, tx := ReadNetDev(strings.NewReader(netDev))
	if rx != 2000 || tx != 1000 {
		t.Fatalf("rx %d tx %d, want 2000 1000 (loopback excluded)", rx, tx)
	}
}

// fakeHost lays out proc and cgroup files under a temp dir.
func fakeHost(t *testing.T, files map[string]string) {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	oc, op := cgroupRoot, procRoot
	cgroupRoot, procRoot = filepath.Join(dir, "sys"), filepath.Join(dir, "proc")
	t.Cleanup(func() { cgroupRoot, procRoot = oc, op })
}

func TestCgroupStatsV1(t *testing.T) {
	const id = "abc123"
	fakeHost(t, map[string]string{
		"proc/42/cgroup":  "8:pids:/docker/" + id + "\n4:memory:/docker/" + id + "\n2:cpu,cpuacct:/docker/" + id + "\n0::/docker/" + id + "\n",
		"proc/42/net/dev": netDev,
		"sys/cpu,cpuacct/docker/" + id + "/cpuacct.usage":        "123456789\n",
		"sys/memory/docker/" + id + "/memory.usage_in_bytes":     "10000\n",
		"sys/memory/docker/" + id + "/memory.stat":               "cache 5\ntotal_inactive_file 1000\n",
		"sys/memory/docker/" + id + "/memory.max_usage_in_bytes": "20000\n",
		"sys/memory/docker/" + id + "/memory.limit_in_bytes":     "9223372036854771712\n",
		"sys/pids/docker/" + id + "/pids.current":                "7\n",
	})
	st, err := CgroupStats(42, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.CPUNanos != 123456789 || st.MemoryBytes != 9000 || st.MemoryPeakBytes != 20000 || st.MemoryLimitBytes != 0 ||
		st.Processes != 7 || st.NetworkRxBytes != 2000 || st.NetworkTxBytes != 1000 || st.At.IsZero() {
		t.Fatalf("stats %+v", st)
	}
	// Another container's id, or a root cgroup: refused, never misread.
	if _, err := CgroupStats(42, "other"); err == nil {
		t.Error("a cgroup of another container was read")
	}
}

func TestCgroupStatsV2(t *testing.T) {
	const id = "def456"
	cg := "sys/system.slice/docker-" + id + ".scope/"
	fakeHost(t, map[string]string{
		"proc/7/cgroup":       "0::/system.slice/docker-" + id + ".scope\n",
		"proc/7/net/dev":      netDev,
		cg + "cpu.stat":       "usage_usec 2500\nuser_usec 2000\n",
		cg + "memory.current": "8192\n",
		cg + "memory.stat":    "anon 4096\ninactive_file 192\n",
		cg + "memory.peak":    "16384\n",
		cg + "memory.max":     "max\n",
		cg + "pids.current":   "3\n",
	})
	st, err := CgroupStats(7, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.CPUNanos != 2500000 || st.MemoryBytes != 8000 || st.MemoryPeakBytes != 16384 || st.MemoryLimitBytes != 0 || st.Processes != 3 {
		t.Fatalf("stats %+v", st)
	}
	fakeHost(t, map[string]string{"proc/8/cgroup": "0::/\n"})
	if _, err := CgroupStats(8, ""); err == nil || !strings.Contains(err.Error(), "root cgroup") {
		t.Errorf("root cgroup: %v", err)
	}
	if _, err := CgroupStats(0, id); err == nil {
		t.Error("pid 0 accepted")
	}
}

func TestLastWords(t *testing.T) {
	var w LastWords
	if ok, _ := w.Replay("x", LogOptions{}, func(LogLine) error { return nil }); ok {
		t.Fatal("replay of nothing kept")
	}
	var many []LogLine
	for i := range LastWordsLines + 5 {
		many = append(many, LogLine{Text: strconv.Itoa(i)})
	}
	w.Keep("a", many)
	var got []string
	ok, err := w.Replay("a", LogOptions{Tail: 2}, func(l LogLine) error { got = append(got, l.Text); return nil })
	if !ok || err != nil || strings.Join(got, ",") != strconv.Itoa(LastWordsLines+3)+","+strconv.Itoa(LastWordsLines+4) {
		t.Errorf("replay tail 2: %v %v %v", ok, err, got)
	}
	if l, _ := w.Get("a"); len(l) != LastWordsLines || l[0].Text != "5" {
		t.Errorf("kept %d lines from %q", len(l), l[0].Text)
	}
	for i := range LastWordsSandboxes {
		w.Keep("s"+strconv.Itoa(i), many[:1])
	}
	if _, ok := w.Get("a"); ok {
		t.Error("the oldest sandbox was not dropped")
	}
	if _, ok := w.Get("s0"); !ok {
		t.Error("a recent sandbox was dropped")
	}
}
