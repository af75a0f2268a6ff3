package process

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/agent/internal/retain"
	"github.com/berth-dev/berth/pkg/agent/mask"
	"github.com/berth-dev/berth/pkg/agent/users"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Defaults used when a Config or Spec field is zero.
const (
	// DefaultShell runs Spec.Command as DefaultShell -c COMMAND.
	DefaultShell = "/bin/sh"
	// DefaultMaxProcesses is the default limit of concurrently running commands.
	DefaultMaxProcesses = 256
	// DefaultReplayBuffer is the default per background process replay buffer.
	DefaultReplayBuffer = 1 << 20
	// DefaultExitedRetention is how long an exited background process is kept by default.
	DefaultExitedRetention = 10 * time.Minute
	// DefaultMaxRetained is the default number of exited background processes kept.
	DefaultMaxRetained = 256
	// DefaultKillGrace is the default time between SIGTERM and SIGKILL.
	DefaultKillGrace = 2 * time.Second
	// DefaultOutputLimit is the default number of bytes of each stream kept by Exec.
	DefaultOutputLimit = 1 << 20
)

// drainDelay is how long the Runner keeps reading a command's output after
// its process group was killed, for processes that escaped the group but
// still hold the pipes.
const drainDelay = 500 * time.Millisecond

// Config configures a Runner. The zero value is usable.
type Config struct {
	// OOMScoreAdj, when non-zero, is written to each command's
	// /proc/PID/oom_score_adj right after it starts, so that under memory
	// pressure the kernel kills commands before the agent (the sandbox-agent
	// sets 500). Default 0: leave it as inherited.
	OOMScoreAdj int
	// OOMKills counts the OOM kills in the agent's memory cgroup; a command
	// that died of a SIGKILL the agent did not send while the count rose is
	// reported as OOM-killed (ExitStatus.OOMKilled). Default
	// CgroupOOMKills(); when that finds no readable cgroup file, OOM kills
	// are not detected.
	OOMKills OOMKillCounter
	// WorkDir is the working directory of commands that set no Cwd; default:
	// the current directory of this process.
	WorkDir string
	// Shell runs Spec.Command as Shell -c COMMAND; default "/bin/sh".
	Shell string
	// DefaultTimeout bounds Exec and Stream commands that set no Timeout;
	// default 0: no limit. Background processes are only bounded by their
	// own Spec.Timeout.
	DefaultTimeout time.Duration
	// MaxProcesses limits the commands running at once (Exec, Stream and
	// background together); default 256. Beyond it calls fail with
	// errdefs.ErrResourceExhausted.
	MaxProcesses int
	// ReplayBuffer is the number of output bytes kept per background process
	// for Logs; default 1 MiB.
	ReplayBuffer int
	// ExitedRetention is how long an exited background process stays
	// visible to Get, List and Logs; default 10 minutes.
	ExitedRetention time.Duration
	// MaxRetained is the number of exited background processes kept; the
	// oldest (by start) are forgotten first; default 256.
	MaxRetained int
	// Environ returns the base environment of commands, to which Spec.Env
	// is applied; default os.Environ. An error fails the command's start.
	Environ func() ([]string, error)
	// Users resolves the user each command runs as (Spec.User, or the
	// default user) and enforces the root policy; the command gets that
	// user's credentials, supplementary groups and HOME, USER and LOGNAME
	// (Spec.Env still overrides them). Default nil: commands run as the
	// agent's own user and a Spec.User is refused.
	Users *users.Resolver
	// Logger receives debug records about commands and warnings; default
	// slog.Default().
	Logger *slog.Logger
	// Masker replaces secret values in every command's output (Exec
	// results, Stream chunks, background logs) before anything else sees
	// it; default nil: output is passed as is. Each stream holds back a
	// tail that could start a value until more output or the end.
	Masker *mask.Masker
}

// Runner runs commands. It is safe for concurrent use. Close it to kill
// whatever is still running.
type Runner struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	closed   bool
	running  int                 // commands holding a slot
	procs    map[*proc]struct{}  // every live command, for Close
	bg       map[string]*proc    // background processes, running and retained
	exited   *retain.List[*proc] // retained exited background processes, oldest first
	seq      uint64
	closedCh chan struct{}
}

// NewRunner returns a Runner configured by cfg, with defaults applied to its
// zero fields.
func NewRunner(cfg Config) *Runner {
	if cfg.Shell == "" {
		cfg.Shell = DefaultShell
	}
	if cfg.MaxProcesses <= 0 {
		cfg.MaxProcesses = DefaultMaxProcesses
	}
	if cfg.ReplayBuffer <= 0 {
		cfg.ReplayBuffer = DefaultReplayBuffer
	}
	if cfg.ExitedRetention <= 0 {
		cfg.ExitedRetention = DefaultExitedRetention
	}
	if cfg.MaxRetained <= 0 {
		cfg.MaxRetained = DefaultMaxRetained
	}
	if cfg.Environ == nil {
		cfg.Environ = func() ([]string, error) { return os.Environ(), nil }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OOMKills == nil {
		cfg.OOMKills = CgroupOOMKills()
	}
	r := &Runner{
		cfg:      cfg,
		log:      cfg.Logger,
		procs:    make(map[*proc]struct{}),
		bg:       make(map[string]*proc),
		closedCh: make(chan struct{}),
	}
	r.exited = retain.New(&r.mu, cfg.MaxRetained, cfg.ExitedRetention, r.forgetLocked,
		func(a, b *proc) int { return cmp.Compare(a.seq, b.seq) })
	return r
}

// Close stops every command still running (SIGTERM to its group, SIGKILL
// after its kill grace), waits for them, and forgets all background
// processes. Exec and Stream calls in progress return the result so far.
// Later calls fail with errdefs.ErrUnavailable. Close is idempotent.
func (r *Runner) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.closedCh)
	}
	live := make([]*proc, 0, len(r.procs))
	for p := range r.procs {
		live = append(live, p)
	}
	r.mu.Unlock()

	for _, p := range live {
		p.stop()
	}
	for _, p := range live {
		<-p.done
	}

	r.mu.Lock()
	r.exited.Clear()
	clear(r.bg)
	r.mu.Unlock()
}

// acquire takes a slot for a new command and registers p for Close.
func (r *Runner) acquire(p *proc) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errdefs.Unavailable("process runner is shut down")
	}
	if r.running >= r.cfg.MaxProcesses {
		return errdefs.ResourceExhausted("%d commands are running, the limit is %d", r.running, r.cfg.MaxProcesses)
	}
	r.running++
	r.seq++
	p.seq = r.seq
	r.procs[p] = struct{}{}
	return nil
}

// publish makes a started background process visible.
func (r *Runner) publish(p *proc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.bg[p.id] = p
	}
}

// release gives back p's slot; for a background process that started it
// starts the retention of its record.
func (r *Runner) release(p *proc, started bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running--
	delete(r.procs, p)
	if p.id == "" || r.closed || !started {
		delete(r.bg, p.id)
		return
	}
	r.exited.Add(p)
}

// forgetLocked drops an exited background process from the index; the
// retention list calls it with r.mu held.
func (r *Runner) forgetLocked(p *proc) {
	if r.bg[p.id] == p {
		delete(r.bg, p.id)
	}
}

// lookup returns the background process id.
func (r *Runner) lookup(id string) (*proc, error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("id", "must not be empty")
	}
	r.mu.Lock()
	p, ok := r.bg[id]
	r.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFound("process %q", id)
	}
	return p, nil
}

// newID returns a background process id like "p-1f2e3d4c5b6a7988".
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "p-" + hex.EncodeToString(b[:])
}
