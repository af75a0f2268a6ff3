package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

// TestHibernateCrowdBench measures (BERTH_BENCH=1, make bench) the first
// exec through the proxy to a hibernated lease, and the REST :resume of
// one, while the host holds 500 hibernated leases (BERTH_HIBERNATED
// changes the count): the crowd is berth/minimal (stopped containers cost
// the engine and the orchestrator bookkeeping, not memory), the measured
// leases berth/base. Target: first exec p50 < 300 ms.
//
//	BERTH_BENCH=1 go test -count=1 -timeout 40m -run '^TestHibernateCrowdBench$' -v ./e2e/
func TestHibernateCrowdBench(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("a figure for make bench (BERTH_BENCH=1)")
	}
	requireImage(t, baseImage)
	requireImage(t, minimalImage)
	crowd := 500
	if v, err := strconv.Atoi(os.Getenv("BERTH_HIBERNATED")); err == nil && v >= 0 {
		crowd = v
	}
	const measured, runs = 5, 4
	dir, _ := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) {
		c.Admission.MaxLive = crowd + measured + 10
	})
	t.Cleanup(func() { removeContainers(runLabel + "=" + runID) })

	// The crowd: acquired and hibernated four at a time.
	began := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, crowd)
	slots := make(chan struct{}, 4)
	for i := range crowd {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			r, err := o.acquire(fmt.Sprintf("crowd-%d", i), minimalImage, "3600s")
			if err != nil {
				errs <- err
				return
			}
			pauseCall(t, o.api, r.GetLease().GetId(), "hibernate")
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d berth/minimal leases acquired and hibernated in %s", crowd, time.Since(began).Round(time.Second))

	type lease struct{ id, tok string }
	var ls []lease
	for i := range measured {
		r := o.mustAcquire(t, fmt.Sprintf("measured-%d", i), baseImage, "3600s")
		ls = append(ls, lease{r.GetLease().GetId(), r.GetToken()})
	}
	// The floor under any hibernate built on stopping the container: the
	// plain docker CLI starting a stopped berth/base container of the same
	// image on the same host, then running `true` in it.
	plain := mustDocker(t, "run", "-d", "--label", runLabel+"="+runID, baseImage, "sleep", "infinity")
	var first, resume, docker []time.Duration
	for range runs {
		for _, l := range ls {
			pauseCall(t, o.api, l.id, "hibernate")
			_, d := pexec(t, o.api, l.id, l.tok, "true")
			first = append(first, d)
			pauseCall(t, o.api, l.id, "hibernate")
			_, d = pauseCall(t, o.api, l.id, "")
			resume = append(resume, d)

			mustDocker(t, "stop", "-t", "0", plain)
			t0 := time.Now()
			mustDocker(t, "start", plain)
			mustDocker(t, "exec", plain, "true")
			docker = append(docker, time.Since(t0))
		}
	}
	p50 := func(ds []time.Duration) time.Duration { return ds[len(ds)/2] }
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{"first proxy exec to a hibernated lease", first}, {"hibernate→resume (REST :resume)", resume}, {"docker start + docker exec true (CLI)", docker}} {
		slices.Sort(m.ds)
		t.Logf("HIBERNATE-BENCH %d hibernated leases on the host: %-38s p50 %8s  max %8s  (n=%d; target: first exec p50 < 300ms)",
			crowd, m.name, p50(m.ds).Round(10*time.Microsecond), m.ds[len(m.ds)-1].Round(10*time.Microsecond), len(m.ds))
	}
	t.Logf("HIBERNATE-BENCH first exec / (docker start + exec) p50: %.2f (below 1: faster than the plain CLI's wake-up, which bounds any hibernate that stops the container)",
		float64(p50(first))/float64(p50(docker)))
}
