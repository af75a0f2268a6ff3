package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/distribution/reference"

	"github.com/berth-dev/berth/pkg/orchestrator"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestHibernateCrowdBench measures (BERTH_BENCH=1, make bench) the first
// exec through the proxy to a hibernated lease, and the REST :resume of
// one, while the host holds 500 hibernated leases (BERTH_HIBERNATED
// changes the count), on the Docker backend: the crowd is berth/minimal
// (stopped containers cost the engine and the orchestrator bookkeeping,
// not memory), the measured leases berth/base. Target: first exec p50 <
// 300 ms.
//
//	BERTH_BENCH=1 go test -count=1 -timeout 40m -run '^TestHibernateCrowdBench$' -v ./e2e/
func TestHibernateCrowdBench(t *testing.T) {
	crowd := hibernateCrowdSize(t)
	requireImage(t, baseImage)
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir, roomFor(crowd))
	t.Cleanup(func() { removeContainers(runLabel + "=" + runID) })
	// The floor under any hibernate built on stopping the container: the
	// plain docker CLI starting a stopped berth/base container of the same
	// image on the same host, then running `true` in it.
	plain := mustDocker(t, "run", "-d", "--label", runLabel+"="+runID, baseImage, "sleep", "infinity")
	hibernateCrowd(t, "docker", o.api, crowd, func(*orchv1.AcquireResponse) {}, "docker start + docker exec true (CLI)", func() time.Duration {
		mustDocker(t, "stop", "-t", "0", plain)
		t0 := time.Now()
		mustDocker(t, "start", plain)
		mustDocker(t, "exec", plain, "true")
		return time.Since(t0)
	})
}

// TestHibernateCrowdBenchContainerd is TestHibernateCrowdBench on the
// containerd backend, whose wake-up is a new task on the sandbox's
// container and snapshot with its network set up again (Restart), without
// the Docker Engine in the way. Its floor is containerd's own CLI doing
// the same to a plain `ctr run -d` container of berth/base: `ctr task
// start` of its stopped task's container (after `ctr task rm`) and `ctr
// task exec true`; that container has no network of its own (ctr sets
// none up), so the floor is lower than any wake-up that restores one.
//
//	BERTH_BENCH=1 go test -count=1 -timeout 40m -run '^TestHibernateCrowdBenchContainerd$' -v ./e2e/
func TestHibernateCrowdBenchContainerd(t *testing.T) {
	crowd := hibernateCrowdSize(t)
	requireCtrdImage(t, baseImage)
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, roomFor(crowd))
	floorName, floor := "ctr task start + ctr task exec true (CLI)", ctrRestartFloor(t)
	if floor == nil {
		floorName = ""
	}
	hibernateCrowd(t, "containerd", o.api, crowd, func(r *orchv1.AcquireResponse) { env.track(r.GetLease().GetContainerId()) }, floorName, floor)
}

// hibernateMeasured is how many berth/base leases the hibernate benches
// wake, each hibernateRuns times.
const hibernateMeasured, hibernateRuns = 5, 4

// hibernateCrowdSize skips t unless BERTH_BENCH is set, and returns
// BERTH_HIBERNATED, else 500.
func hibernateCrowdSize(t *testing.T) int {
	t.Helper()
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("a figure for make bench (BERTH_BENCH=1)")
	}
	if v, err := strconv.Atoi(os.Getenv("BERTH_HIBERNATED")); err == nil && v >= 0 {
		return v
	}
	return 500
}

// roomFor lets an orchestrator hold a crowd of hibernated leases besides
// the measured ones.
func roomFor(crowd int) func(*orchestrator.Config) {
	return func(c *orchestrator.Config) { c.Admission.MaxLive = crowd + hibernateMeasured + 10 }
}

