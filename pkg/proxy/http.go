package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"syscall"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// target is where one request goes; it travels in the request's context
// from ServeHTTP to rewrite and the error handler.
type target struct {
	leaseID    string
	host       string // upstream host:port
	path       string // upstream path, decoded
	rawPath    string // upstream path, as the client escaped it
	rawQuery   string
	preview    bool
	port       int         // preview port
	prefix     string      // path-form preview prefix, for X-Forwarded-Prefix
	agentToken string      // set on agent API routes
	stripAuth  bool        // the Authorization header carried a berth token
	status     int         // final status, for metrics
	upload     *budgetBody // an upload held to the lease's disk limit (disk.go)
	uploadMsg  string      // the 507's message should it pass the limit
	// hold is the lease's hold (auth.go, open), answered when the
	// upstream's response headers arrive or forwarding fails.
	hold *lease.Hold
	// disposition, when set, is the Content-Disposition of a successful
	// response (signed downloads, signed.go).
	disposition string
	// wsProtocols, when set, replaces the upgrade's subprotocols: those
	// offered without the tokens (websocket.go).
	wsProtocols *[]string
	// editHeader, when set, edits the upstream request's headers last
	// (ServePort, port.go).
	editHeader func(http.Header)
	// jsonErrors answers a preview's upstream failures as JSON (ServePort).
	jsonErrors bool
}

type targetKey struct{}

// errBadEscape answers a path whose percent-escapes do not decode.
func errBadEscape() *routeError {
	return newRouteError(http.StatusBadRequest, errdefs.ErrInvalidArgument, "bad path escape")
}

func targetFrom(ctx context.Context) *target {
	t, _ := ctx.Value(targetKey{}).(*target)
	return t
}

// serveAgent proxies a request to lease id's agent REST API; rawPath is the
// agent path, escaped.
func (p *Proxy) serveAgent(w http.ResponseWriter, r *http.Request, id, rawPath string) {
	var ts tokens
	ts.addAll(r.Header.Values(bearer.Header), r.Header.Values(TokenHeader))
	for _, v := range r.Header.Values(SessionKeyHeader) { // openhands.go
		ts.add(v)
	}
	if isOpenHealth(r, rawPath, &ts) {
		p.serveOpenHealth(w, r, id)
		return
	}
	wt, wsToken := protocolTokens(r)
	if wsToken {
		if rerr := checkOrigin(r); rerr != nil {
			p.fail(w, r, false, id, rerr)
			return
		}
		for _, tok := range wt.tokens {
			ts.add(tok)
		}
	}
	var op opened
	var rerr *routeError
	if !wsToken && isAppSocket(r, rawPath, &ts) {
		op, rerr = p.openAppSocket(id) // openhands.go
	} else {
		op, rerr = p.open(r.Context(), id, &ts, 0, origin{"http", r.Method, r.URL.Path, r.RemoteAddr})
	}
	if rerr != nil {
		p.fail(w, r, false, id, rerr)
		return
	}
	defer op.hold.Done()
	rt := op.rt
	path, err := url.PathUnescape(rawPath)
	if err != nil {
		p.fail(w, r, false, id, errBadEscape())
		return
	}
	if rerr := operatorOnly(path, op.acc); rerr != nil { // metrics.go
		p.fail(w, r, false, id, rerr)
		return
	}
	if rerr := orchestratorOnly(path); rerr != nil { // orchestratoronly.go
		p.fail(w, r, false, id, rerr)
		return
	}
	release, rerr := p.acquireStream(id, op.acc, path) // streams.go
	if rerr != nil {
		p.fail(w, r, false, id, rerr)
		return
	}
	defer release()
	t := &target{
		leaseID: id, host: rt.Endpoint, path: path, rawPath: rawPath, rawQuery: r.URL.RawQuery,
		agentToken: p.leaseTokens.AgentToken(id), stripAuth: true, hold: op.hold,
	}
	if wsToken {
		t.wsProtocols = &wt.rest
	}
	if !p.limitUpload(w, r, t, rt) {
		p.metrics.http(t.status)
		return
	}
	p.forward(w, r, t)
}

// maxBufferedBody is the largest request body read whole before it is
// forwarded (API calls); larger ones are streamed.
const maxBufferedBody = 1 << 20

