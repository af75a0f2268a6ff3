package proxy

import (
	"net/http"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
)

// PortRequest is a request, already authorized by the caller of
// ServePort, to a port of a lease's sandbox.
type PortRequest struct {
	// LeaseID names the lease.
	LeaseID string
	// Port is the TCP port inside the sandbox (1-65535).
	Port int
	// Header, when set, edits the upstream request's headers last, after
	// the proxy removed berth's tokens (X-Berth-Token, berth_token
	// cookies); the caller's Authorization header is passed on unless
	// Header removes it.
	Header func(http.Header)
}

// ServePort proxies r to a port of a lease's sandbox for an edge that has
// authorized the caller itself (the E2B listener, package e2b): no token is
// checked here. As on every route, a PAUSED lease is resumed first, a lease
// that is not READY is refused (409, 410), the lease is touched while the
// request runs, and the upstream's answer is confined like a host-form
// preview's (confine.go). Failures are answered as JSON {"code",
// "message", "details"}: 404 unknown lease, 502 nothing answers, 504
// timeout.
func (p *Proxy) ServePort(w http.ResponseWriter, r *http.Request, req PortRequest) {
	sw := &statusWriter{ResponseWriter: w}
	w = sw
	kind := kindPreview
	if isWebSocketUpgrade(r.Header) {
		kind = kindWebSocket
	}
	start := time.Now()
	defer func() { p.metrics.observeDuration(kind, sw.status, time.Since(start)) }()
	id := req.LeaseID
	if req.Port < 1 || req.Port > 65535 {
		p.fail(w, r, false, id, errNoRoute("bad port"))
		return
	}
	rt, rerr := p.lookup(id)
	if rerr == nil && rt.State == lease.StatePaused {
		rt, rerr = p.resume(r.Context(), id)
	}
	if rerr == nil {
		rerr = usable(id, rt)
	}
	if rerr != nil {
		p.fail(w, r, false, id, rerr)
		return
	}
	t, rerr := portTarget(id, rt, req.Port, "", r.URL.EscapedPath(), r.URL.RawQuery)
	if rerr != nil {
		p.fail(w, r, false, id, rerr)
		return
	}
	t.jsonErrors = true
	t.editHeader = req.Header
	p.forward(w, r, t)
}
