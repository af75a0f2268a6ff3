package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// chaosSettle is how long after a restart begins the checks wait: the lease
// manager resyncs with the engine 1 s and 5 s after it starts, so that a
// creation the killed process left in flight in the engine is cleaned up.
const chaosSettle = 6500 * time.Millisecond

// chaosResync is when, after a restart begins, the lease manager's periodic
// resync (every 30s) has run at least once.
const chaosResync = 36 * time.Second

// acquireOutcome is one acquire's answer.
type acquireOutcome struct {
	conv   string
	status int // 0: transport error
	err    error
	resp   *orchv1.AcquireResponse
}

// acquireAll fires one acquire per conversation in convs at once and sends
// each outcome on out as it arrives.
func acquireAll(a *api, convs []string, image string, out chan<- acquireOutcome) *sync.WaitGroup {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, c := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			code, _, b, err := a.call(http.MethodPost, "/v1/leases", acquireReq{ConversationID: c, Image: image, TTL: "600s"})
			o := acquireOutcome{conv: c, status: code, err: err}
			if err == nil && code == http.StatusOK {
				var r orchv1.AcquireResponse
				if o.err = decode(b, &r); o.err == nil {
					o.resp = &r
				}
			} else if err == nil {
				o.err = fmt.Errorf("HTTP %d: %s", code, trunc(string(b), 200))
			}
			out <- o
		}()
	}
	close(start)
	return &wg
}