// hibernateCrowd acquires and hibernates crowd berth/minimal leases (four
// at a time) through a, then hibernates and wakes hibernateMeasured
// berth/base leases hibernateRuns times each: once by the first exec
// through the proxy, once by a REST :resume. floor (named floorName; nil:
// none) is timed after each wake-up. track sees every acquired lease. It
// logs the HIBERNATE-BENCH lines of make bench, prefixed with backend.
func hibernateCrowd(t *testing.T, backend string, a *api, crowd int, track func(*orchv1.AcquireResponse), floorName string, floor func() time.Duration) {
	t.Helper()
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
			r, err := a.acquire(fmt.Sprintf("crowd-%d", i), minimalImage, "3600s")
			if err != nil {
				errs <- err
				return
			}
			track(r)
			pauseCall(t, a, r.GetLease().GetId(), "hibernate")
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%s: %d berth/minimal leases acquired and hibernated in %s", backend, crowd, time.Since(began).Round(time.Second))

	type lease struct{ id, tok string }
	var ls []lease
	for i := range hibernateMeasured {
		r := a.mustAcquire(t, fmt.Sprintf("measured-%d", i), baseImage, "3600s")
		track(r)
		ls = append(ls, lease{r.GetLease().GetId(), r.GetToken()})
	}
	var first, resume, plain []time.Duration
	for range hibernateRuns {
		for _, l := range ls {
			pauseCall(t, a, l.id, "hibernate")
			_, d := pexec(t, a, l.id, l.tok, "true")
			first = append(first, d)
			pauseCall(t, a, l.id, "hibernate")
			_, d = pauseCall(t, a, l.id, "")
			resume = append(resume, d)
			if floor != nil {
				plain = append(plain, floor())
			}
		}
	}
	p50 := func(ds []time.Duration) time.Duration { return ds[len(ds)/2] }
	type row struct {
		name string
		ds   []time.Duration
	}
	rows := []row{{"first proxy exec to a hibernated lease", first}, {"hibernate→resume (REST :resume)", resume}}
	if floor != nil {
		rows = append(rows, row{floorName, plain})
	}
	for _, m := range rows {
		slices.Sort(m.ds)
		t.Logf("HIBERNATE-BENCH %s, %d hibernated leases on the host: %-42s p50 %8s  max %8s  (n=%d; target: first exec p50 < 300ms)",
			backend, crowd, m.name, p50(m.ds).Round(10*time.Microsecond), m.ds[len(m.ds)-1].Round(10*time.Microsecond), len(m.ds))
	}
	if floor != nil {
		t.Logf("HIBERNATE-BENCH %s: first exec / (%s) p50: %.2f (below 1: faster than the plain CLI's wake-up, which bounds any hibernate that stops the container)",
			backend, floorName, float64(p50(first))/float64(p50(plain)))
	}
}

// ctrRestartFloor starts a plain berth/base container with containerd's
// CLI in the backend's namespace (removed when t ends) and returns the
// function that stops its task, removes it, starts a new one and runs
// `true` in it, timing the start and the exec; nil when there is no ctr
// command.
func ctrRestartFloor(t *testing.T) func() time.Duration {
	t.Helper()
	if _, err := exec.LookPath("ctr"); err != nil {
		t.Logf("no ctr command (%v): no floor for the containerd backend", err)
		return nil
	}
	id := "berth-e2e-plain-" + runID + "-" + randHex(4)
	run := func(args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		full := append([]string{"--address", ctrd.rt.Address(), "-n", ctrd.rt.Namespace()}, args...)
		return exec.CommandContext(ctx, "ctr", full...).CombinedOutput()
	}
	ctr := func(args ...string) {
		t.Helper()
		if out, err := run(args...); err != nil {
			t.Fatalf("ctr %v: %v: %s", args, err, out)
		}
	}
	named, err := reference.ParseNormalizedNamed(baseImage) // containerd keeps full names
	if err != nil {
		t.Fatal(err)
	}
	ctr("run", "-d", "--label", runLabel+"="+runID, named.String(), id, "sleep", "infinity")
	t.Cleanup(func() {
		_, _ = run("task", "rm", "-f", id) // kills the task, if any, and removes it
		if out, err := run("container", "rm", id); err != nil {
			t.Errorf("cleanup: ctr container rm %s: %v: %s", id, err, out)
		}
	})
	n := 0
	return func() time.Duration {
		ctr("task", "rm", "-f", id) // kills the running task and removes it
		t0 := time.Now()
		ctr("task", "start", "-d", id)
		n++
		ctr("task", "exec", "--exec-id", fmt.Sprintf("floor-%d", n), id, "true")
		return time.Since(t0)
	}
}
