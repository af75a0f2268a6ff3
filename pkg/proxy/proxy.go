package proxy

import (
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/streamlimit"
)

// LeaseRouter is what the proxy needs from the lease manager;
// *lease.Manager implements it.
type LeaseRouter interface {
	// Route returns a lease's state and endpoint; an error wrapping
	// errdefs.ErrNotFound when there is no such lease.
	Route(id string) (lease.Route, error)
	// Touch records activity on a lease.
	Touch(id string)
}

var _ LeaseRouter = (*lease.Manager)(nil)

// LeaseTokens is what the proxy needs of the lease tokens;
// *lease.Tokens (lease.Manager.Tokens) implements it.
type LeaseTokens interface {
	// VerifyToken returns the lease a lease token belongs to.
	VerifyToken(token string) (leaseID string, ok bool)
	// AgentToken returns the bearer token of a lease's agent.
	AgentToken(id string) string
}

var _ LeaseTokens = (*lease.Tokens)(nil)

// Names of the places a caller's token may be carried.
const (
	// TokenHeader carries a lease (or operator) token, as an alternative to
	// "Authorization: Bearer TOKEN".
	TokenHeader = "X-Berth-Token"
	// TokenCookie carries a token on preview routes (set by the query
	// bootstrap).
	TokenCookie = "berth_token"
	// TokenQuery is the query parameter that bootstraps the preview cookie.
	TokenQuery = "berth_token"
	// LeaseMetadata is the gRPC metadata key naming the lease to call.
	LeaseMetadata = "x-berth-lease"
	// TokenMetadata is the gRPC metadata alternative to authorization.
	TokenMetadata = "x-berth-token"
	// StatusClientClosedRequest is the status recorded (and logged) when the
	// client went away before the response was complete (nginx's 499).
	StatusClientClosedRequest = 499
	// RoutePrefix is the URL path prefix of the path routes.
	RoutePrefix = "/v1/sandboxes/"
)

