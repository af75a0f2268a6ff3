// Package agent wires the sandbox-agent's services into one server: gRPC
// (native HTTP/2 transport, h2c) and JSON/REST through grpc-gateway on the
// same port, bearer-token authentication, panic recovery, gRPC health and
// server reflection. The services themselves live in the process, files,
// git and terminal subpackages; this package is the edge (the terminal
// WebSocket, GET /v1/terminals/ws, included).
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/internal/version"
	"github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/agent/git"
	"github.com/berth-dev/berth/pkg/agent/openhands"
	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/agent/terminal"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// Config configures an agent server.
type Config struct {
	// Token is the bearer token every call but health must carry. Required
	// unless NoAuth is set.
	Token string
	// NoAuth disables authentication (local development only). Default false.
	NoAuth bool
	// WorkDir is the default working directory and repository. Default "/workspace".
	WorkDir string
	// MaxProcesses bounds concurrently running commands. Default 256.
	MaxProcesses int
	// ShutdownGrace bounds graceful shutdown. Default 10s.
	ShutdownGrace time.Duration
	// User is the default user commands run as and files created through
	// the agent belong to ("name", "uid", "name:group", "uid:gid", resolved
	// with /etc/passwd and /etc/group). ExecRequest.user picks another one
	// per command. Setting users other than the agent's own needs the agent
	// to run as root. Default "": the agent's own user (when the agent is
	// not root, ExecRequest.user is then refused).
	User string
	// DenyRoot refuses commands as uid 0 with PERMISSION_DENIED (and New
	// fails when User is root). Default false.
	DenyRoot bool
	// Logger receives the agent's logs. Default slog.Default().
	Logger *slog.Logger
	// Secrets (name → value) are masked as <secret:NAME> in every output
	// the agent returns: exec results, streams, background logs and
	// terminals (see package mask for what is and is not caught). The
	// commands get the values from the environment, not from here.
	Secrets map[string]string
	// StateFile keeps what ConfigService.Configure gave the agent (the
	// lease's env and secrets of a warm pool's sandbox; see configure.go),
	// root-only, and is read back at start so a restarted container keeps
	// them. Default "": kept in memory only.
	StateFile string
}

// maxGRPCMessage bounds one gRPC message (inline stdin is capped lower).
const maxGRPCMessage = edge.MaxMessage

// Server is a configured agent. Create it with New, run it with Serve.
type Server struct {
	cfg     Config
	log     *slog.Logger
	grpc    *grpc.Server
	health  *health.Server
	runner  *process.Runner
	terms   *terminal.Manager
	handler http.Handler
	inproc  *edge.InProc
}

