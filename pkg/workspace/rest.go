package workspace

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/hashicorp/go-retryablehttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// maxJSONResponse bounds a JSON response body read into memory.
const maxJSONResponse = 64 << 20

// restClient sends requests to a REST API (the agent's, possibly through
// the proxy, or the orchestrator's lease API): bearer token, error bodies
// mapped to errdefs categories, and retries of idempotent calls only.
type restClient struct {
	// life ends when the client is closed; it cancels requests in flight.
	life   context.Context
	stop   context.CancelFunc
	base   string // scheme://host[/escaped prefix], no trailing slash
	token  string
	plain  *http.Client
	retry  *retryablehttp.Client
	log    *slog.Logger
	jsonIn protojson.UnmarshalOptions
}

type restOptions struct {
	target     string
	prefix     string // escaped path added after the target's own prefix
	token      string
	tlsConfig  *tls.Config
	httpClient *http.Client
	retryMax   int
	waitMin    time.Duration
	waitMax    time.Duration
	log        *slog.Logger
}

func newRESTClient(o restOptions) (*restClient, error) {
	u, err := parseTarget(o.target)
	if err != nil {
		return nil, err
	}
	hc := o.httpClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 16
		if o.tlsConfig != nil {
			tr.TLSClientConfig = o.tlsConfig
		}
		hc = &http.Client{Transport: tr}
	}
	life, stop := context.WithCancel(context.Background())
	c := &restClient{
		life:   life,
		stop:   stop,
		base:   u.Scheme + "://" + u.Host + u.EscapedPath() + o.prefix,
		token:  o.token,
		plain:  hc,
		log:    o.log,
		jsonIn: protojson.UnmarshalOptions{DiscardUnknown: true},
	}
	c.retry = &retryablehttp.Client{
		HTTPClient:   hc,
		Logger:       retryLogger{o.log},
		RetryWaitMin: o.waitMin,
		RetryWaitMax: o.waitMax,
		RetryMax:     max(o.retryMax, 0),
		CheckRetry:   retryPolicy,
		Backoff:      retryablehttp.DefaultBackoff,
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
	}
	return c, nil
}

// retryPolicy is the CheckRetry of idempotent requests (the others never
// go through the retrying client): retry on connection errors and on 502,
// 503 and 504, never once ctx is done, never on anything else.
func retryPolicy(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		return isConnError(err), nil
	}
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true, nil
	}
	return false, nil
}

// isConnError reports whether err is a failure to reach the server or a
// connection that broke before the response: worth another try for an
// idempotent request. An upload source's own error is not.
func isConnError(err error) bool {
	var se *sourceReadError
	if errors.As(err, &se) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var op *net.OpError
	return errors.As(err, &op) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE)
}

// retryLogger adapts slog to retryablehttp: a failed attempt is a warning
// (the call may still succeed), the rest is debug.
type retryLogger struct{ l *slog.Logger }

func (r retryLogger) Error(msg string, kv ...any) { r.l.Warn("rest: "+msg, kv...) }
func (r retryLogger) Info(msg string, kv ...any)  { r.l.Debug("rest: "+msg, kv...) }
func (r retryLogger) Debug(msg string, kv ...any) { r.l.Debug("rest: "+msg, kv...) }
func (r retryLogger) Warn(msg string, kv ...any)  { r.l.Warn("rest: "+msg, kv...) }

// request is one REST call.
type request struct {
	method string
	route  string // escaped path after the base, e.g. "/v1/fs:stat"
	query  url.Values
	// body is sent as is and never replayed (retry must be false), unless
	// replay is set.
	body        io.Reader
	replay      *replayBody
	contentType string
	// retry marks the call idempotent: it goes through the retrying client.
	retry bool
}

// close cancels the requests in flight and closes idle connections.
func (c *restClient) close() {
	c.stop()
	c.plain.CloseIdleConnections()
}

// lifeBody releases a request's tie to the client's lifetime when the
// response body is closed.
type lifeBody struct {
	io.ReadCloser
	release func()
}

