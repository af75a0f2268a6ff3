// Package orchestrator is the berth daemon's edge: it opens the data
// directory (lease store, server secret, instance id), starts the lease
// manager over a container runtime, and serves the lease API over gRPC and
// REST (grpc-gateway) on one listener, with bearer-token authentication
// (operator, client and lease tokens), health and Prometheus metrics.
package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/orchestrator/ohruntime"
	"github.com/berth-dev/berth/pkg/proxy"
	"github.com/berth-dev/berth/pkg/streamlimit"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	gwruntime "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Server is a running orchestrator: lease manager plus API edge.
type Server struct {
	cfg     Config
	log     *slog.Logger
	store   leaseStore
	manager *lease.Manager
	auth    *authenticator
	// egress enforces network policies; nil when it does not (network.go).
	egress *egress.Enforcer
	// egressMetrics are the enforcer's figures (zero without one).
	egressMetrics *egress.Metrics
	// operator is the operator token, given to the authenticator and the
	// proxy alike.
	operator bearer.Secret
	grpc     *grpc.Server
	health   *health.Server
	inproc   *edge.InProc
	direct   *edge.Direct // the unary calls of the gateway and the compatibility APIs
	handler  http.Handler
	// e2b is the E2B listener's handler (e2b.go).
	e2b    http.Handler
	cancel context.CancelFunc
	proxy  *proxy.Proxy
	// streams bounds each caller's concurrent long-lived streams (lease
	// watches, log follows, and the proxy's terminal attaches and file
	// watches): Config.MaxWatchesPerPrincipal.
	streams *streamlimit.Limiter
	// usage samples the sandboxes' live figures (usage.go).
	usage *usageTracker
	// logs reads leases' logs (logs.go).
	logs *logSource
	// own are the gRPC services this server implements; calls to any
	// other service are agent calls for the proxy.
	own map[string]bool
}

// loadSecret returns the secret that signs lease tokens: the one the
// cluster's replicas share, else the data directory's file (made on first
// start).
func loadSecret(ctx context.Context, cfg Config, c Cluster) ([]byte, error) {
	if c != nil {
		return c.SharedSecret(ctx, lease.MinSecretLen)
	}
	return lease.LoadOrCreateSecret(filepath.Join(cfg.DataDir, lease.SecretFileName))
}

// electorOf returns lease.FleetConfig.Elect for c, nil without a cluster (one
// orchestrator per host: its reaper always runs).
func electorOf(c Cluster, identity string) func(context.Context, func(context.Context)) error {
	if c == nil {
		return nil
	}
	return func(ctx context.Context, lead func(context.Context)) error { return c.RunLeader(ctx, identity, lead) }
}

// instanceFile holds the orchestrator's instance id in the data directory.
const instanceFile = "instance-id"

// New opens the data directory, starts the lease manager on p's runtime
// (reconciling it with the containers the runtime finds) and builds the
// API. Close releases what New opened; sandboxes keep running and are
// adopted by the next start.
func New(ctx context.Context, cfg Config, p Platform, log *slog.Logger) (*Server, error) {
	rt := p.Runtime
	if rt == nil {
		return nil, errors.New("orchestrator: no runtime")
	}
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("orchestrator: data dir: %w", err)
	}
	secret, err := loadSecret(ctx, cfg, p.Cluster)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: secret: %w", err)
	}
	instance, err := instanceID(cfg) // store.go
	if err != nil {
		return nil, fmt.Errorf("orchestrator: instance id: %w", err)
	}
	store, err := openStore(ctx, cfg, p.Cluster, instance, log)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: lease store: %w", err)
	}
	egMet := egress.NewMetrics()
	eg, err := newEgress(cfg, instance, egMet, log.With("component", "egress")) // network.go
	if err != nil {
		store.Close()
		return nil, err
	}
	m, err := lease.New(lease.Config{
		Store: store, Runtime: rt, InstanceID: instance, Secret: secret,
		Network:      cfg.leaseNetwork(leaseEgress(eg)), // network.go
		AppPort:      cfg.OpenHandsAppPort,
		DefaultImage: cfg.DefaultImage, DefaultTTL: time.Duration(cfg.DefaultTTL), MaxTTL: time.Duration(cfg.MaxTTL),
		DefaultIdleTimeout: time.Duration(cfg.DefaultIdleTimeout),
		Admission:          cfg.leaseAdmission(), // config.go
		Disk:               cfg.Disk,
		Retention:          time.Duration(cfg.Retention),
		Pause:              cfg.Pause,
		Restart:            leaseRestart(cfg.Restart),            // config.go
		Volumes:            leaseVolumes(cfg),                    // volumes.go
		Pools:              cfg.leasePools(newAgentConfigurer()), // config.go, agentconfig.go, docs/pools.md
		Snapshots:          cfg.Snapshots,                        // snapshots.go
		Fleet:              lease.FleetConfig{Elect: electorOf(p.Cluster, instance)},
		Logger:             log.With("component", "lease"),
	})
	if err != nil {
		closeEgress(eg)
		store.Close()
		return nil, fmt.Errorf("orchestrator: lease manager: %w", err)
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if err := m.Start(mctx); err != nil {
		cancel()
		closeEgress(eg)
		store.Close()
		return nil, fmt.Errorf("orchestrator: start lease manager: %w", err)
	}
	// The operator token is read once: the authenticator and the proxy
	// share this one Secret.
	operator := bearer.NewSecret(cfg.OperatorToken)
	s := &Server{cfg: cfg, log: log, store: store, manager: m, cancel: cancel, operator: operator, egress: eg, egressMetrics: egMet,
		auth: newAuthenticator(operator, cfg.Clients, m.Tokens())}
	s.usage = newUsageTracker(rt, m, cfg, log.With("component", "usage"))
	s.logs = newLogSource(m, rt)
	if err := s.buildAPI(); err != nil {
		s.Close()
		return nil, err
	}
	s.usage.start(mctx)
	log.Info("orchestrator ready", "instance_id", instance, "data_dir", cfg.DataDir, "max_leases", cfg.Admission.MaxLive,
		"operator_token", cfg.OperatorToken != "", "clients", len(cfg.Clients))
	return s, nil
}

