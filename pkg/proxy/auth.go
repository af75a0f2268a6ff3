package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/berth-dev/berth/pkg/lease"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// access is what a caller's token allowed.
type access int

const (
	accessNone     access = iota
	accessLease           // the lease's own token
	accessOperator        // the operator token
	accessPublic          // a public preview port, no token needed
	accessApp             // an app's event socket, no token needed (the app checks its key)
)

func (a access) String() string {
	switch a {
	case accessLease:
		return "lease"
	case accessOperator:
		return "operator"
	case accessPublic:
		return "public"
	case accessApp:
		return "app"
	}
	return "none"
}

// routeError is a failure decided by the proxy itself (not the upstream):
// an HTTP status, and an errdefs category with the message, which the
// edges turn into the gRPC code and the JSON body (errgrpc).
type routeError struct {
	status int         // HTTP status
	err    error       // category and message (errdefs.Newf)
	state  lease.State // set for 409 and 410
}

func (e *routeError) Error() string { return e.err.Error() }

// Unwrap returns the category, for errors.Is and errgrpc.ToGRPC.
func (e *routeError) Unwrap() error { return e.err }

// code is e's gRPC code.
func (e *routeError) code() codes.Code { return status.Code(errgrpc.ToGRPC(e.err)) }

func newRouteError(httpStatus int, category error, format string, args ...any) *routeError {
	return &routeError{status: httpStatus, err: errdefs.Newf(category, format, args...)}
}

func errNoRoute(msg string) *routeError {
	return newRouteError(http.StatusNotFound, errdefs.ErrNotFound, "%s", msg)
}

func errUnauthenticated(msg string) *routeError {
	return newRouteError(http.StatusUnauthorized, errdefs.ErrUnauthenticated, "%s", msg)
}

// tokens holds the candidate tokens of one request (at most a few; no
// allocation for the common single-token case).
type tokens struct {
	fixed [3]string
	n     int
	more  []string
}

func (t *tokens) add(s string) {
	s = strings.TrimSpace(s)
	if s == "" {
		return
	}
	if t.n < len(t.fixed) {
		t.fixed[t.n] = s
		t.n++
		return
	}
	t.more = append(t.more, s)
}

// addAll adds the bearer tokens of authorization values, then the values
// of the proxy's token header or metadata key (X-Berth-Token).
func (t *tokens) addAll(authorization, berthToken []string) {
	for tok := range bearer.All(authorization) {
		t.add(tok)
	}
	for _, v := range berthToken {
		t.add(v)
	}
}

func (t *tokens) each(f func(string) bool) {
	for i := 0; i < t.n; i++ {
		if !f(t.fixed[i]) {
			return
		}
	}
	for _, s := range t.more {
		if !f(s) {
			return
		}
	}
}

func (t *tokens) empty() bool { return t.n == 0 }

// authorize checks the candidate tokens against lease id: the operator
// token or id's own lease token opens it; anything else is a 401 that says
// what was wrong. matched is the token that opened it.
func (p *Proxy) authorize(id string, ts *tokens) (acc access, matched string, err *routeError) {
	if ts.empty() {
		return accessNone, "", errUnauthenticated("missing token: send the lease token as 'Authorization: Bearer TOKEN'")
	}
	other := false
	ts.each(func(tok string) bool {
		if p.cfg.Operator.Matches(tok) {
			acc, matched = accessOperator, tok
			return false
		}
		if lid, ok := p.leaseTokens.VerifyToken(tok); ok {
			if lid == id {
				acc, matched = accessLease, tok
				return false
			}
			other = true
		}
		return true
	})
	switch {
	case acc != accessNone:
		return acc, matched, nil
	case other:
		return accessNone, "", errUnauthenticated("the token belongs to another lease, not " + id)
	default:
		return accessNone, "", errUnauthenticated("invalid token for lease " + id)
	}
}

// opened is a request let through to its lease: the caller's access, the
// token that gave it ("" for a public port) and the lease's route.
type opened struct {
	acc     access
	matched string
	rt      lease.Route
	// hold keeps a pause off the lease until the agent answered (nil
	// without a Holder); the caller calls hold.Done when the request ends.
	hold *lease.Hold
}

