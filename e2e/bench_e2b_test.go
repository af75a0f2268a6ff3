package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/proto/e2b/envd/process"
	"github.com/berth-dev/berth/proto/e2b/envd/process/processconnect"
)

// e2bCreate creates a berth/base sandbox through the E2B API (Go's HTTP
// client: Python's start-up would dominate a figure) and returns its id.
func e2bCreate(c *http.Client, base, key string) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/sandboxes", bytes.NewReader([]byte(`{"templateID":"base","timeout":300}`)))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if res.StatusCode != http.StatusCreated || json.Unmarshal(b, &sb) != nil || sb.SandboxID == "" {
		return "", fmt.Errorf("create: HTTP %d: %s", res.StatusCode, b)
	}
	return sb.SandboxID, nil
}

func e2bKill(c *http.Client, base, key, id string) {
	req, _ := http.NewRequest(http.MethodDelete, base+"/sandboxes/"+id, nil)
	req.Header.Set("X-API-Key", key)
	if res, err := c.Do(req); err == nil {
		res.Body.Close()
	}
}

// envdTrue runs `true` through envd's Start stream on the E2B listener and
// requires exit code 0.
func envdTrue(ctx context.Context, pc processconnect.ProcessClient, id string) error {
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "true"}})
	req.Header().Set("E2b-Sandbox-Id", id)
	req.Header().Set("E2b-Sandbox-Port", "49983")
	st, err := pc.Start(ctx, req)
	if err != nil {
		return err
	}
	defer st.Close()
	code := -1
	for st.Receive() {
		if e := st.Msg().GetEvent().GetEnd(); e != nil {
			code = int(e.GetExitCode())
		}
	}
	if err := st.Err(); err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("true exited %d", code)
	}
	return nil
}

// TestE2BBench measures (BERTH_BENCH=1, make bench), in one run on
// Docker with berth/base, interleaved:
//
//   - create → first command: POST /sandboxes on the E2B listener then
//     `true` through envd's Start stream, vs POST /v1/leases then `true`
//     through the proxy's REST exec (p50 of 10 each);
//   - a command: `true` through envd's Start stream vs the proxy's REST
//     exec, in one sandbox each (p50 and p99 of 100 each).
//
// It prints E2B-BENCH lines.
func TestE2BBench(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("a figure for make bench (BERTH_BENCH=1)")
	}
	requireImage(t, baseImage)
	requireImage(t, e2bImage)
	dir, _ := newDataDir(t)
	addr, e2bAddr := freeAddr(t), freeAddr(t)
	p := startProc(t, dir, addr, "BERTH_E2B_LISTEN="+e2bAddr)
	base := "http://" + e2bAddr
	c := keepAliveClient()
	pc := processconnect.NewProcessClient(c, base)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	const creates, execs = 10, 100
	var e2bFirst, berthFirst []time.Duration
	for i := range creates {
		for _, e2bFirstTurn := range []bool{i%2 == 0, i%2 != 0} {
			t0 := time.Now()
			if e2bFirstTurn {
				id, err := e2bCreate(c, base, operatorToken)
				if err != nil {
					t.Fatal(err)
				}
				if err := envdTrue(ctx, pc, id); err != nil {
					t.Fatal(err)
				}
				e2bFirst = append(e2bFirst, time.Since(t0))
				e2bKill(c, base, operatorToken, id)
				continue
			}
			r, err := p.acquire("bench-e2b-"+randHex(4), baseImage, "300s")
			if err != nil {
				t.Fatal(err)
			}
			id := r.GetLease().GetId()
			if err := restExecTrue(c, "http://"+addr+"/v1/sandboxes/"+id+"/v1/exec", r.GetToken()); err != nil {
				t.Fatal(err)
			}
			berthFirst = append(berthFirst, time.Since(t0))
			p.mustRelease(t, id)
		}
	}

	sid, err := e2bCreate(c, base, operatorToken)
	if err != nil {
		t.Fatal(err)
	}
	defer e2bKill(c, base, operatorToken, sid)
	r := p.mustAcquire(t, "bench-e2b-exec", baseImage, "300s")
	defer p.mustRelease(t, r.GetLease().GetId())
	execURL := "http://" + addr + "/v1/sandboxes/" + r.GetLease().GetId() + "/v1/exec"
	var viaEnvd, viaREST []time.Duration
	for i := range execs + 5 {
		t0 := time.Now()
		if err := envdTrue(ctx, pc, sid); err != nil {
			t.Fatal(err)
		}
		d1 := time.Since(t0)
		t0 = time.Now()
		if err := restExecTrue(c, execURL, r.GetToken()); err != nil {
			t.Fatal(err)
		}
		d2 := time.Since(t0)
		if i >= 5 { // warm-up
			viaEnvd, viaREST = append(viaEnvd, d1), append(viaREST, d2)
		}
	}
	t.Logf("E2B-BENCH create->first command p50: E2B API + envd Start %.1f ms, berth REST acquire + exec %.1f ms (ratio %.2f; %d each)",
		ms(percentile(e2bFirst, 50)), ms(percentile(berthFirst, 50)), ms(percentile(e2bFirst, 50))/ms(percentile(berthFirst, 50)), creates)
	t.Logf("E2B-BENCH command `true`: envd Start stream p50 %.2f ms p99 %.2f ms, berth REST exec p50 %.2f ms p99 %.2f ms (ratio p50 %.2f; %d each)",
		ms(percentile(viaEnvd, 50)), ms(percentile(viaEnvd, 99)), ms(percentile(viaREST, 50)), ms(percentile(viaREST, 99)),
		ms(percentile(viaEnvd, 50))/ms(percentile(viaREST, 50)), execs)
}
