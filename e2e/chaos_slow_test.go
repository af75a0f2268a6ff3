package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

// chaosHeaderTimeout is how long the orchestrator's HTTP server waits for
// a request's headers (its default readHeaderTimeout).
var chaosHeaderTimeout = time.Duration(orchestrator.Defaults().ReadHeaderTimeout)

// chaosNormalP99 bounds the normal client's p99 latency during the attack.
const chaosNormalP99 = time.Second

// chaosSlowloris opens many connections that send a request's headers one
// byte at a time and never finish them, and meanwhile measures a normal
// client (a new connection per request, GET /healthz and GET of a lease);
// it counts how many slow connections the server closed and when.
func chaosSlowloris(t *testing.T, cfg chaosSizes, table *chaosTable) {
	row := &chaosRow{name: fmt.Sprintf("slowloris: %d connections, 1 header byte/s, %s", cfg.slowConns, cfg.slowFor), runs: 1, pass: true, order: 500}
	table.add(row)
	defer func(t0 time.Time) { row.took = time.Since(t0) }(time.Now())
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	p := startProc(t, dir, addr)
	l := p.mustAcquire(t, "slowloris-probe", minimalImage, "600s").GetLease()

	normal := func(stop <-chan struct{}) (lat []time.Duration, errs int, firstErr string) {
		cl := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: 10 * time.Second}
		defer cl.CloseIdleConnections()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return lat, errs, firstErr
			case <-time.After(20 * time.Millisecond):
			}
			path := "/healthz"
			if i%2 == 1 {
				path = "/v1/leases/" + l.GetId()
			}
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
			req.Header.Set("Authorization", "Bearer "+operatorToken)
			t0 := time.Now()
			resp, err := cl.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
				}
			}
			if err != nil {
				errs++
				if firstErr == "" {
					firstErr = err.Error()
				}
				continue
			}
			lat = append(lat, time.Since(t0))
		}
	}

	// Baseline: one second of the normal client alone.
	stop := make(chan struct{})
	time.AfterFunc(time.Second, func() { close(stop) })
	base, baseErrs, _ := normal(stop)

	// The attack: every slow client trickles a request's headers one byte
	// a second and never ends them; when the server closes its connection,
	// it opens another.
	attackStart := time.Now()
	var mu sync.Mutex
	var opened, closed, inTime, held int
	var lifetimes []time.Duration
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range cfg.slowConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 5 * time.Millisecond) // ramp up over ~1s
			for {
				select {
				case <-done:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				mu.Lock()
				opened++
				mu.Unlock()
				began := time.Now()
				gone := make(chan struct{})
				go func() {
					// The server closing the connection (or answering).
					var b [512]byte
					_, _ = c.Read(b[:])
					close(gone)
				}()
				msg := "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
				byServer := false
			trickle:
				for j := 0; ; j++ {
					b := byte('a')
					if j < len(msg) {
						b = msg[j]
					}
					if _, err := c.Write([]byte{b}); err != nil {
						byServer = true
						break
					}
					select {
					case <-done:
						break trickle
					case <-gone:
						byServer = true
						break trickle
					case <-time.After(time.Second):
					}
				}
				life := time.Since(began)
				c.Close()
				mu.Lock()
				if byServer {
					closed++
					lifetimes = append(lifetimes, life)
					if life <= chaosHeaderTimeout+2*time.Second {
						inTime++
					}
				} else if life > chaosHeaderTimeout+5*time.Second {
					held++ // still open when the attack ended, far past the timeout
				}
				mu.Unlock()
			}
		}()
	}
	stop = make(chan struct{})
	time.AfterFunc(cfg.slowFor, func() { close(stop) })
	during, duringErrs, firstErr := normal(stop)
	close(done)
	wg.Wait()
	attack := time.Since(attackStart)
	closedP50 := percentile(lifetimes, 50)

	if baseErrs+duringErrs > 0 {
		row.fail(t, "the normal client failed %d time(s) before and %d during the attack: %s", baseErrs, duringErrs, firstErr)
	}
	if len(during) == 0 {
		row.fail(t, "the normal client completed no request during the attack")
	} else if p99 := percentile(during, 99); p99 > chaosNormalP99 {
		row.fail(t, "the normal client's p99 during the attack is %s, want <= %s", p99.Round(time.Millisecond), chaosNormalP99)
	}
	// No connection may be held open far past the header timeout.
	if held > 0 || closed > inTime {
		row.fail(t, "%d slow connection(s) still open %s after they began, %d closed later than the header timeout (%s) + 2s", held, chaosHeaderTimeout+5*time.Second, closed-inTime, chaosHeaderTimeout)
	}
	if h := procHealth(p); h != "" {
		row.fail(t, "%s", h)
	}
	row.figures = fmt.Sprintf("normal client p50 %.1fms p99 %.1fms (%d requests, %d errors; alone: p50 %.1fms p99 %.1fms); slow connections opened %d, closed by the server %d (within the header timeout %s + 2s: %d, after p50 %.1fs), held past it %d; attack %.0fs",
		ms(percentile(during, 50)), ms(percentile(during, 99)), len(during), duringErrs, ms(percentile(base, 50)), ms(percentile(base, 99)),
		opened, closed, chaosHeaderTimeout, inTime, closedP50.Seconds(), held, attack.Seconds())
}