// chaosKillDuringAcquire: SIGKILL the orchestrator while 20 acquires (15
// conversations, 5 of them asked twice) are in flight, restart it on the
// same data dir, and count leases lost, containers leaked and conversations
// with two containers. All must be 0.
func chaosKillDuringAcquire(t *testing.T, cfg chaosSizes, table *chaosTable) {
	row := &chaosRow{name: "orchestrator SIGKILL during 20 concurrent acquires", runs: cfg.killRounds, pass: true, order: 100}
	table.add(row)
	defer func(t0 time.Time) { row.took = time.Since(t0) }(time.Now())
	dir, instance := newDataDir(t)
	addr := freeAddr(t)
	p := startProc(t, dir, addr)
	rng := rand.New(rand.NewPCG(uint64(cfg.fuzzSeed), 1))

	var lost, leaked, transient, doubles, acquired, interrupted, reacquired, refused, panics int
	var killPoints []string
	for round := range cfg.killRounds {
		const distinct, dup = 15, 5
		var convs []string
		for i := range distinct {
			convs = append(convs, fmt.Sprintf("k%d-c%02d", round, i))
		}
		convs = append(convs, convs[:dup]...)
		// Kill once `after` answers arrived (0: after a short random delay).
		after := rng.IntN(12)
		delay := time.Duration(rng.IntN(400)) * time.Millisecond

		out := make(chan acquireOutcome, len(convs))
		wg := acquireAll(p.api, convs, minimalImage, out)
		var got []acquireOutcome
		if after == 0 {
			time.Sleep(delay)
		} else {
			for len(got) < after {
				got = append(got, <-out)
			}
		}
		p.kill9(t)
		wg.Wait()
		close(out)
		for o := range out {
			got = append(got, o)
		}
		answeredBefore := after
		ok := map[string]string{} // conversation → lease id answered with 200
		for _, o := range got {
			if o.resp == nil {
				interrupted++
				continue
			}
			acquired++
			id := o.resp.GetLease().GetId()
			if prev, seen := ok[o.conv]; seen && prev != id {
				doubles++
				row.fail(t, "round %d: conversation %s answered with two leases %s and %s", round, o.conv, prev, id)
			}
			ok[o.conv] = id
		}
		if after == 0 {
			killPoints = append(killPoints, fmt.Sprintf("%dms", delay.Milliseconds()))
		} else {
			killPoints = append(killPoints, fmt.Sprintf("%d/20", answeredBefore))
		}

		restarted := time.Now()
		p = startProc(t, dir, addr)
		time.Sleep(time.Until(restarted.Add(chaosSettle)))

		// Lost: an acquire answered 200 whose lease is not READY and usable.
		for _, o := range got {
			if o.resp == nil {
				continue
			}
			id := o.resp.GetLease().GetId()
			l, code, b := p.get(t, id)
			if code != http.StatusOK || l.GetState() != orchv1.LeaseState_LEASE_STATE_READY {
				lost++
				row.fail(t, "round %d: lease %s of %s (answered 200) is lost after restart: HTTP %d %s %s", round, id, o.conv, code, l.GetState(), trunc(string(b)+l.GetReason(), 200))
				continue
			}
			if okExec, msg := p.execOK(id, o.resp.GetToken(), "true"); !okExec {
				lost++
				row.fail(t, "round %d: lease %s of %s is READY after restart but exec fails: %s", round, id, o.conv, msg)
			}
		}
		// A container no READY lease owns may be a creation the killed
		// process left in flight that the engine finished after the
		// resyncs; the periodic resync (every 30s) must remove it. Only one
		// still there after that is a leak.
		if orphans := chaosOrphans(t, p, instance); len(orphans) > 0 {
			time.Sleep(time.Until(restarted.Add(chaosResync)))
			still := chaosOrphans(t, p, instance)
			for cid, desc := range still {
				if _, before := orphans[cid]; before {
					leaked++
					row.fail(t, "round %d: %s after restart, %s", round, chaosResync, desc)
				}
			}
			transient += len(orphans) - len(still)
		}
		doubles += chaosDoubles(t, instance, row, fmt.Sprintf("round %d", round))

		// Every conversation can be acquired again (all at once); one
		// answered before keeps its lease.
		var mu sync.Mutex
		forEach(convs[:distinct], func(c string) {
			code, b, err := acquireRetry(p.api, acquireReq{ConversationID: c, Image: minimalImage, TTL: "600s"})
			mu.Lock()
			defer mu.Unlock()
			if err == nil && (code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests) {
				// The engine (or the limit) refused it three times: no lease
				// is lost by that, but it is counted.
				refused++
				return
			}
			var r orchv1.AcquireResponse
			if err == nil && code == http.StatusOK {
				err = decode(b, &r)
			} else if err == nil {
				err = fmt.Errorf("HTTP %d: %s", code, trunc(string(b), 300))
			}
			if err != nil {
				row.fail(t, "round %d: re-acquire %s after restart: %v", round, c, err)
				return
			}
			if prev, seen := ok[c]; seen && prev != r.GetLease().GetId() {
				lost++
				row.fail(t, "round %d: re-acquire %s after restart got lease %s, but %s was answered before the kill", round, c, r.GetLease().GetId(), prev)
			}
			if _, seen := ok[c]; !seen {
				reacquired++
			}
		})
		// Release the round's leases (all at once), so rounds do not add up.
		ls, err := p.list("")
		if err != nil {
			row.fail(t, "round %d: list: %v", round, err)
		}
		forEach(ls, func(l *orchv1.Lease) {
			if code, _, b, err := p.call(http.MethodDelete, "/v1/leases/"+l.GetId(), nil); err != nil || code != http.StatusOK {
				row.fail(t, "round %d: release %s: HTTP %d %v %s", round, l.GetId(), code, err, trunc(string(b), 200))
			}
		})
		if h := procHealth(p); h != "" {
			panics++
			row.fail(t, "round %d: %s", round, h)
		}
	}
	// After releasing everything, nothing of this instance is left.
	var left []string
	eventually(15*time.Second, 100*time.Millisecond, func() bool {
		left = containersWith(t, runtime.LabelInstance+"="+instance)
		return len(left) == 0
	})
	if len(left) > 0 {
		leaked += len(left)
		row.fail(t, "%d container(s) of the instance left 15s after every lease was released: %v", len(left), left)
	}
	row.figures = fmt.Sprintf("lost %d, leaked %d, double %d (200s %d, interrupted %d, re-acquired after restart %d, re-acquire refused 503/429 x3 %d, orphans removed by the 30s resync %d; killed at %s)",
		lost, leaked, doubles, acquired, interrupted, reacquired, refused, transient, strings.Join(killPoints, " "))
}

// acquireRetry posts an acquire and retries it twice (after 2s, then 4s)
// while it is answered 503 (the engine unavailable) or 429, as a client
// would; it returns the last answer.
func acquireRetry(a *api, body any) (int, []byte, error) {
	for i := 0; ; i++ {
		code, _, b, err := a.call(http.MethodPost, "/v1/leases", body)
		if err != nil || (code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests) || i == 2 {
			return code, b, err
		}
		time.Sleep(time.Duration(2<<i) * time.Second)
	}
}

// forEach runs f on every element of xs at once and waits for them all.
func forEach[T any](xs []T, f func(T)) {
	var wg sync.WaitGroup
	for _, x := range xs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(x)
		}()
	}
	wg.Wait()
}

