package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
	"github.com/berth-dev/berth/pkg/runtime"
)

func TestAuthMatrix(t *testing.T) {
	t.Parallel() // its own orchestrator and proxy; mostly waits
	e := newEnv(t, nil)
	idA, tokA := e.acquire(t, "conv-a", "")
	_, tokB := e.acquire(t, "conv-b", "")
	idC, tokC := e.acquire(t, "conv-c", "")
	idD, tokD := e.acquire(t, "conv-d", `,"ttl":"1s"`)
	unknown := strings.Repeat("0", 26)

	// Release C through the API.
	if r := do(t, "DELETE", e.orch.Base+"/v1/leases/"+idC, "", bearerHdr(opToken), ""); r.code != 200 {
		t.Fatalf("release: %d %s", r.code, r.body)
	}
	eventually(t, 10*time.Second, "D to expire", func() bool { return e.lease(t, idD).State == lease.StateExpired })

	for _, tc := range []struct {
		name  string
		id    string
		hdr   http.Header
		want  int
		inMsg string
	}{
		{"own token", idA, bearerHdr(tokA), 200, ""},
		{"own token in X-Berth-Token", idA, http.Header{"X-Berth-Token": {tokA}}, 200, ""},
		{"lowercase bearer", idA, http.Header{"Authorization": {"bearer " + tokA}}, 200, ""},
		{"operator token", idA, bearerHdr(opToken), 200, ""},
		{"no token", idA, nil, 401, "missing token"},
		{"wrong token", idA, bearerHdr("nope"), 401, "invalid token"},
		{"forged lease token", idA, bearerHdr(idA + ".AAAA"), 401, "invalid token"},
		{"another lease's token", idA, bearerHdr(tokB), 401, "another lease"},
		{"cookie is not accepted on API routes", idA, http.Header{"Cookie": {"berth_token=" + tokA}}, 401, "missing token"},
		{"basic auth", idA, http.Header{"Authorization": {"Basic " + tokA}}, 401, "missing token"},
		{"unknown lease, operator", unknown, bearerHdr(opToken), 404, "no lease"},
		{"garbage lease id, operator", "NOT-A-LEASE", bearerHdr(opToken), 404, "no lease"},
		{"unknown lease, lease token", unknown, bearerHdr(tokA), 401, "another lease"},
		{"released lease", idC, bearerHdr(tokC), 410, "RELEASED"},
		{"expired lease", idD, bearerHdr(tokD), 410, "EXPIRED: ttl"},
		{"released lease, operator", idC, bearerHdr(opToken), 410, "RELEASED"},
	} {
		r := do(t, "GET", e.sandboxURL(tc.id, "/v1/info"), "", tc.hdr, "")
		if r.code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, r.code, r.body, tc.want)
			continue
		}
		if tc.want == 200 {
			if !strings.Contains(string(r.body), "workspace") && !strings.Contains(string(r.body), "version") {
				t.Errorf("%s: info body %s", tc.name, r.body)
			}
			continue
		}
		m := r.json(t)
		if msg, _ := m["message"].(string); !strings.Contains(msg, tc.inMsg) {
			t.Errorf("%s: message %q, want it to contain %q", tc.name, msg, tc.inMsg)
		}
		if _, ok := m["code"]; !ok {
			t.Errorf("%s: no code in %s", tc.name, r.body)
		}
		if tc.want == 401 && r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: no WWW-Authenticate", tc.name)
		}
		if tc.want == 410 && r.header.Get(proxy.StateHeader) == "" {
			t.Errorf("%s: no %s header", tc.name, proxy.StateHeader)
		}
	}
	if !strings.Contains(e.logs.String(), "operator access to sandbox") || !strings.Contains(e.logs.String(), "lease_id="+idA) {
		t.Errorf("operator access not logged:\n%s", e.logs)
	}
	st := e.proxy.Stats()
	if st.OperatorAccesses != 1 || st.HTTP[200] != 4 || st.HTTP[401] != 7 || st.HTTP[410] != 3 || st.HTTP[404] != 2 {
		t.Errorf("stats = %+v", st)
	}
	if m := scrape(t, e.proxy.Collector()); !strings.Contains(m, `berth_proxy_http_requests_total{code="401"} 7`) {
		t.Errorf("metrics:\n%s", m)
	}
}

