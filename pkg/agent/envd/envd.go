package envd

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"sync"

	"github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/agent/terminal"
	"github.com/berth-dev/berth/pkg/agent/users"
	"github.com/berth-dev/berth/proto/e2b/envd/filesystem/filesystemconnect"
	"github.com/berth-dev/berth/proto/e2b/envd/process/processconnect"
)

// Runner is the subset of process.Runner the process service uses.
type Runner interface {
	Start(ctx context.Context, s process.Spec) (process.Info, error)
	Get(id string) (process.Info, error)
	Logs(ctx context.Context, id string, follow bool, emit process.EmitFunc) error
	WriteStdin(ctx context.Context, id string, data []byte, closeStdin bool) (int, error)
	Signal(id string, sig string) error
}

// Terminals is the subset of terminal.Manager the process service uses for
// processes started with a PTY.
type Terminals interface {
	Open(spec terminal.Spec) (*terminal.Session, error)
	Get(id string) (*terminal.Session, error)
	Kill(ctx context.Context, id, signal string) error
}

// Config configures a Service.
type Config struct {
	// Runner runs the processes started without a PTY. Required.
	Runner Runner
	// Terminals runs the processes started with a PTY. Required.
	Terminals Terminals
	// Users resolves the users requests name, and is the default user.
	// Default nil: only the agent's own user, which requests may name by
	// name or uid.
	Users *users.Resolver
	// AccessToken, when set, must be sent in X-Access-Token by every
	// request but GET /health. Default "": none.
	AccessToken string
	// WorkDir is where the default user's relative paths resolve and its
	// processes start by default. Default: the default user's home.
	WorkDir string
	// Files configures the file service of each user (Chown and AsUser are
	// set per user). Default: files.Config{} with Logger.
	Files files.Config
	// Environ returns the environment GET /envs reports (an error is a
	// 500). Default os.Environ.
	Environ func() ([]string, error)
	// Logger receives the service's logs. Default slog.Default().
	Logger *slog.Logger
}

// Service serves the envd protocol. Create it with New; Close it to end
// its pollable watchers.
type Service struct {
	cfg    Config
	log    *slog.Logger
	token  []byte
	procs  *procTable
	fsMu   sync.Mutex
	fsByID map[[2]uint32]*files.FS
	// ctx bounds the pollable watchers (CreateWatcher); Close cancels it.
	ctx      context.Context
	cancel   context.CancelFunc
	watchMu  sync.Mutex
	watchers map[string]*pollWatcher
	cpu      cpuSampler
	handler  http.Handler
}

// New returns a Service configured by cfg.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Environ == nil {
		cfg.Environ = func() ([]string, error) { return os.Environ(), nil }
	}
	if cfg.Files.Logger == nil {
		cfg.Files.Logger = cfg.Logger
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		cfg: cfg, log: cfg.Logger, procs: newProcTable(),
		fsByID: make(map[[2]uint32]*files.FS), ctx: ctx, cancel: cancel,
		watchers: make(map[string]*pollWatcher),
	}
	if cfg.AccessToken != "" {
		s.token = []byte(cfg.AccessToken)
	}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /envs", s.envs)
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	s.handler = s.authenticate(mux)
	return s
}

// Handler returns the HTTP handler of the envd routes: the Connect
// procedures under /process.Process/ and /filesystem.Filesystem/, and
// /files, /health, /envs and /metrics.
func (s *Service) Handler() http.Handler { return s.handler }

// Close ends the pollable watchers. Processes are the Runner's and the
// Terminals'.
func (s *Service) Close() {
	s.cancel()
	s.watchMu.Lock()
	ws := s.watchers
	s.watchers = map[string]*pollWatcher{}
	s.watchMu.Unlock()
	for _, w := range ws {
		w.w.Close()
	}
}