// Manager returns the lease manager (for the proxy and tests).
func (s *Server) Manager() *lease.Manager { return s.manager }

// Handler returns the HTTP handler (REST, health, metrics).
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) buildAPI() error {
	rec := edge.Recoverer{Log: s.log}
	s.streams = streamlimit.New(s.cfg.MaxWatchesPerPrincipal)
	px, err := proxy.New(proxy.Config{
		Leases: s.manager, Tokens: s.manager.Tokens(), Operator: s.operator, Domain: s.cfg.PreviewDomain,
		Streams: s.streams, // shared with the lease service's watches and log follows
		Logger:  s.log.With("component", "proxy"),
	})
	if err != nil {
		return fmt.Errorf("orchestrator: proxy: %w", err)
	}
	s.proxy = px
	met := newMetrics(s.manager, px, s.cfg.Runtime) // metrics.go
	met.reg.MustRegister(s.usage)                   // usage.go
	met.reg.MustRegister(s.egressMetrics)           // internal/egress/metrics.go
	opts := append(edge.GRPCOptions(edge.DefaultMaxStreams, time.Duration(s.cfg.IdleTimeout)),
		// Authenticate from the headers, before a request message is read:
		// an unauthenticated caller cannot make the server read megabytes.
		grpc.InTapHandle(s.tap),
	)
	s.grpc = grpc.NewServer(append(opts,
		// statusUnary/statusStream are the one place the errors of the
		// calls below become gRPC statuses.
		grpc.ChainUnaryInterceptor(rec.Unary, statusUnary, s.authUnary, met.unary),
		// The proxy's interceptor goes first: it sends reflection calls
		// that name a lease to that lease's agent.
		grpc.ChainStreamInterceptor(rec.Stream, statusStream, px.StreamInterceptor(), s.authStream),
		// Agent RPCs (unknown services here) are forwarded as raw frames.
		grpc.UnknownServiceHandler(px.GRPCHandler()),
		grpc.ForceServerCodecV2(px.Codec()),
	)...)
	inproc, err := edge.NewInProc()
	if err != nil {
		return err
	}
	s.inproc = inproc
	// The gateway, E2B's and OpenHands' APIs call the unary methods in
	// this process, through the same interceptors (edge.Direct).
	s.direct = edge.NewDirect(inproc.Conn, rec.Unary, statusUnary, s.authUnary, met.unary)
	vols := &volumeServer{vols: s.manager.Volumes()} // volumes.go
	leases := &leaseServer{m: s.manager, streams: s.streams, usage: s.usage, logs: s.logs}
	for _, reg := range []grpc.ServiceRegistrar{s.grpc, s.direct} {
		orchv1.RegisterVolumeServiceServer(reg, vols)
		orchv1.RegisterLeaseServiceServer(reg, leases)
	}
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.own = map[string]bool{}
	for name := range s.grpc.GetServiceInfo() {
		s.own[name] = true
	}

	gw := edge.GatewayMux(gwruntime.WithErrorHandler(retryAfterErrorHandler))
	if err := orchv1.RegisterLeaseServiceHandlerClient(context.Background(), gw, orchv1.NewLeaseServiceClient(s.direct)); err != nil {
		return fmt.Errorf("orchestrator: gateway: %w", err)
	}
	if err := orchv1.RegisterVolumeServiceHandlerClient(context.Background(), gw, orchv1.NewVolumeServiceClient(s.direct)); err != nil {
		return fmt.Errorf("orchestrator: gateway: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"SERVING"}` + "\n"))
	})
	mux.Handle("GET /metrics", met.handler())
	// openapi.go; public API description, like /healthz.
	mux.HandleFunc("GET /openapi.json", serveOpenAPI)
	mux.Handle(proxy.RoutePrefix, px) // not under MaxBytesHandler: bodies stream
	// Signed URLs carry their own credential (proxy/signed.go).
	mux.Handle(proxy.SignedPrefix, px)
	// openhands_runtime.go: OpenHands' runtime API over the lease service.
	mux.Handle(ohruntime.Prefix, http.MaxBytesHandler(s.openHandsRuntime(), 1<<20))
	api := s.authHTTP(http.MaxBytesHandler(gw, 4<<20))
	// dashboard.go: the web dashboard at /ui, over api and the proxy.
	if err := s.mountDashboard(mux, api, px); err != nil {
		return err
	}
	mux.Handle("/", api)
	s.handler = rec.HTTP(px.HostRouter(mux))
	s.e2b = rec.HTTP(s.e2bHandler())
	return nil
}