// forward runs the reverse proxy for t, touching the lease while it runs
// and counting the outcome.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, t *target) {
	if r.ContentLength > 0 && r.ContentLength <= maxBufferedBody {
		// The upstream may answer, and its answer be flushed to the client,
		// before the transport has finished reading the request body (an
		// exec stream answers at once). net/http's HTTP/1 server then
		// discards and closes the unread body, the transport's last read
		// fails and it closes the upstream connection mid-response: the
		// client's stream is cut. Small bodies (API calls) are therefore
		// read whole first; large ones (file uploads) are streamed, and the
		// agent answers those only after reading them to the end.
		// (EnableFullDuplex is no cure: the transport may then still read
		// the body after the handler returned, racing the server's read of
		// the next request.)
		body, err := io.ReadAll(io.LimitReader(r.Body, r.ContentLength))
		if err == nil && int64(len(body)) < r.ContentLength {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			if r.Context().Err() != nil {
				t.status = StatusClientClosedRequest
				p.clientGone(r, t, "while sending the request body")
				p.metrics.http(t.status)
				w.WriteHeader(t.status)
				return
			}
			p.metrics.http(http.StatusBadRequest)
			edge.WriteErrorStatus(w, http.StatusBadRequest, errdefs.Newf(errdefs.ErrInvalidArgument, "reading the request body: %s", err.Error()))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	} else if r.Body != nil && r.Body != http.NoBody {
		r.Body = edge.EndedBody(r.Body)
	}
	stop := p.track(t.leaseID)
	p.metrics.inFlight.Add(1)
	defer func() {
		p.metrics.inFlight.Add(-1)
		stop()
		if v := recover(); v != nil {
			// The response was already under way when the copy failed: the
			// reverse proxy aborts the connection with ErrAbortHandler.
			if v == http.ErrAbortHandler && r.Context().Err() != nil {
				t.status = StatusClientClosedRequest
				p.clientGone(r, t, "while streaming the response")
			}
			p.metrics.http(t.status)
			panic(v)
		}
		p.metrics.http(t.status)
	}()
	ctx := context.WithValue(r.Context(), targetKey{}, t)
	if t.hold != nil && longStream(t.path) {
		// A terminal or a watch may stay silent as long as it likes: a
		// pause waits for it only until its request was sent (auth.go, admit).
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { t.hold.Answered() }})
	}
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// rewrite builds the upstream request.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	t := targetFrom(pr.In.Context())
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = t.host
	out.URL.Path = t.path
	out.URL.RawPath = t.rawPath
	out.URL.RawQuery = t.rawQuery
	out.Host = ""
	pr.SetXForwarded()
	h := out.Header
	if t.prefix != "" {
		h.Set("X-Forwarded-Prefix", t.prefix)
	}
	h.Del(TokenHeader)
	h.Del(SessionKeyHeader)
	tokenCookies(h, true)
	if t.stripAuth {
		h.Del("Authorization")
	}
	if t.wsProtocols != nil {
		forwardProtocols(h, *t.wsProtocols)
	}
	if t.agentToken != "" {
		h.Set("Authorization", "Bearer "+t.agentToken)
	}
	if t.editHeader != nil {
		t.editHeader(h)
	}
}

// modifyResponse records the upstream's status and confines a preview's
// answer (confine.go).
func (p *Proxy) modifyResponse(res *http.Response) error {
	if t := targetFrom(res.Request.Context()); t != nil {
		t.hold.Answered() // a pause may go on (a stream is under way)
		t.status = res.StatusCode
		confine(res.Header, t.onOrchestratorOrigin()) // confine.go
		if t.disposition != "" && res.StatusCode/100 == 2 && res.Header.Get("Content-Disposition") == "" {
			res.Header.Set("Content-Disposition", t.disposition)
		}
		if t.upload != nil {
			if t.upload.exceeded.Load() {
				return errDiskBudget // answered with 507 by the error handler
			}
			if res.StatusCode/100 == 2 {
				p.chargeDisk(t.leaseID, t.upload.n.Load())
			}
		}
	}
	return nil
}

// errorHandler maps a failed round trip to 499, 502 or 504.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	t := targetFrom(r.Context())
	if t == nil { // not reached: every request carries a target
		t = &target{}
	}
	t.hold.Answered()
	if t.upload != nil && t.upload.exceeded.Load() {
		p.refuseUpload(w, r, t, t.uploadMsg, true)
		return
	}
	st, msg, category := classify(r.Context(), err)
	t.status = st
	switch st {
	case StatusClientClosedRequest:
		p.clientGone(r, t, "before the response")
		w.WriteHeader(st)
		return
	case http.StatusBadGateway:
		if t.preview {
			msg = "nothing answers on port " + strconv.Itoa(t.port) + " of lease " + t.leaseID + ": " + msg
		} else {
			msg = "agent of lease " + t.leaseID + " unreachable: " + msg
		}
	case http.StatusGatewayTimeout:
		if t.preview {
			msg = "port " + strconv.Itoa(t.port) + " of lease " + t.leaseID + " timed out: " + msg
		} else {
			msg = "agent of lease " + t.leaseID + " timed out: " + msg
		}
	}
	p.log.Warn("proxy upstream error", "lease_id", t.leaseID, "method", r.Method, "path", r.URL.Path,
		"upstream", t.host, "status", st, "error", err.Error())
	if t.preview && !t.jsonErrors {
		confine(w.Header(), t.onOrchestratorOrigin())
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(st)
		_, _ = w.Write([]byte(msg + "\n"))
		return
	}
	edge.WriteErrorStatus(w, st, errdefs.Newf(category, "%s", msg))
}

// clientGone logs a client that went away; the upstream request was
// cancelled with it.
func (p *Proxy) clientGone(r *http.Request, t *target, when string) {
	p.log.Info("client went away", "lease_id", t.leaseID, "method", r.Method, "path", r.URL.Path,
		"status", StatusClientClosedRequest, "when", when)
}

// classify maps an upstream round-trip error to an HTTP status, a message
// and an error category (context.Canceled, context.DeadlineExceeded or
// errdefs.ErrUnavailable, which errgrpc maps to the JSON body's code): the
// client's context cancelled is 499; a deadline or a timeout (dial,
// response headers) is 504; anything else — refused, reset, no route, a
// broken response — is 502.
func classify(ctx context.Context, err error) (int, string, error) {
	if errors.Is(ctx.Err(), context.Canceled) {
		return StatusClientClosedRequest, "client went away", context.Canceled
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) {
		return http.StatusGatewayTimeout, "upstream timeout: " + err.Error(), context.DeadlineExceeded
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		msg := oe.Err.Error()
		if errors.Is(err, syscall.ECONNREFUSED) {
			msg = "connection refused"
		}
		if oe.Addr != nil {
			msg = oe.Addr.String() + ": " + msg
		}
		return http.StatusBadGateway, "dial " + msg, errdefs.ErrUnavailable
	}
	if errors.Is(err, context.Canceled) {
		// Cancelled without the client's context: the proxy is shutting down.
		return http.StatusBadGateway, "upstream request cancelled", errdefs.ErrUnavailable
	}
	return http.StatusBadGateway, err.Error(), errdefs.ErrUnavailable
}