// New builds a Server from cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Token == "" && !cfg.NoAuth {
		return nil, errors.New("agent: a token is required (set BERTH_AGENT_TOKEN or --token, or pass --no-auth for local development)")
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = "/workspace"
	}
	if cfg.MaxProcesses == 0 {
		cfg.MaxProcesses = 256
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger
	auth := newTokenChecker(cfg.Token)
	if cfg.NoAuth {
		auth = newTokenChecker("")
	}
	rec := edge.Recoverer{Log: log}
	mt := newMetrics() // metrics.go

	// Limits as on the orchestrator; more streams per connection because
	// the orchestrator's proxy multiplexes every client on one connection.
	gs := grpc.NewServer(append(edge.GRPCOptions(4*edge.DefaultMaxStreams, 0),
		grpc.InTapHandle(auth.tap),
		grpc.ChainUnaryInterceptor(rec.Unary, auth.unary, mt.unary),
		grpc.ChainStreamInterceptor(rec.Stream, auth.stream, mt.stream),
	)...)

	us, err := newUsers(cfg, log)
	if err != nil {
		return nil, err
	}
	conf, err := newConfigurer(cfg.StateFile, cfg.Secrets, log.With("component", "configure")) // configure.go
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	masker := conf.masker
	runner := process.NewRunner(process.Config{WorkDir: cfg.WorkDir, MaxProcesses: cfg.MaxProcesses, OOMScoreAdj: 500, Users: us, Masker: masker,
		Environ: conf.environ, Logger: log.With("component", "process")})
	fcfg := files.Config{Logger: log.With("component", "files")}
	if us != nil && !us.Default.Root() && os.Geteuid() == 0 {
		if cfg.DenyRoot {
			// Root is forbidden: the file API acts as the default user too.
			fcfg.AsUser = &files.Identity{UID: us.Default.UID, GID: us.Default.GID}
		} else {
			fcfg.Chown = us.Chown
		}
	}
	terms := terminal.New(terminal.Config{Commands: runner, OOMScoreAdj: 500, Masker: masker, Logger: log.With("component", "terminal")})
	mt.gauges(runner, terms)
	fsys := files.New(fcfg)
	g := git.New(git.Config{WorkDir: cfg.WorkDir, Logger: log.With("component", "git")})

	agentv1.RegisterProcessServiceServer(gs, process.NewServer(runner))
	agentv1.RegisterFileServiceServer(gs, files.NewServer(fsys))
	agentv1.RegisterGitServiceServer(gs, git.NewServer(g))
	agentv1.RegisterTerminalServiceServer(gs, terminal.NewServer(terms))
	agentv1.RegisterConfigServiceServer(gs, conf)
	agentv1.RegisterInfoServiceServer(gs, &infoServer{
		version: version.Version, started: time.Now(), workDir: cfg.WorkDir,
		gitExists: g.Available,
	})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)

	// The gateway reaches the gRPC server through in-process socket pairs,
	// so REST gets exactly the gRPC semantics (auth, limits, streaming).
	inproc, err := edge.NewInProc()
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	gw := edge.GatewayMux()
	ctx := context.Background()
	for _, reg := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		agentv1.RegisterProcessServiceHandler,
		agentv1.RegisterFileServiceHandler,
		agentv1.RegisterGitServiceHandler,
		agentv1.RegisterInfoServiceHandler,
		agentv1.RegisterTerminalServiceHandler,
	} {
		if err := reg(ctx, gw, inproc.Conn); err != nil {
			inproc.Conn.Close()
			return nil, fmt.Errorf("agent: register gateway: %w", err)
		}
	}

	raw := files.NewHTTPHandler(fsys)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", healthz)
	mux.Handle("GET /metrics", mt.handler())
	mux.HandleFunc("GET /openapi.json", serveOpenAPI) // openapi.go
	mux.Handle("/v1/files/", raw)
	mux.Handle(files.ArchiveRoutePrefix+"/", raw)
	mux.Handle("/v1/terminals/ws", terminal.WebSocket(terms))
	// The OpenHands agent-server subset (pkg/agent/openhands).
	oh := openhands.New(openhands.Config{Runner: runner, Files: fsys, Git: g, WorkDir: cfg.WorkDir,
		Version: version.Version, Logger: log.With("component", "openhands")})
	for _, pattern := range oh.Routes() {
		mux.Handle(pattern, oh)
	}
	mux.Handle("/", limitBody(gw))

	return &Server{
		cfg: cfg, log: log, grpc: gs, health: hs, runner: runner, terms: terms,
		handler: rec.HTTP(auth.httpMiddleware(mux)),
		inproc:  inproc,
	}, nil
}

// Handler returns the HTTP (REST) handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves gRPC and REST on ln until ctx is cancelled, then shuts down
// gracefully within Config.ShutdownGrace: in-flight calls finish or are
// cancelled, and background processes are killed.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.log.Info("agent serving", "addr", ln.Addr().String(), "work_dir", s.cfg.WorkDir, "auth", !s.cfg.NoAuth)
	srv := &edge.Server{
		GRPC: s.grpc, HTTP: s.handler, InProc: s.inproc, ShutdownGrace: s.cfg.ShutdownGrace, Logger: s.log,
		OnShutdown: func() { s.runner.Close(); s.terms.Close() },
	}
	go func() {
		<-ctx.Done()
		s.log.Info("agent shutting down")
		s.health.Shutdown()
		// Terminal sessions end now, so their streams do not hold up the
		// graceful stop.
		s.terms.Close()
	}()
	if err := srv.Serve(ctx, ln); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}
