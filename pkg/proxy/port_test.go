package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
)

// TestServePort: an edge's authorized request reaches the port with the
// headers it edited, berth's tokens removed, the lease touched; an unknown
// or ended lease and a bad port are answered in JSON without forwarding.
func TestServePort(t *testing.T) {
	f := newFakeRouter()
	e := mountProxy(t, nil, f, nil)
	seen := make(chan http.Header, 1)
	port := listenHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		_, _ = w.Write([]byte("hi " + r.URL.Path))
	}))
	ready, ended := fakeID(1), fakeID(2)
	f.set(ready, lease.Route{State: lease.StateReady, Endpoint: "127.0.0.1:7000"})
	f.set(ended, lease.Route{State: lease.StateReleased, Endpoint: "127.0.0.1:7000", Reason: "released"})
	edge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, p := r.Header.Get("X-Lease"), port
		if r.Header.Get("X-Port") == "0" {
			p = 0
		}
		e.proxy.ServePort(w, r, proxy.PortRequest{LeaseID: id, Port: p, Header: func(h http.Header) {
			h.Del("X-Lease")
			h.Set("X-Access-Token", "agent")
		}})
	}))
	t.Cleanup(edge.Close)

	r := do(t, "GET", edge.URL+"/a/b?x=1", "", http.Header{"X-Lease": {ready}, proxy.TokenHeader: {fakeToken(ready)}, "Authorization": {"Basic dXNlcjo="}}, "")
	if r.code != 200 || string(r.body) != "hi /a/b" {
		t.Fatalf("%d %s", r.code, r.body)
	}
	h := <-seen
	if h.Get("X-Lease") != "" || h.Get("X-Access-Token") != "agent" || h.Get(proxy.TokenHeader) != "" || h.Get("Authorization") != "Basic dXNlcjo=" {
		t.Fatalf("upstream headers %v", h)
	}
	if f.touched(ready) == 0 {
		t.Fatal("the lease was not touched")
	}
	for name, hdr := range map[string]http.Header{
		"unknown": {"X-Lease": {fakeID(3)}}, "ended": {"X-Lease": {ended}}, "bad port": {"X-Lease": {ready}, "X-Port": {"0"}},
	} {
		r := do(t, "GET", edge.URL+"/", "", hdr, "")
		if r.code/100 != 4 || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s %s", name, r.code, r.header.Get("Content-Type"), r.body)
		}
	}
	select {
	case h := <-seen:
		t.Fatalf("forwarded a refused request: %v", h)
	default:
	}
}