func (b *lifeBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// do sends req and returns a 2xx response (the caller closes its body);
// any other status is returned as an error with its errdefs category. The
// request is cancelled if the client is closed before its body is.
func (c *restClient) do(parent context.Context, req request) (resp *http.Response, err error) {
	ctx, cancel := context.WithCancel(parent)
	unhook := context.AfterFunc(c.life, cancel)
	release := func() { unhook(); cancel() }
	defer func() {
		if err != nil {
			release()
		} else {
			resp.Body = &lifeBody{ReadCloser: resp.Body, release: release}
		}
	}()
	u := c.base + req.route
	if len(req.query) > 0 {
		u += "?" + req.query.Encode()
	}
	if req.retry {
		var body any
		switch {
		case req.replay != nil:
			body = retryablehttp.ReaderFunc(req.replay.open)
		case req.body != nil:
			return nil, fmt.Errorf("%w: a retried request needs a replayable body", errdefs.ErrInternal)
		}
		rr, rerr := retryablehttp.NewRequestWithContext(ctx, req.method, u, body)
		if rerr != nil {
			return nil, c.transportErr(ctx, req, rerr)
		}
		c.header(rr.Header, req)
		resp, err = c.retry.Do(rr)
	} else {
		hr, herr := http.NewRequestWithContext(ctx, req.method, u, req.body)
		if herr != nil {
			return nil, c.transportErr(ctx, req, herr)
		}
		c.header(hr.Header, req)
		resp, err = c.plain.Do(hr)
	}
	if err != nil {
		if resp != nil {
			resp.Body.Close()
		}
		return nil, c.transportErr(ctx, req, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, httpError(resp)
	}
	return resp, nil
}

func (c *restClient) header(h http.Header, req request) {
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	if req.contentType != "" {
		h.Set("Content-Type", req.contentType)
	}
	h.Set("Accept", "application/json")
}

// transportErr classifies an error that got no HTTP answer: the caller's
// context, an upload source's error (both returned as they are), or an
// unreachable server (ErrUnavailable).
func (c *restClient) transportErr(ctx context.Context, req request, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s %s: %w", req.method, req.route, ctxErr)
	}
	var se *sourceReadError
	if errors.As(err, &se) {
		return se
	}
	return fmt.Errorf("%w: %s %s: %w", errdefs.ErrUnavailable, req.method, req.route, err)
}

// errorBody is the JSON error of grpc-gateway and the agent's raw routes,
// flat or, from a stream, wrapped in "error".
type errorBody struct {
	Code    *int       `json:"code"`
	Message string     `json:"message"`
	Error   *errorBody `json:"error"`
}

// httpError turns a non-2xx response into an error with the category of
// its JSON body's gRPC code or, without one, of its HTTP status.
func httpError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb errorBody
	code, msg := codeFromHTTP(resp.StatusCode), strings.TrimSpace(string(raw))
	if json.Unmarshal(raw, &eb) == nil {
		if eb.Error != nil {
			eb = *eb.Error
		}
		if eb.Code != nil && codes.Code(*eb.Code) != codes.OK {
			code = codes.Code(*eb.Code)
		}
		if eb.Message != "" {
			msg = eb.Message
		}
	}
	if msg == "" {
		msg = resp.Status
	}
	return errgrpc.FromGRPC(status.Error(code, msg))
}

// codeFromHTTP maps an HTTP status without a JSON code to a gRPC code. The
// proxy's 409 and 410 (lease not ready, lease gone) are preconditions; its
// 502 and 504 (agent unreachable, upstream timeout) are unavailability; its
// 507 (an upload over the lease's disk limit) is resource exhaustion.
func codeFromHTTP(s int) codes.Code {
	switch s {
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusConflict, http.StatusGone, http.StatusPreconditionFailed:
		return codes.FailedPrecondition
	case http.StatusTooManyRequests, http.StatusInsufficientStorage:
		return codes.ResourceExhausted
	case 499:
		return codes.Canceled
	case http.StatusNotImplemented:
		return codes.Unimplemented
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codes.Unavailable
	case http.StatusInternalServerError:
		return codes.Internal
	}
	return codes.Unknown
}