// Config configures a Proxy. Zero fields take the documented defaults.
type Config struct {
	// Leases resolves leases and endpoints. Required.
	Leases LeaseRouter
	// Tokens checks lease tokens and gives the agents' tokens; when it
	// also is a SignedVerifier, it checks signed URLs. Required.
	Tokens LeaseTokens
	// Operator is the operator token: it opens every lease's sandbox, and
	// each such access is logged. The orchestrator passes the Secret it
	// authenticates its own API with, so both check the same token. The
	// zero Secret (default) disables operator access through the proxy.
	Operator bearer.Secret
	// Domain is the suffix of preview hosts ({port}-{lease}.{Domain}) and
	// agent hosts ({lease}.{Domain}), e.g. "sandbox.localhost". Empty
	// disables routing by host. Default empty.
	Domain string
	// DialTimeout bounds connecting to an agent or preview port (HTTP and
	// gRPC); exceeding it is a 504. Default 5s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for an upstream's response
	// headers once the request is written (HTTP routes only); exceeding it
	// is a 504. Default 0: no limit. Note that POST /v1/exec answers only
	// when the command ends, so a limit here also bounds non-streamed execs.
	ResponseHeaderTimeout time.Duration
	// TouchInterval is how often an open request or stream touches its
	// lease. Default 10s.
	TouchInterval time.Duration
	// MaxIdleConnsPerHost bounds the idle keep-alive connections kept per
	// upstream. Default 32.
	MaxIdleConnsPerHost int
	// MaxMessageSize bounds one gRPC message received from an agent.
	// Default 24 MiB (the agent's own limit).
	MaxMessageSize int
	// ConnIdleTimeout closes a cached gRPC connection to an agent after it
	// carried no call for this long. Default 5m.
	ConnIdleTimeout time.Duration
	// Streams bounds each caller's concurrent terminal attaches and file
	// watches (gRPC and REST/WebSocket alike): a lease token is one
	// caller, the operator token another. The orchestrator passes the
	// limiter its lease watches and log follows count in, so every kind
	// of long-lived stream shares one limit. Nil (default): no limit.
	Streams *streamlimit.Limiter
	// Logger receives operator accesses, clients that went away and
	// upstream failures (keys lease_id, method, path, status). Default
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Leases == nil {
		return errors.New("proxy: Config.Leases is required")
	}
	if c.Tokens == nil {
		return errors.New("proxy: Config.Tokens is required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DialTimeout, 5*time.Second)
	def(&c.TouchInterval, 10*time.Second)
	def(&c.ConnIdleTimeout, 5*time.Minute)
	if c.ResponseHeaderTimeout < 0 {
		c.ResponseHeaderTimeout = 0
	}
	if c.MaxIdleConnsPerHost <= 0 {
		c.MaxIdleConnsPerHost = 32
	}
	if c.MaxMessageSize <= 0 {
		c.MaxMessageSize = edge.MaxMessage
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Domain = strings.Trim(strings.ToLower(c.Domain), ".")
	return nil
}

// Proxy routes clients to their leases' sandboxes. Create it with New; it
// is safe for concurrent use. Close releases its upstream connections.
type Proxy struct {
	cfg    Config
	log    *slog.Logger
	leases LeaseRouter
	// leaseTokens is Config.Tokens.
	leaseTokens LeaseTokens
	domain      string // "." + Config.Domain, or "" when host routing is off

	transport *http.Transport
	rp        *httputil.ReverseProxy
	pool      connPool
	metrics   metrics
}

// New returns a Proxy for cfg.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, leases: cfg.Leases, leaseTokens: cfg.Tokens}
	if cfg.Domain != "" {
		p.domain = "." + cfg.Domain
	}
	dialer := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	// One transport for every upstream: many small requests to many
	// backends. No proxy from the environment, no compression (bodies pass
	// through as they are), no HTTP/2 (agents and dev servers speak
	// HTTP/1.1 on their REST side; gRPC has its own connections). The
	// transport itself only re-sends a request that provably never left
	// (nothing written on a reused connection the server had closed), or an
	// idempotent one; nothing here wraps it with retries.
	p.transport = &http.Transport{
		Proxy:                  nil,
		DialContext:            dialer.DialContext,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:        90 * time.Second,
		ResponseHeaderTimeout:  cfg.ResponseHeaderTimeout,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 1 << 20,
		ReadBufferSize:         32 << 10,
		WriteBufferSize:        32 << 10,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:   p.rewrite,
		Transport: p.transport,
		// 0: a response of known length (a unary REST answer) goes out
		// in one write with its Content-Length, instead of a flush per
		// write and chunked framing; streams (no length: exec and log
		// streams, NDJSON, text/event-stream) are still flushed after
		// every write (ReverseProxy does that for them whatever this
		// says).
		FlushInterval:  0,
		BufferPool:     bufferPool{},
		ErrorHandler:   p.errorHandler,
		ModifyResponse: p.modifyResponse,
		ErrorLog:       log.New(debugWriter{p.log}, "", 0),
	}
	p.pool.init(p)
	p.metrics.init()
	return p, nil
}

// Close closes idle upstream HTTP connections and every cached gRPC
// connection; calls in flight on them fail. Call it after the servers that
// use the Proxy have stopped.
func (p *Proxy) Close() error {
	p.transport.CloseIdleConnections()
	return p.pool.closeAll()
}

// HostRouter returns a handler that serves requests whose Host is a preview
// host ({port}-{lease}.{Domain}) or an agent host ({lease}.{Domain}) with
// the Proxy and passes every other request to next. With an empty
// Config.Domain it returns next unchanged.
func (p *Proxy) HostRouter(next http.Handler) http.Handler {
	if p.domain == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := p.hostLabel(r.Host); ok {
			p.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// hostLabel returns the first label of host when host is under the
// configured domain (one label deep).
func (p *Proxy) hostLabel(host string) (string, bool) {
	if p.domain == "" || host == "" {
		return "", false
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(host, p.domain)
	if !ok || label == "" || strings.IndexByte(label, '.') >= 0 {
		return "", false
	}
	return label, true
}

// parseHostLabel splits a host label into a port (0 for the agent form
// {lease}) and a lease id.
func parseHostLabel(label string) (port int, id string, ok bool) {
	ps, rest, found := strings.Cut(label, "-")
	if !found {
		return 0, label, true
	}
	port, ok = parsePort(ps)
	return port, rest, ok
}

// parsePort parses a decimal TCP port, 1..65535, without signs or leading zeros.
func parsePort(s string) (int, bool) {
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, false
	}
	return n, true
}

// route proxies one HTTP request (ServeHTTP, metrics.go, times it): a
// host-form preview or agent request (see HostRouter), or a path route
// under /v1/sandboxes/. Anything else is a 404.
func (p *Proxy) route(w http.ResponseWriter, r *http.Request) {
	if label, ok := p.hostLabel(r.Host); ok {
		port, id, ok := parseHostLabel(label)
		if !ok {
			p.fail(w, r, true, "", errNoRoute("no such preview host "+r.Host))
			return
		}
		if port == 0 {
			p.serveAgent(w, r, id, r.URL.EscapedPath())
			return
		}
		p.servePreview(w, r, id, port, "", r.URL.EscapedPath())
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.EscapedPath(), SignedPrefix); ok {
		p.serveSigned(w, r, rest) // signed.go
		return
	}
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), RoutePrefix)
	if !ok {
		p.fail(w, r, false, "", errNoRoute("not a sandbox route: "+r.URL.Path))
		return
	}
	id, after, _ := strings.Cut(rest, "/")
	if pr, ok := strings.CutPrefix(after, "ports/"); ok {
		ps, tail, slash := strings.Cut(pr, "/")
		port, ok := parsePort(ps)
		if !ok {
			p.fail(w, r, false, "", errNoRoute("bad preview port "+strconv.Quote(ps)))
			return
		}
		prefix := RoutePrefix + id + "/ports/" + ps
		if !slash {
			p.redirectSlash(w, r, prefix)
			return
		}
		p.servePreview(w, r, id, port, prefix, "/"+tail)
		return
	}
	p.serveAgent(w, r, id, "/"+after)
}

// bufferPool recycles the copy buffers of the reverse proxy.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// debugWriter sends the reverse proxy's own log lines to the logger at
// debug level (errors the proxy reports are logged by the error handler).
type debugWriter struct{ log *slog.Logger }

func (d debugWriter) Write(b []byte) (int, error) {
	d.log.Debug("reverse proxy", "detail", strings.TrimSpace(string(b)))
	return len(b), nil
}

var _ io.Writer = debugWriter{}
