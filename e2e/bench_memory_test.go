package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// cgroupMemoryRoot is where Docker (cgroupfs driver, cgroup v1) puts its
// containers' memory cgroups.
const cgroupMemoryRoot = "/sys/fs/cgroup/memory/docker"

// memSample sums the memory cgroups of containers.
type memSample struct {
	cgroups int   // containers whose memory cgroup exists
	usage   int64 // sum of memory.usage_in_bytes (rss + page cache + kernel memory charged)
	rss     int64 // sum of memory.stat total_rss (anonymous memory)
	cache   int64 // sum of memory.stat total_cache (page cache)
}

// sampleMemory reads the memory cgroups of the containers cids.
func sampleMemory(tb testing.TB, cids []string) memSample {
	tb.Helper()
	var s memSample
	for _, cid := range cids {
		dir := filepath.Join(cgroupMemoryRoot, cid)
		b, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
		if err != nil {
			continue // a stopped container has no cgroup
		}
		s.cgroups++
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		s.usage += n
		f, err := os.Open(filepath.Join(dir, "memory.stat"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), " ")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "total_rss":
				s.rss += n
			case "total_cache":
				s.cache += n
			}
		}
		f.Close()
	}
	return s
}

// memAvailable is the host's MemAvailable (/proc/meminfo) in bytes.
func memAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n << 10
		}
	}
	return 0
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// TestIdleMemoryBench measures (BERTH_BENCH=1, make bench) the memory of
// 50 idle berth/base leases on Docker running, frozen and hibernated: the
// sum over their containers of the cgroup v1 counters memory.usage_in_bytes
// and memory.stat total_rss / total_cache (a hibernated sandbox's container
// is stopped: it has no cgroup, so it counts 0), and the host's
// MemAvailable for reference (noisy on a shared host).
func TestIdleMemoryBench(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("a figure for make bench (BERTH_BENCH=1)")
	}
	requireImage(t, baseImage)
	if _, err := os.Stat(cgroupMemoryRoot); err != nil {
		t.Skipf("no cgroup v1 memory hierarchy for Docker at %s: %v", cgroupMemoryRoot, err)
	}
	const n = 50
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	before := memAvailable()

	ids, cids := make([]string, n), make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 4)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			r, err := o.acquire(fmt.Sprintf("c-mem-%02d", i), baseImage, "1800s")
			if err != nil {
				errs <- err
				return
			}
			ids[i], cids[i] = r.GetLease().GetId(), r.GetLease().GetContainerId()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.call(http.MethodPost, "/v1/leases:reap", `{"all":true}`) })

	settle := func() { time.Sleep(3 * time.Second) }
	pauseAll := func(mode string) {
		for _, id := range ids {
			pauseCall(t, o.api, id, mode)
		}
	}
	resumeAll := func() {
		for _, id := range ids {
			pauseCall(t, o.api, id, "")
		}
	}
	report := func(what string, s memSample) {
		avail := memAvailable()
		fmt.Printf("MEMORY-BENCH %-11s %d leases: %2d cgroups, usage_in_bytes %7.1f MiB (%.2f MiB/lease), rss %7.1f MiB, cache %7.1f MiB; host MemAvailable %+.0f MiB vs before the leases\n",
			what, n, s.cgroups, mib(s.usage), mib(s.usage)/n, mib(s.rss), mib(s.cache), mib(avail-before))
	}

	settle()
	running := sampleMemory(t, cids)
	report("running", running)
	pauseAll("freeze")
	settle()
	report("frozen", sampleMemory(t, cids))
	resumeAll()
	pauseAll("hibernate")
	settle()
	hib := sampleMemory(t, cids)
	report("hibernated", hib)
	if hib.cgroups != 0 {
		t.Errorf("%d hibernated sandboxes still have a memory cgroup", hib.cgroups)
	}
	if running.cgroups != n {
		t.Errorf("found %d memory cgroups of %d running sandboxes under %s", running.cgroups, n, cgroupMemoryRoot)
	}
}