// getJSON GETs route (retried) and decodes the response into out.
func (c *restClient) getJSON(ctx context.Context, route string, q url.Values, out proto.Message) error {
	return c.callJSON(ctx, request{method: http.MethodGet, route: route, query: q, retry: true}, nil, out)
}

// callJSON sends in (if any) as JSON with req and decodes the answer into
// out (if any).
func (c *restClient) callJSON(ctx context.Context, req request, in, out proto.Message) error {
	if in != nil {
		b, err := protojson.Marshal(in)
		if err != nil {
			return fmt.Errorf("%w: encode request: %v", errdefs.ErrInternal, err)
		}
		req.contentType = "application/json"
		if req.retry {
			req.replay = newReplayBody(bytes.NewReader(b))
		} else {
			req.body = bytes.NewReader(b)
		}
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONResponse))
	if err != nil {
		return c.transportErr(ctx, req, err)
	}
	if out == nil {
		return nil
	}
	if err := c.jsonIn.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%w: %s %s: decode response: %v", errdefs.ErrInternal, req.method, req.route, err)
	}
	return nil
}

// sourceReadError is the error of an upload's source, carried through the
// HTTP transport so that it is neither retried nor taken for a network
// failure.
type sourceReadError struct{ err error }

func (e *sourceReadError) Error() string { return "reading the upload source: " + e.err.Error() }
func (e *sourceReadError) Unwrap() error { return e.err }

// onceBody reads a non-replayable upload source, marking its errors.
type onceBody struct{ r io.Reader }

func (b onceBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, &sourceReadError{err}
	}
	return n, err
}

// replayBody makes an io.ReadSeeker sendable more than once: every open
// seeks back to where the reader stood at first and returns a reader of
// that attempt. A previous attempt's reader, which the HTTP transport may
// still be draining in the background, is cut off (it fails), so two
// attempts never read the source at once.
type replayBody struct {
	mu    sync.Mutex
	rs    io.ReadSeeker
	start int64
	size  int64 // bytes from start to the end
	gen   int
	err   error // a seek failure
}

// errSuperseded ends a previous attempt's reads once a new attempt opened
// the body.
var errSuperseded = errors.New("upload body superseded by a retry")

func newReplayBody(rs io.ReadSeeker) *replayBody {
	b := &replayBody{rs: rs}
	start, err := rs.Seek(0, io.SeekCurrent)
	if err == nil {
		var end int64
		if end, err = rs.Seek(0, io.SeekEnd); err == nil {
			b.start, b.size = start, max(end-start, 0)
			_, err = rs.Seek(start, io.SeekStart)
		}
	}
	b.err = err
	return b
}

// replayable creates a replayBody if src can be sent again.
func replayable(src io.Reader) (*replayBody, bool) {
	rs, ok := src.(io.ReadSeeker)
	if !ok {
		return nil, false
	}
	b := newReplayBody(rs)
	if b.err != nil {
		return nil, false // not really seekable (a pipe behind *os.File)
	}
	return b, true
}

func (b *replayBody) open() (io.Reader, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return nil, &sourceReadError{b.err}
	}
	b.gen++
	if _, err := b.rs.Seek(b.start, io.SeekStart); err != nil {
		return nil, &sourceReadError{err}
	}
	return &replayReader{b: b, gen: b.gen, left: b.size}, nil
}

type replayReader struct {
	b    *replayBody
	gen  int
	left int64
}

// Len lets retryablehttp send a Content-Length.
func (r *replayReader) Len() int { return int(r.left) }

func (r *replayReader) Read(p []byte) (int, error) {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if r.gen != r.b.gen {
		return 0, errSuperseded
	}
	if r.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.b.rs.Read(p)
	r.left -= int64(n)
	switch {
	case errors.Is(err, io.EOF) && r.left > 0:
		return n, &sourceReadError{fmt.Errorf("the source shrank by %d bytes while uploading: %w", r.left, io.ErrUnexpectedEOF)}
	case err != nil && !errors.Is(err, io.EOF):
		return n, &sourceReadError{err}
	}
	return n, err
}