// origin describes a request for the operator access log.
type origin struct {
	kind, method, path, remote string
}

// open is the sequence every route runs before it forwards to lease id:
// authorize the candidate tokens (unless port is one of the lease's public
// preview ports; 0 for the agent's API), look the lease up, resume it if it
// is PAUSED (the caller sees latency, not an error) and hold it (admit),
// and check that it can take traffic; an operator's access is logged. On
// success the caller must call op.hold.Done when the request ends. A failed
// authorization answers before a missing lease, so that only a valid token
// learns whether a lease exists.
func (p *Proxy) open(ctx context.Context, id string, ts *tokens, port int, o origin) (opened, *routeError) {
	var op opened
	var lerr *routeError
	if port > 0 {
		// A public port needs no token: look the lease up first.
		op.rt, lerr = p.lookup(id)
	}
	if port == 0 || lerr != nil || !slices.Contains(op.rt.PublicPorts, port) {
		var aerr *routeError
		if op.acc, op.matched, aerr = p.authorize(id, ts); aerr != nil {
			return opened{}, aerr
		}
		if port == 0 {
			op.rt, lerr = p.lookup(id)
		}
	} else {
		op.acc = accessPublic
	}
	if lerr == nil {
		op.rt, op.hold, lerr = p.admit(ctx, id, op.rt)
	}
	if lerr == nil {
		lerr = usable(id, op.rt)
	}
	if lerr != nil {
		op.hold.Done()
		return opened{}, lerr
	}
	if op.acc == accessOperator {
		p.logOperator(id, o)
	}
	return op, nil
}

// Resumer is the optional part of a LeaseRouter that resumes a PAUSED
// lease (lease.Manager implements it; concurrent calls for one lease share
// one resume). Without it a paused lease answers 409.
type Resumer interface {
	// Resume makes a PAUSED lease READY again; a READY lease is returned as it is.
	Resume(ctx context.Context, id string) (lease.Lease, error)
}

var _ Resumer = (*lease.Manager)(nil)

// Holder is the optional part of a LeaseRouter that admits a request to a
// lease: it resumes a PAUSED lease and holds a READY one so that no pause
// lands between the resume and the request reaching the agent (see
// lease.Manager.Use, which implements it). Without it the proxy resumes
// through Resumer, and a racing pause may still answer 409 or 502.
type Holder interface {
	// Use waits for the lease to be READY (resuming it when PAUSED) and
	// holds it; a lease in another state comes back with a nil Hold.
	Use(ctx context.Context, id string) (lease.Route, *lease.Hold, error)
}

var _ Holder = (*lease.Manager)(nil)

// admit resumes and holds lease id (route rt, just looked up) for a
// request, with the LeaseRouter's Holder, or resumes it with its Resumer
// when it is PAUSED. A lease that could not be resumed is a 503.
func (p *Proxy) admit(ctx context.Context, id string, rt lease.Route) (lease.Route, *lease.Hold, *routeError) {
	h, ok := p.leases.(Holder)
	if !ok {
		if rt.State != lease.StatePaused {
			return rt, nil, nil
		}
		rt, lerr := p.resume(ctx, id)
		return rt, nil, lerr
	}
	rt, hold, err := h.Use(ctx, id)
	if err == nil {
		return rt, hold, nil
	}
	rt, lerr := p.lookup(id)
	if lerr != nil {
		return rt, nil, lerr
	}
	if rt.State == lease.StatePaused {
		return rt, nil, newRouteError(http.StatusServiceUnavailable, errdefs.ErrUnavailable, "lease %s is PAUSED and could not be resumed: %s", id, err.Error())
	}
	return rt, nil, newRouteError(http.StatusServiceUnavailable, errdefs.ErrUnavailable, "lease %s is %s and could not take the request: %s", id, rt.State, err.Error())
}