func TestPendingLeaseIs409(t *testing.T) {
	orch := orchtest.Start(t, nil)
	release := make(chan struct{})
	orch.Runtime.CreateHook = func(ctx context.Context, _ runtime.Spec) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	e := mountProxy(t, orch, orch.Srv.Manager(), nil)
	m := orch.Srv.Manager()
	done := make(chan string, 1)
	go func() {
		id, _ := acquireOn(t, orch, "pending", "")
		done <- id
	}()
	var id string
	eventually(t, 10*time.Second, "a PENDING lease", func() bool {
		ls, _, err := m.List(context.Background(), lease.Filter{States: []lease.State{lease.StatePending}})
		if err != nil || len(ls) == 0 {
			return false
		}
		id = ls[0].ID
		return true
	})
	r := do(t, "GET", e.sandboxURL(id, "/v1/info"), "", bearerHdr(m.Tokens().Token(id)), "")
	if r.code != 409 || r.header.Get(proxy.StateHeader) != "PENDING" || r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), "PENDING") {
		t.Errorf("pending: %d %v %s", r.code, r.header, r.body)
	}
	close(release)
	if got := <-done; got != id {
		t.Fatalf("acquired %s, want %s", got, id)
	}
	if r := do(t, "GET", e.sandboxURL(id, "/v1/info"), "", bearerHdr(m.Tokens().Token(id)), ""); r.code != 200 {
		t.Errorf("ready: %d %s", r.code, r.body)
	}
}

// TestStatesFromRouter covers the states a real lease passes through too
// briefly to catch (RELEASING) and the routing facts a manager never
// produces (READY without endpoint).
func TestStatesFromRouter(t *testing.T) {
	fr := newFakeRouter()
	e := mountProxy(t, nil, fr, nil)
	for i, tc := range []struct {
		r    lease.Route
		want int
		msg  string
	}{
		{lease.Route{State: lease.StateReleasing, Reason: "released by caller"}, 409, "RELEASING: released by caller"},
		{lease.Route{State: lease.StatePending, Reason: "acquired"}, 409, "PENDING"},
		{lease.Route{State: lease.StateFailed, Reason: "container died (exit 137)"}, 410, "FAILED: container died (exit 137)"},
		{lease.Route{State: lease.StateExpired, Reason: "idle for 5m0s"}, 410, "EXPIRED: idle for 5m0s"},
		{lease.Route{State: lease.StateReady}, 502, "no agent endpoint"},
	} {
		id := fakeID(100 + i)
		fr.set(id, tc.r)
		r := do(t, "POST", e.sandboxURL(id, "/v1/exec"), "", bearerHdr(fakeToken(id)), `{}`)
		if r.code != tc.want || !strings.Contains(r.json(t)["message"].(string), tc.msg) {
			t.Errorf("%s: %d %s, want %d %q", tc.r.State, r.code, r.body, tc.want, tc.msg)
		}
		if fr.touched(id) != 0 {
			t.Errorf("%s: a refused request touched the lease", tc.r.State)
		}
	}
	// Paths outside the routes.
	if r := do(t, "GET", e.srv.URL+"/v1/sandboxes/"+fakeID(1)+"/ports/0/", "", nil, ""); r.code != 404 {
		t.Errorf("port 0: %d %s", r.code, r.body)
	}
	if r := do(t, "GET", e.srv.URL+"/", "bad-host."+domain, nil, ""); r.code != 404 {
		t.Errorf("bad preview host: %d %s", r.code, r.body)
	}
	if r := do(t, "GET", e.srv.URL+"/", "", nil, ""); r.code != http.StatusTeapot {
		t.Errorf("non-sandbox request did not reach the orchestrator mux: %d", r.code)
	}
}