// chaosOrphans returns the containers of instance that no READY lease
// owns, with a description of each.
func chaosOrphans(t *testing.T, p *proc, instance string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, cid := range containersWith(t, runtime.LabelInstance+"="+instance) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		lid, err := dockerCLI(ctx, "inspect", "--format", `{{index .Config.Labels "`+runtime.LabelLease+`"}}`, cid)
		cancel()
		if err != nil {
			continue // removed meanwhile
		}
		l, code, _ := p.get(t, strings.TrimSpace(lid))
		if code != http.StatusOK || l.GetState() != orchv1.LeaseState_LEASE_STATE_READY || l.GetContainerId() != cid {
			out[cid] = fmt.Sprintf("container %s (%s) of lease %s has no live lease: HTTP %d, %s", cid[:12], describeContainer(t, cid), strings.TrimSpace(lid), code, l.GetState())
		}
	}
	return out
}

// chaosDoubles counts the extra containers of conversations that have more
// than one.
func chaosDoubles(t *testing.T, instance string, row *chaosRow, when string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := dockerCLI(ctx, "ps", "-a", "--filter", "label="+runtime.LabelInstance+"="+instance, "--format", `{{.Label "`+runtime.LabelConversation+`"}}`)
	if err != nil {
		row.fail(t, "%s: docker ps: %v %s", when, err, out)
		return 0
	}
	per := map[string]int{}
	for _, c := range strings.Fields(out) {
		per[c]++
	}
	n := 0
	for c, k := range per {
		if k > 1 {
			n += k - 1
			row.fail(t, "%s: conversation %s has %d containers", when, c, k)
		}
	}
	return n
}

// chaosAcquireStorm: 50 concurrent acquires of distinct conversations
// against --max-leases 5: the excess is refused with 429 and Retry-After,
// nothing answers 5xx, and releasing everything leaves no container.
func chaosAcquireStorm(t *testing.T, cfg chaosSizes, table *chaosTable) {
	const limit, n = 5, 50
	row := &chaosRow{name: "acquire storm: 50 concurrent vs --max-leases 5", runs: cfg.stormRuns, pass: true, order: 300}
	table.add(row)
	defer func(t0 time.Time) { row.took = time.Since(t0) }(time.Now())
	dir, instance := newDataDir(t)
	p := startProc(t, dir, freeAddr(t), "BERTH_MAX_LEASES="+strconv.Itoa(limit))
	counts := map[string]int{}
	var lat []time.Duration
	leaks := 0
	for run := range cfg.stormRuns {
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				code, h, b, err := p.call(http.MethodPost, "/v1/leases", acquireReq{ConversationID: fmt.Sprintf("s%d-c%02d", run, i), Image: minimalImage, TTL: "600s"})
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				lat = append(lat, d)
				switch {
				case err != nil:
					counts["error"]++
					row.fail(t, "run %d: acquire: %v", run, err)
				case code == http.StatusOK:
					counts["200"]++
				case code == http.StatusTooManyRequests:
					counts["429"]++
					if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s < 1 {
						counts["429 without Retry-After"]++
					}
				case code >= 500:
					counts["5xx"]++
					row.fail(t, "run %d: acquire: HTTP %d: %s", run, code, trunc(string(b), 200))
				default:
					counts[strconv.Itoa(code)]++
					row.fail(t, "run %d: acquire: HTTP %d: %s", run, code, trunc(string(b), 200))
				}
			}()
		}
		close(start)
		wg.Wait()
		ls, err := p.list("")
		if err != nil {
			row.fail(t, "run %d: list: %v", run, err)
		}
		if len(ls) > limit {
			row.fail(t, "run %d: %d live leases, limit %d", run, len(ls), limit)
		}
		for _, l := range ls {
			p.mustRelease(t, l.GetId())
		}
		var left []string
		eventually(10*time.Second, 100*time.Millisecond, func() bool {
			left = containersWith(t, runtime.LabelInstance+"="+instance)
			return len(left) == 0
		})
		leaks += len(left)
		if len(left) > 0 {
			row.fail(t, "run %d: %d container(s) left 10s after releasing every lease", run, len(left))
		}
	}
	if counts["429 without Retry-After"] > 0 {
		row.fail(t, "%d 429 answers without a positive Retry-After", counts["429 without Retry-After"])
	}
	if counts["200"] != limit*cfg.stormRuns {
		row.fail(t, "%d acquires answered 200, want %d (the limit, per run)", counts["200"], limit*cfg.stormRuns)
	}
	if h := procHealth(p); h != "" {
		row.fail(t, "%s", h)
	}
	row.figures = fmt.Sprintf("200: %d, 429: %d (without Retry-After %d), 5xx: %d, other: %d, leaked: %d; acquire p50 %.0fms p99 %.0fms",
		counts["200"], counts["429"], counts["429 without Retry-After"], counts["5xx"], n*cfg.stormRuns-counts["200"]-counts["429"]-counts["5xx"], leaks,
		ms(percentile(lat, 50)), ms(percentile(lat, 99)))
}
