package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/errdefs"
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
)

func (a access) String() string {
	switch a {
	case accessLease:
		return "lease"
	case accessOperator:
		return "operator"
	case accessPublic:
		return "public"
	}
	return "none"
}

// routeError is a failure decided by the proxy itself (not the upstream).
type routeError struct {
	status int        // HTTP status
	code   codes.Code // gRPC code
	msg    string
	state  lease.State // set for 409 and 410
}

func (e *routeError) Error() string { return e.msg }

// grpcStatus returns e as a gRPC status error.
func (e *routeError) grpcErr() error { return status.Error(e.code, e.msg) }

func errNoRoute(msg string) *routeError {
	return &routeError{status: http.StatusNotFound, code: codes.NotFound, msg: msg}
}

func errUnauthenticated(msg string) *routeError {
	return &routeError{status: http.StatusUnauthorized, code: codes.Unauthenticated, msg: msg}
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

// bearer returns the token of an "Authorization: Bearer TOKEN" value.
func bearer(h string) (string, bool) {
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(h[len(prefix):]), true
}

// isOperator compares tok with the operator token in constant time.
func (p *Proxy) isOperator(tok string) bool {
	if !p.hasOperator {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], p.operatorSum[:]) == 1
}

// authorize checks the candidate tokens against lease id: the operator
// token or id's own lease token opens it; anything else is a 401 that says
// what was wrong. matched is the token that opened it.
func (p *Proxy) authorize(id string, ts *tokens) (acc access, matched string, err *routeError) {
	if ts.empty() {
		return accessNone, "", errUnauthenticated("missing token: send the lease token as 'Authorization: Bearer TOKEN'")
	}
	other := false
	ts.each(func(tok string) bool {
		if p.isOperator(tok) {
			acc, matched = accessOperator, tok
			return false
		}
		if lid, ok := p.leases.VerifyToken(tok); ok {
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
		return lease.Route{}, &routeError{status: http.StatusInternalServerError, code: codes.Internal, msg: "lease " + id + ": " + err.Error()}
	}
	return rt, nil
}

// usable checks that a lease can take traffic: READY with an endpoint.
func usable(id string, rt lease.Route) *routeError {
	switch rt.State {
	case lease.StateReady:
		if rt.Endpoint == "" {
			return &routeError{status: http.StatusBadGateway, code: codes.Unavailable, msg: "lease " + id + " has no agent endpoint"}
		}
		return nil
	case lease.StatePending:
		// Being created ("acquired"), or restarted in place after its
		// container exited ("container exited with code 137; restarting").
		return &routeError{status: http.StatusConflict, code: codes.Unavailable, state: rt.State,
			msg: fmt.Sprintf("lease %s is PENDING (%s): its sandbox is being started; retry shortly", id, rt.Reason)}
	case lease.StateReleasing:
		return &routeError{status: http.StatusConflict, code: codes.FailedPrecondition, state: rt.State,
			msg: fmt.Sprintf("lease %s is RELEASING: %s", id, rt.Reason)}
	case lease.StateReleased, lease.StateExpired, lease.StateFailed:
		return &routeError{status: http.StatusGone, code: codes.FailedPrecondition, state: rt.State,
			msg: fmt.Sprintf("lease %s is %s: %s", id, rt.State, rt.Reason)}
	}
	return &routeError{status: http.StatusConflict, code: codes.FailedPrecondition, state: rt.State,
		msg: fmt.Sprintf("lease %s is %s", id, rt.State)}
}

// StateHeader names the response header that carries the lease's state on
// 409 and 410 answers.
const StateHeader = "X-Berth-Lease-State"

// fail writes e: JSON on agent API routes, plain text on previews.
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, preview bool, id string, e *routeError) {
	// Clients that send a whole upload before reading (Python's urllib)
	// must read this answer, not a reset.
	edge.DrainBody(w, r, false)
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
		p.log.Warn("proxy error", "lease_id", id, "method", r.Method, "path", r.URL.Path, "status", e.status, "error", e.msg)
	}
	if preview {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(e.status)
		_, _ = fmt.Fprintln(w, e.msg)
		return
	}
	edge.WriteJSONErrorStatus(w, e.status, status.New(e.code, e.msg))
}

// logOperator records an operator's access to a lease.
func (p *Proxy) logOperator(id, kind, method, path, remote string) {
	p.metrics.operatorAccess.Add(1)
	p.log.Info("operator access to sandbox", "lease_id", id, "kind", kind, "method", method, "path", path, "remote_addr", remote)
}
