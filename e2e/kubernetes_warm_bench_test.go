package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

// TestKubernetesWarmBench measures (BERTH_BENCH=1, make bench) warm claims
// on the test cluster beside Docker: an acquire of a pool's profile while
// the pool has ready members, one at a time, the pool refilled between
// two (so every claim finds a member). Target: p50 < 100 ms on the
// cluster.
//
//	BERTH_BENCH=1 scripts/k8s/test.sh go test -count=1 -run '^TestKubernetesWarmBench$' -v ./e2e/
func TestKubernetesWarmBench(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("a figure for make bench (BERTH_BENCH=1)")
	}
	const size, claims = 3, 12
	pools := []orchestrator.Pool{{Name: "w", Image: minimalImage, Min: size, Max: size}}
	withPools := func(c *orchestrator.Config) { c.Pools = pools }
	k, _, _ := startK8sOrch(t, withPools)
	requireImage(t, minimalImage)
	dir, _ := newDataDir(t)
	d := startOrch(t, dir, withPools).api

	took := map[string][]time.Duration{}
	for _, b := range []struct {
		name string
		a    *api
	}{{"kubernetes", k}, {"docker", d}} {
		for i := range claims {
			waitPoolMetric(t, b.a, "w", size)
			t0 := time.Now()
			r := b.a.mustAcquire(t, fmt.Sprintf("bench-warm-%s-%d", randHex(3), i), minimalImage, "600s")
			took[b.name] = append(took[b.name], time.Since(t0))
			if r.GetLease().GetPool() != "w" {
				t.Fatalf("%s: acquire %d was not claimed from pool w (pool %q)", b.name, i, r.GetLease().GetPool())
			}
			b.a.mustRelease(t, r.GetLease().GetId())
		}
	}
	p := func(name string, q float64) time.Duration {
		return percentile(took[name], q).Round(100 * time.Microsecond)
	}
	fmt.Printf("K8S-BENCH %-48s kubernetes p50 %8s p99 %8s | docker p50 %8s p99 %8s | kubernetes/docker p50 %5.2fx (target: kubernetes p50 < 100ms)\n",
		fmt.Sprintf("warm claim (REST acquire from a pool; n=%d):", claims), p("kubernetes", 50), p("kubernetes", 99), p("docker", 50), p("docker", 99),
		ms(percentile(took["kubernetes"], 50))/ms(percentile(took["docker"], 50)))
}

// waitPoolMetric waits until the orchestrator's /metrics reports n ready
// sandboxes in pool name (berth_pool_sandboxes).
func waitPoolMetric(t *testing.T, a *api, name string, n int) {
	t.Helper()
	want := fmt.Sprintf(`berth_pool_sandboxes{pool=%q}`, name)
	got := -1
	if !eventually(3*time.Minute, 50*time.Millisecond, func() bool {
		code, _, b, err := a.call(http.MethodGet, "/metrics", nil)
		if err != nil || code != http.StatusOK {
			return false
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), want+" "); ok {
				got, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		return got == n
	}) {
		t.Fatalf("pool %s: %d ready in /metrics, want %d", name, got, n)
	}
}
