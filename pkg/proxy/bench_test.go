package proxy_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc/metadata"
)

// latencies records the durations of one side of an interleaved benchmark.
type latencies []time.Duration

func (l latencies) pct(p float64) time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func report(b *testing.B, proxied, direct latencies) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(proxied.pct(0.50)), "proxy-p50-µs")
	b.ReportMetric(us(proxied.pct(0.99)), "proxy-p99-µs")
	b.ReportMetric(us(direct.pct(0.50)), "direct-p50-µs")
	b.ReportMetric(us(direct.pct(0.99)), "direct-p99-µs")
	b.ReportMetric(us(proxied.pct(0.50)-direct.pct(0.50)), "overhead-p50-µs")
}

// interleave runs proxied and direct calls alternately (the order flips
// every iteration) so both see the same machine load.
func interleave(b *testing.B, proxied, direct func() error) {
	for range 20 { // warm up connections and pools
		if err := proxied(); err != nil {
			b.Fatal(err)
		}
		if err := direct(); err != nil {
			b.Fatal(err)
		}
	}
	var pl, dl latencies
	timed := func(f func() error, into *latencies) {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		*into = append(*into, time.Since(t0))
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			timed(proxied, &pl)
			timed(direct, &dl)
		} else {
			timed(direct, &dl)
			timed(proxied, &pl)
		}
	}
	b.StopTimer()
	report(b, pl, dl)
}

// BenchmarkExecTrue measures exec of /bin/true through the proxy and
// directly to the agent, interleaved, over REST and over gRPC; the
// overhead metric is the difference of the p50s.
func BenchmarkExecTrue(b *testing.B) {
	e := newEnv(b, nil)
	id, tok := e.acquire(b, "bench", "")
	endpoint := e.lease(b, id).Endpoint
	agentTok := e.orch.Srv.Manager().Tokens().AgentToken(id)

	b.Run("rest", func(b *testing.B) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
		defer client.CloseIdleConnections()
		call := func(url, tok string) func() error {
			return func() error {
				req, _ := http.NewRequest("POST", url, strings.NewReader(`{"argv":["/bin/true"]}`))
				req.Header.Set("Authorization", "Bearer "+tok)
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(body), `"exitCode":0`) {
					b.Fatalf("exec: %d %s", resp.StatusCode, body)
				}
				return nil
			}
		}
		interleave(b, call(e.sandboxURL(id, "/v1/exec"), tok), call("http://"+endpoint+"/v1/exec", agentTok))
	})

	b.Run("grpc", func(b *testing.B) {
		viaProxy := agentv1.NewProcessServiceClient(dialGRPC(b, serveGRPC(b, e.proxy)))
		direct := agentv1.NewProcessServiceClient(dialGRPC(b, endpoint))
		pctx := leaseCtx(context.Background(), id, tok)
		dctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+agentTok)
		call := func(c agentv1.ProcessServiceClient, ctx context.Context) func() error {
			return func() error {
				res, err := c.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"/bin/true"}})
				if err == nil && res.ExitCode != 0 {
					b.Fatalf("exit %d", res.ExitCode)
				}
				return err
			}
		}
		interleave(b, call(viaProxy, pctx), call(direct, dctx))
	})
}