// resume resumes paused lease id and returns its route afterwards. A
// resume that fails while the lease stays PAUSED is a 503.
func (p *Proxy) resume(ctx context.Context, id string) (lease.Route, *routeError) {
	r, ok := p.leases.(Resumer)
	if !ok {
		return p.lookup(id)
	}
	_, err := r.Resume(ctx, id)
	rt, lerr := p.lookup(id)
	if err != nil && lerr == nil && rt.State == lease.StatePaused {
		return rt, newRouteError(http.StatusServiceUnavailable, errdefs.ErrUnavailable, "lease %s is PAUSED and could not be resumed: %s", id, err.Error())
	}
	return rt, lerr
}

// lookup returns lease id's route, or a 404.
func (p *Proxy) lookup(id string) (lease.Route, *routeError) {
	if !lease.ValidID(id) {
		return lease.Route{}, errNoRoute("no lease " + id)
	}
	rt, err := p.leases.Route(id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return lease.Route{}, errNoRoute("no lease " + id)
		}
		return lease.Route{}, newRouteError(http.StatusInternalServerError, errdefs.ErrInternal, "lease %s: %s", id, err.Error())
	}
	return rt, nil
}

// usable checks that a lease can take traffic: READY with an endpoint.
func usable(id string, rt lease.Route) *routeError {
	e := func(httpStatus int, category error, format string, args ...any) *routeError {
		re := newRouteError(httpStatus, category, format, args...)
		re.state = rt.State
		return re
	}
	switch rt.State {
	case lease.StateReady:
		if rt.Endpoint == "" {
			return newRouteError(http.StatusBadGateway, errdefs.ErrUnavailable, "lease %s has no agent endpoint", id)
		}
		return nil
	case lease.StatePending:
		// Being created ("acquired"), or restarted in place after its
		// container exited ("container exited with code 137; restarting").
		return e(http.StatusConflict, errdefs.ErrUnavailable,
			"lease %s is PENDING (%s): its sandbox is being started; retry shortly", id, rt.Reason)
	case lease.StateReleasing:
		return e(http.StatusConflict, errdefs.ErrFailedPrecondition, "lease %s is RELEASING: %s", id, rt.Reason)
	case lease.StateReleased, lease.StateExpired, lease.StateFailed:
		return e(http.StatusGone, errdefs.ErrFailedPrecondition, "lease %s is %s: %s", id, rt.State, rt.Reason)
	}
	return e(http.StatusConflict, errdefs.ErrFailedPrecondition, "lease %s is %s", id, rt.State)
}

// StateHeader names the response header that carries the lease's state on
// 409 and 410 answers.
const StateHeader = "X-Berth-Lease-State"

// fail writes e: JSON on agent API routes, plain text on previews.
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, preview bool, id string, e *routeError) {
	// Clients that send a whole upload before reading (Python's urllib)
	// must read this answer, not a reset; but a caller that may not be
	// authenticated must not make the proxy read a large body: at most
	// edge.PreAuthDrainLimit is drained, and a longer body closes the
	// connection after the answer.
	edge.DrainBodyUpTo(w, r, false, edge.PreAuthDrainLimit)
	p.metrics.http(e.status)
	h := w.Header()
	if e.status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="berth"`)
	}
	if e.state != "" {
		h.Set(StateHeader, string(e.state))
	}
	if e.state == lease.StatePending {
		h.Set("Retry-After", "1")
	}
	if e.status >= 500 {
		p.log.Warn("proxy error", "lease_id", id, "method", r.Method, "path", r.URL.Path, "status", e.status, "error", e.Error())
	}
	if preview {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(e.status)
		_, _ = fmt.Fprintln(w, e.Error())
		return
	}
	edge.WriteErrorStatus(w, e.status, e.err)
}

// logOperator records an operator's access to a lease.
func (p *Proxy) logOperator(id string, o origin) {
	p.metrics.operatorAccess.Add(1)
	p.log.Info("operator access to sandbox", "lease_id", id, "kind", o.kind, "method", o.method, "path", o.path, "remote_addr", o.remote)
}