// Serve serves the API on ln until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.log.Info("orchestrator serving", "addr", ln.Addr().String())
	go func() {
		<-ctx.Done()
		s.health.Shutdown()
	}()
	srv := &edge.Server{GRPC: s.grpc, HTTP: s.handler, InProc: s.inproc, Logger: s.log, ShutdownGrace: 10 * time.Second,
		MaxConns: s.cfg.MaxConnections, ReadHeaderTimeout: time.Duration(s.cfg.ReadHeaderTimeout), IdleTimeout: time.Duration(s.cfg.IdleTimeout)}
	if err := srv.Serve(ctx, ln); err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	return nil
}

// Close stops the lease manager and closes the store. Sandboxes are left
// running; the next start adopts them.
func (s *Server) Close() error {
	if s.proxy != nil {
		_ = s.proxy.Close()
	}
	s.cancel()
	err := s.manager.Close()
	closeEgress(s.egress)
	return errors.Join(err, s.store.Close())
}

// open methods need no token.
func open(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.Health/")
}

// proxied reports whether method belongs to a service this server does not
// implement: an agent RPC that the proxy authenticates and forwards.
func (s *Server) proxied(method string) bool {
	svc, _, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	return ok && !s.own[svc]
}

func (s *Server) authenticate(ctx context.Context, method string) (context.Context, error) {
	if open(method) || s.proxied(method) {
		return ctx, nil
	}
	p, err := s.auth.fromContext(ctx)
	if err != nil {
		return nil, errUnauthenticated
	}
	if strings.HasPrefix(method, "/grpc.reflection.") && p.Role == RoleLease {
		return nil, errDenied
	}
	return withPrincipal(ctx, p), nil
}

// errUnauthenticated is the answer to a call without a valid token.
var errUnauthenticated = errdefs.Newf(errdefs.ErrUnauthenticated, "missing or invalid bearer token (send 'Authorization: Bearer TOKEN': the operator token, a client token, or a lease token)")

// tap refuses, from the headers alone, every call but health that carries
// no valid token (bearer authorization, or the proxy's x-berth-token), so
// the request message of an unauthenticated call is never read. The
// interceptors then authorize the call itself (and the proxy the lease).
func (s *Server) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if open(info.FullMethodName) {
		return ctx, nil
	}
	for tok := range bearer.FromMD(info.Header) {
		if _, err := s.auth.fromToken(tok); err == nil {
			return ctx, nil
		}
	}
	for _, v := range info.Header.Get(proxy.TokenMetadata) {
		if _, err := s.auth.fromToken(strings.TrimSpace(v)); err == nil {
			return ctx, nil
		}
	}
	// A tap answers before the interceptors: it makes its status itself.
	return ctx, errgrpc.ToGRPC(errUnauthenticated)
}

// authHTTP refuses REST calls without a valid bearer token before their
// body is read (the gateway would read it whole first). What is left of a
// small body is drained so that clients which write the whole body before
// reading see the 401.
func (s *Server) authHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.auth.fromHeader(r.Header.Get(bearer.Header)); err == nil {
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength >= 0 && r.ContentLength <= 64<<10 {
			edge.DrainBody(w, r, false)
		} else {
			w.Header().Set("Connection", "close")
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="berth"`)
		edge.WriteError(w, errUnauthenticated)
	})
}

func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := s.authenticate(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := s.authenticate(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return h(srv, &ctxStream{ServerStream: ss, ctx: ctx})
}

// statusUnary converts the error of a unary call to its gRPC status
// (grpcErr): the handlers and interceptors below return errdefs categories.
func statusUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, grpcErr(err)
}

// statusStream is statusUnary for streams; statuses (the proxy's, an
// agent's) pass through unchanged.
func statusStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return grpcErr(h(srv, ss))
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }

// retryAfterErrorHandler adds a Retry-After header to 429s that carry a
// RetryInfo detail, then writes the error as grpc-gateway does.
func retryAfterErrorHandler(ctx context.Context, mux *gwruntime.ServeMux, m gwruntime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if st, ok := status.FromError(err); ok && st.Code() == codes.ResourceExhausted {
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				secs := int(ri.GetRetryDelay().AsDuration().Round(time.Second) / time.Second)
				w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
			}
		}
	}
	gwruntime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

func loadOrCreateInstanceID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if id != "" {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	id := "i-" + hex.EncodeToString(r[:])
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return "", err
	}
	return id, os.Rename(tmp, path)
}
