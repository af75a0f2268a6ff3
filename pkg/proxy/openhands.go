package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// The agent serves a subset of the OpenHands agent-server API (package
// pkg/agent/openhands). Its clients (openhands-sdk's RemoteWorkspace) send
// the lease token as X-Session-API-Key and probe GET {host}/health without
// any token; the proxy accepts the first and answers the second.

// SessionKeyHeader carries a lease (or operator) token as OpenHands clients
// send their api_key; an alternative to "Authorization: Bearer TOKEN". It
// is removed before the request reaches the agent.
const SessionKeyHeader = "X-Session-API-Key"

// openHealthPath is the agent path of the OpenHands health probe.
const openHealthPath = "/health"

// openHealthTimeout bounds the probe of the agent behind an open health check.
const openHealthTimeout = 5 * time.Second

// isOpenHealth reports whether r is an OpenHands health probe without any
// token, which the proxy answers itself (serveOpenHealth).
func isOpenHealth(r *http.Request, path string, ts *tokens) bool {
	return ts.empty() && path == openHealthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead)
}

// appSocketPrefix is the agent path of the OpenHands agent-server's event
// WebSocket, /sockets/events/{conversation id}.
const appSocketPrefix = "/sockets/events/"

// isAppSocket reports whether r is a WebSocket upgrade of an app's event
// stream without any token: the OpenHands SDK opens it without headers and
// sends its key in the first frame, for the app to check.
func isAppSocket(r *http.Request, path string, ts *tokens) bool {
	rest, ok := strings.CutPrefix(path, appSocketPrefix)
	return ok && rest != "" && ts.empty() && r.Method == http.MethodGet && isWebSocketUpgrade(r.Header)
}

// openAppSocket lets a tokenless app socket (isAppSocket) through to lease
// id when the lease runs an app (lease.Route.App), which checks the key
// itself in the stream's first frame. Any other lease answers what a
// missing token answers everywhere (401, before whether the lease exists).
// It does not resume a paused lease (the conversation's authenticated
// calls do).
func (p *Proxy) openAppSocket(id string) (opened, *routeError) {
	var none tokens
	rt, lerr := p.lookup(id)
	if lerr != nil || !rt.App {
		_, _, aerr := p.authorize(id, &none)
		return opened{}, aerr
	}
	if lerr := usable(id, rt); lerr != nil {
		return opened{}, lerr
	}
	return opened{acc: accessApp, rt: rt}, nil
}

// serveOpenHealth answers GET /v1/sandboxes/{lease}/health without a
// token: 200 when the lease exists and its agent answers (or the lease is
// PAUSED: it resumes on its next authenticated call), the usual 404, 409
// or 410 otherwise, and 503 when the agent of a READY lease does not
// answer. The body is fixed per status ({"status":"ok"} and the like):
// an unauthenticated caller learns the status code and nothing else, no
// state, reason or owner. It neither resumes a paused lease nor counts as
// activity (an unauthenticated caller must not keep a sandbox alive or
// awake); it tells whether a lease id exists, which ids (80 random bits)
// keep hard to guess.
func (p *Proxy) serveOpenHealth(w http.ResponseWriter, r *http.Request, id string) {
	status := http.StatusOK
	rt, rerr := p.lookup(id)
	if rerr == nil && rt.State != lease.StatePaused {
		rerr = usable(id, rt)
	}
	switch {
	case rerr != nil:
		status = rerr.status
	case rt.State == lease.StateReady:
		if err := p.probeAgent(r.Context(), rt.Endpoint); err != nil {
			p.log.Debug("open health: agent does not answer", "lease_id", id, "error", err)
			status = http.StatusServiceUnavailable
		}
	}
	edge.DrainBodyUpTo(w, r, false, edge.PreAuthDrainLimit)
	p.metrics.http(status)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if r.Method == http.MethodGet {
		_, _ = w.Write([]byte(openHealthBody(status)))
	}
}

// openHealthBody is the fixed body of an open health answer with status.
func openHealthBody(status int) string {
	word := "error"
	switch status {
	case http.StatusOK:
		word = "ok"
	case http.StatusNotFound:
		word = "not found"
	case http.StatusConflict, http.StatusGone, http.StatusServiceUnavailable:
		word = "unavailable"
	}
	return `{"status":"` + word + `"}` + "\n"
}

// probeAgent asks the agent at endpoint for its open health route.
func (p *Proxy) probeAgent(ctx context.Context, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, openHealthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/healthz", nil)
	if err != nil {
		return err
	}
	res, err := p.transport.RoundTrip(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4<<10))
	_ = res.Body.Close()
	if res.StatusCode/100 != 2 {
		return errdefs.Newf(errdefs.ErrUnavailable, "health answered %d", res.StatusCode)
	}
	return nil
}

// isOpenHandsUpload reports whether a REST request is an upload through
// the OpenHands file route (held to the lease's disk limit like the
// others; the multipart framing counts too).
func isOpenHandsUpload(r *http.Request, path string) bool {
	if r.Method != http.MethodPost {
		return false
	}
	if rest, ok := strings.CutPrefix(path, "/api/conversations/"); ok {
		_, tail, _ := strings.Cut(rest, "/")
		path = "/api/" + tail
	}
	return path == "/api/file/upload"
}
