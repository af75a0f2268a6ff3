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
	"github.com/berth-dev/berth/pkg/agent/app"
	"github.com/berth-dev/berth/pkg/agent/envd"
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
	// KeepWorkDirOwner leaves a root-owned WorkDir to root. Default false:
	// when the agent runs as root and the default user is not root, a
	// WorkDir owned by root is given to the default user.
	KeepWorkDirOwner bool
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
	// App, when set, is a server the image carries that the agent runs as
	// a supervised child and forwards the routes it does not serve to
	// (package app, docs/openhands.md). Default nil: none.
	App *AppConfig
}

// AppConfig is the app an agent runs (Config.App).
type AppConfig struct {
	// Argv is its command line. Required.
	Argv []string
	// Port is the port it listens on. Required.
	Port int
	// Dir is its working directory. Default: Config.WorkDir.
	Dir string
	// Key is given to it in app.KeyEnv and sent as app.KeyHeader on the
	// requests forwarded to it (not on /sockets/ paths). Default "": none.
	Key string
}

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
	app     *app.App // nil without Config.App
	stopApp context.CancelFunc
	// envd serves E2B's envd protocol (ServeEnvd).
	envd        *envd.Service
	envdHandler http.Handler
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
	unary := []grpc.UnaryServerInterceptor{rec.Unary, auth.unary, mt.unary}
	gs := grpc.NewServer(append(edge.GRPCOptions(4*edge.DefaultMaxStreams, 0),
		grpc.InTapHandle(auth.tap),
		// Upload chunks are decoded into pooled blocks (files.Codec).
		grpc.ForceServerCodecV2(files.NewCodec()),
		grpc.ChainUnaryInterceptor(unary...),
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

	procSrv := process.NewServer(runner)
	agentv1.RegisterProcessServiceServer(gs, procSrv)
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
	// Exec is called in-process (direct.go); the rest over the socket pair.
	direct := directProcess{ProcessServiceClient: agentv1.NewProcessServiceClient(inproc.Conn), srv: procSrv, chain: edge.ChainUnary(unary...)}
	if err := agentv1.RegisterProcessServiceHandlerClient(ctx, gw, direct); err != nil {
		inproc.Conn.Close()
		return nil, fmt.Errorf("agent: register gateway: %w", err)
	}
	for _, reg := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
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

	var ap *app.App
	stopApp := context.CancelFunc(func() {})
	if cfg.App != nil {
		ap, stopApp, err = startApp(cfg, us, conf, log)
		if err != nil {
			inproc.Conn.Close()
			return nil, err
		}
	}

	raw := files.NewHTTPHandler(fsys)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", healthz(ap))
	mux.Handle("GET /metrics", mt.handler())
	mux.HandleFunc("GET /openapi.json", serveOpenAPI) // openapi.go
	mux.Handle("/v1/files/", raw)
	mux.Handle(files.ArchiveRoutePrefix+"/", raw)
	mux.Handle("/v1/terminals/ws", terminal.WebSocket(terms))
	// The OpenHands agent-server subset (pkg/agent/openhands).
	oh := openhands.New(openhands.Config{Runner: runner, Files: fsys, Git: g, WorkDir: cfg.WorkDir,
		Version: version.Version, Logger: log.With("component", "openhands"), Fallback: appHandler(ap)})
	for _, pattern := range oh.Routes() {
		mux.Handle(pattern, oh)
	}
	if ap != nil {
		// The app's WebSocket event streams (the OpenHands agent-server's
		// /sockets/events/{id}); berth serves nothing under /sockets/.
		mux.Handle("/sockets/", ap.Handler())
	}
	mux.Handle("/", limitBody(gw))

	// E2B's envd protocol, on its own listener (ServeEnvd): the agent's
	// token is its access token, files act as the user a request names.
	envdToken := cfg.Token
	if cfg.NoAuth {
		envdToken = ""
	}
	ev := envd.New(envd.Config{Runner: runner, Terminals: terms, Users: us, AccessToken: envdToken,
		WorkDir: cfg.WorkDir, Environ: conf.environ, Logger: log.With("component", "envd")})

	return &Server{
		cfg: cfg, log: log, grpc: gs, health: hs, runner: runner, terms: terms,
		handler: rec.HTTP(auth.httpMiddleware(mux)),
		inproc:  inproc, app: ap, stopApp: stopApp,
		envd: ev, envdHandler: rec.HTTP(ev.Handler()),
	}, nil
}

// Handler returns the HTTP (REST) handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves gRPC and REST on ln until ctx is cancelled, then shuts down
// gracefully within Config.ShutdownGrace: in-flight calls finish or are
// cancelled, and background processes are killed.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.log.Info("agent serving", "addr", ln.Addr().String(), "work_dir", s.cfg.WorkDir, "auth", !s.cfg.NoAuth)
	go warmProto(agentProtoPackage) // warm.go
	srv := &edge.Server{
		GRPC: s.grpc, HTTP: s.handler, InProc: s.inproc, ShutdownGrace: s.cfg.ShutdownGrace, Logger: s.log,
		OnShutdown: func() { s.stopApp(); s.envd.Close(); s.runner.Close(); s.terms.Close() },
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
