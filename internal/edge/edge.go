// Package edge is the serving edge shared by the agent and the
// orchestrator: one listener that carries native gRPC (HTTP/2 prior
// knowledge) and HTTP/1.1 (REST through grpc-gateway, plain handlers), a
// gateway that reaches the gRPC server in-process, and JSON errors shaped
// like grpc-gateway's.
package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/listenmux"
	"github.com/berth-dev/berth/internal/memlisten"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// MaxMessage bounds one gRPC message on the in-process gateway connection.
const MaxMessage = 24 << 20

// GatewayMux returns a grpc-gateway mux with berth's JSON conventions: zero
// values are emitted (so "exitCode": 0 is present), field names are
// lowerCamelCase, and unknown request fields are rejected.
func GatewayMux(opts ...runtime.ServeMuxOption) *runtime.ServeMux {
	m := namingJSONPb{&runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}}
	base := []runtime.ServeMuxOption{
		runtime.WithMarshalerOption(runtime.MIMEWildcard, m),
		runtime.WithRoutingErrorHandler(routingError),
	}
	return runtime.NewServeMux(append(base, opts...)...)
}

// routingError answers a request that matches no route. grpc-gateway's
// default maps a known path with the wrong method to UNIMPLEMENTED, which
// is HTTP 501 (a server error); a wrong method is the caller's error, so it
// is answered 405 Method Not Allowed. Everything else keeps the default.
// The body keeps grpc-gateway's UNIMPLEMENTED code, which no errdefs
// category stands for: the status is made here, at the transport edge.
func routingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	if httpStatus == http.StatusMethodNotAllowed {
		WriteJSONErrorStatus(w, http.StatusMethodNotAllowed,
			status.Newf(codes.Unimplemented, "method %s not allowed on %s", r.Method, r.URL.Path))
		return
	}
	runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, httpStatus)
}

// WriteJSONError writes st the way grpc-gateway does: the HTTP status that
// matches the gRPC code and a body {"code": N, "message": "…", "details": []}.
func WriteJSONError(w http.ResponseWriter, st *status.Status) {
	WriteJSONErrorStatus(w, runtime.HTTPStatusFromCode(st.Code()), st)
}

// WriteJSONErrorStatus is WriteJSONError with an explicit HTTP status (for
// the proxy's 499/502/504, which have no exact gRPC code).
func WriteJSONErrorStatus(w http.ResponseWriter, httpStatus int, st *status.Status) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"code":    int(st.Code()),
		"message": st.Message(),
		"details": []any{},
	})
}

// WriteError writes err as WriteJSONError does, converting it to a status
// first (errgrpc: its category's code, its message as it is), so that HTTP
// edges answer berth's error categories exactly as the gRPC ones do.
func WriteError(w http.ResponseWriter, err error) {
	WriteJSONError(w, status.Convert(errgrpc.ToGRPC(err)))
}

// WriteErrorStatus is WriteError with an explicit HTTP status.
func WriteErrorStatus(w http.ResponseWriter, httpStatus int, err error) {
	WriteJSONErrorStatus(w, httpStatus, status.Convert(errgrpc.ToGRPC(err)))
}

// InProc is an in-process client connection to a gRPC server, over socket
// pairs, for the REST gateway: REST calls get exactly the gRPC semantics
// (interceptors, auth, limits, streaming).
type InProc struct {
	// Conn is the client connection.
	Conn *grpc.ClientConn
	ln   *memlisten.Listener
}

// NewInProc returns an in-process connection; Serve serves its listener.
func NewInProc() (*InProc, error) {
	ln := memlisten.New()
	conn, err := grpc.NewClient("passthrough:///inproc",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(ln.Dial),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessage), grpc.MaxCallSendMsgSize(MaxMessage)),
	)
	if err != nil {
		return nil, fmt.Errorf("edge: in-process client: %w", err)
	}
	return &InProc{Conn: conn, ln: ln}, nil
}

// Server serves one gRPC server and one HTTP handler on a listener.
type Server struct {
	// GRPC is the gRPC server; HTTP the handler for everything else.
	GRPC *grpc.Server
	HTTP http.Handler
	// InProc, when set, is served too (the gateway's connection).
	InProc *InProc
	// ShutdownGrace bounds graceful shutdown; default 10s.
	ShutdownGrace time.Duration
	// OnShutdown runs after the listeners are closed and calls drained (or
	// the grace ran out).
	OnShutdown func()
	// Logger receives serving errors.
	Logger *slog.Logger
	// MaxConns bounds the open connections of the listener (gRPC and HTTP
	// together); further ones wait in the kernel's accept queue until one
	// closes. Default DefaultMaxConns.
	MaxConns int
	// ReadHeaderTimeout bounds how long an HTTP client may take to send a
	// request's headers (a slow client cannot hold a connection). Default
	// DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes HTTP keep-alive connections idle this long.
	// Default DefaultIdleTimeout.
	IdleTimeout time.Duration
}

// Listener limit defaults shared by the agent and the orchestrator.
const (
	DefaultMaxConns          = 1024
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	// DefaultMaxStreams bounds the concurrent gRPC streams of one connection.
	DefaultMaxStreams = 256
)

// GRPCOptions are the limits every berth gRPC server sets: at most
// maxStreams concurrent streams per connection, messages up to MaxMessage,
// keepalive pings from clients at most every 10s (more often ends the
// connection), server pings after a minute of silence to find dead peers
// (20s to answer), and connections without calls closed after idle (0: never).
func GRPCOptions(maxStreams uint32, idle time.Duration) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(maxStreams),
		grpc.MaxRecvMsgSize(MaxMessage),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle, Time: time.Minute, Timeout: 20 * time.Second}),
	}
}

// Serve serves on ln until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	grace := s.ShutdownGrace
	if grace == 0 {
		grace = 10 * time.Second
	}
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	maxConns, rht, idle := s.MaxConns, s.ReadHeaderTimeout, s.IdleTimeout
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	if rht <= 0 {
		rht = DefaultReadHeaderTimeout
	}
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	m := listenmux.New(netutil.LimitListener(ln, maxConns))
	hs := &http.Server{Handler: s.HTTP, ReadHeaderTimeout: rht, IdleTimeout: idle, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	run("grpc", func() error { return s.GRPC.Serve(m.HTTP2()) })
	if s.InProc != nil {
		run("grpc-inproc", func() error { return s.GRPC.Serve(s.InProc.ln) })
	}
	run("http", func() error { return hs.Serve(m.HTTP1()) })
	run("listener", m.Serve)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = m.Close()
	done := make(chan struct{})
	go func() {
		s.GRPC.GracefulStop()
		close(done)
	}()
	_ = hs.Shutdown(sctx)
	select {
	case <-done:
	case <-sctx.Done():
		s.GRPC.Stop()
	}
	if s.OnShutdown != nil {
		s.OnShutdown()
	}
	if s.InProc != nil {
		_ = s.InProc.Conn.Close()
		_ = s.InProc.ln.Close()
	}
	wg.Wait()
	return err
}
