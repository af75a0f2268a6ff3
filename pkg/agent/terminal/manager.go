package terminal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	ossignal "os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/moby/sys/user"

	"github.com/berth-dev/berth/pkg/agent/internal/retain"
	"github.com/berth-dev/berth/pkg/agent/mask"
	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Defaults used when a Config or Spec field is zero.
const (
	// DefaultMaxSessions is the default limit of running sessions.
	DefaultMaxSessions = 32
	// DefaultScrollback is the default scrollback kept per session.
	DefaultScrollback = 256 << 10
	// DefaultClientBuffer is the default output a client may fall behind by.
	DefaultClientBuffer = 1 << 20
	// DefaultEndedRetention is how long an ended session stays visible.
	DefaultEndedRetention = 5 * time.Minute
	// DefaultKillGrace is the time between SIGHUP and SIGKILL when a
	// session is ended.
	DefaultKillGrace = 2 * time.Second
	// DefaultTerm is the TERM of sessions that set none.
	DefaultTerm = "xterm-256color"
	// DefaultRows and DefaultCols are the size of sessions that set none.
	DefaultRows, DefaultCols = 24, 80
	// MaxSize bounds rows and columns.
	MaxSize = 10000
	// fallbackShell runs when no command is given and the user's login
	// shell is unknown or unusable.
	fallbackShell = "/bin/sh"
)

// Commander turns a command spec into an unstarted command under the
// agent's command policy (user, root policy, environment, cwd, lookup);
// *process.Runner implements it.
type Commander interface {
	Command(process.Spec) (*exec.Cmd, error)
}

// Config configures a Manager.
type Config struct {
	// Commands builds the commands sessions run. Required.
	Commands Commander
	// MaxSessions limits the running sessions; default 32. Beyond it Open
	// fails with errdefs.ErrResourceExhausted. It also bounds the ended
	// sessions kept.
	MaxSessions int
	// Scrollback is the number of output bytes kept per session and
	// replayed to a client that attaches; default 256 KiB.
	Scrollback int
	// ClientBuffer is how many output bytes may wait for one client before
	// it is disconnected as too slow; default 1 MiB.
	ClientBuffer int
	// EndedRetention is how long an ended session stays visible to List
	// and Attach; default 5 minutes.
	EndedRetention time.Duration
	// KillGrace is the time between SIGHUP and SIGKILL when a session is
	// ended by Kill or Close; default 2s.
	KillGrace time.Duration
	// OOMScoreAdj, when non-zero, is written to each program's
	// /proc/PID/oom_score_adj, as process.Config.OOMScoreAdj; default 0.
	OOMScoreAdj int
	// Passwd is the user database where a session without a command finds
	// its user's login shell; default /etc/passwd.
	Passwd string
	// Logger receives session starts and ends; default slog.Default().
	Logger *slog.Logger
	// Masker replaces secret values in the terminal's output (scrollback
	// and clients); default nil: output is passed as is. A tail that could
	// start a value is held back until more output, or MaskQuiet of quiet.
	Masker *mask.Masker
	// MaskQuiet is how long a held-back tail waits for more output before
	// it is passed on as it is; default 100 ms. A value split across a
	// longer pause is not masked (masking is best effort).
	MaskQuiet time.Duration
}

// Spec describes a session to open.
type Spec struct {
	// Argv, Command, Cwd, Env and User are as in process.Spec. With neither
	// Argv nor Command the program is the user's login shell (from
	// Config.Passwd), or /bin/sh when that is missing or not executable.
	Argv    []string
	Command string
	Cwd     string
	Env     map[string]string
	User    string
	// Rows and Cols are the terminal's size; default 24 by 80.
	Rows, Cols int
	// Term is the TERM variable; default "xterm-256color". A TERM in Env
	// wins.
	Term string
}

// Manager runs terminal sessions. It is safe for concurrent use. Close it
// to end every session.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	closed   bool
	running  int
	sessions map[string]*Session
	retired  *retain.List[*Session] // ended sessions kept, oldest first
}

// New returns a Manager configured by cfg, with defaults applied.
func New(cfg Config) *Manager {
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.Scrollback <= 0 {
		cfg.Scrollback = DefaultScrollback
	}
	if cfg.ClientBuffer <= 0 {
		cfg.ClientBuffer = DefaultClientBuffer
	}
	if cfg.EndedRetention <= 0 {
		cfg.EndedRetention = DefaultEndedRetention
	}
	if cfg.MaskQuiet <= 0 {
		cfg.MaskQuiet = DefaultMaskQuiet
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.Passwd == "" {
		cfg.Passwd = "/etc/passwd"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	restoreHangup()
	m := &Manager{
		cfg:      cfg,
		log:      cfg.Logger,
		sessions: make(map[string]*Session),
	}
	m.retired = retain.New(&m.mu, cfg.MaxSessions, cfg.EndedRetention, m.forgetLocked, nil)
	return m
}

// checkSize validates a terminal size.
func checkSize(rows, cols int) error {
	if rows < 1 || rows > MaxSize {
		return errdefs.InvalidArgument("rows", "must be 1 to %d, got %d", MaxSize, rows)
	}
	if cols < 1 || cols > MaxSize {
		return errdefs.InvalidArgument("cols", "must be 1 to %d, got %d", MaxSize, cols)
	}
	return nil
}

// Open starts a session. Errors are those of process.Runner.Command, an
// invalid size or TERM (errdefs.ErrInvalidArgument naming rows, cols or
// term), the session limit (errdefs.ErrResourceExhausted) and a closed
// Manager (errdefs.ErrUnavailable).
func (m *Manager) Open(spec Spec) (*Session, error) {
	if spec.Rows == 0 {
		spec.Rows = DefaultRows
	}
	if spec.Cols == 0 {
		spec.Cols = DefaultCols
	}
	if err := checkSize(spec.Rows, spec.Cols); err != nil {
		return nil, err
	}
	env := maps.Clone(spec.Env)
	if env == nil {
		env = make(map[string]string, 1)
	}
	term, ok := env["TERM"]
	if !ok {
		term = spec.Term
		if term == "" {
			term = DefaultTerm
		}
		if len(term) > 128 || strings.ContainsFunc(term, func(r rune) bool { return r <= ' ' || r > '~' }) {
			return nil, errdefs.InvalidArgument("term", "%q is not a terminal name", term)
		}
		env["TERM"] = term
	}
	ps := process.Spec{Argv: spec.Argv, Command: spec.Command, Cwd: spec.Cwd, Env: env, User: spec.User}
	loginShell := len(ps.Argv) == 0 && ps.Command == ""
	if loginShell {
		ps.Argv = []string{fallbackShell}
	}
	cmd, err := m.cfg.Commands.Command(ps)
	if err != nil {
		return nil, err
	}
	if loginShell {
		if sh := m.loginShell(cmd); sh != "" {
			cmd.Path, cmd.Args = sh, []string{sh}
		}
	}

	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return nil, errdefs.Unavailable("terminals are shut down")
	case m.running >= m.cfg.MaxSessions:
		n := m.running
		m.mu.Unlock()
		return nil, errdefs.ResourceExhausted("%d terminal sessions are running, the limit is %d", n, m.cfg.MaxSessions)
	}
	m.running++
	m.mu.Unlock()

	s, err := m.start(cmd, spec, term)
	if err != nil {
		m.mu.Lock()
		m.running--
		m.mu.Unlock()
		return nil, err
	}
	m.mu.Lock()
	m.sessions[s.id] = s
	closed := m.closed
	m.mu.Unlock()
	go s.read()
	go s.wait()
	if closed { // Close ran meanwhile and did not see s
		s.stop()
	}
	m.log.Info("terminal session started", "session_id", s.id, "pid", s.pid, "program", cmd.Args[0], "user", s.user)
	return s, nil
}

// start starts cmd on a new pseudo-terminal.
func (m *Manager) start(cmd *exec.Cmd, spec Spec, term string) (*Session, error) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		return nil, errdefs.FailedPrecondition("cannot open a pseudo-terminal: %v", err)
	}
	defer tty.Close()
	if ptmx, err = pollable(ptmx); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
	}
	if err := setWinsize(ptmx, uint16(spec.Rows), uint16(spec.Cols)); err != nil {
		_ = ptmx.Close()
		return nil, fmt.Errorf("%w: terminal size: %w", errdefs.ErrInternal, err)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if c := cmd.SysProcAttr.Credential; c != nil {
		// The terminal belongs to its user, as login and sshd do, so that
		// programs opening it by name (script, write) may.
		_ = os.Chown(tty.Name(), int(c.Uid), int(c.Gid))
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr.Setsid = true
	cmd.SysProcAttr.Setctty = true
	cmd.SysProcAttr.Ctty = 0 // the child's stdin
	startedAt := time.Now()
	if err := cmd.Start(); err != nil {
		_ = ptmx.Close()
		return nil, process.StartError(cmd.Args, err)
	}
	if m.cfg.OOMScoreAdj != 0 {
		_ = os.WriteFile("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/oom_score_adj", []byte(strconv.Itoa(m.cfg.OOMScoreAdj)), 0)
	}
	s := &Session{
		m: m, id: newID(), command: spec.Command, term: term, startedAt: startedAt,
		cmd: cmd, pid: cmd.Process.Pid, ptmx: ptmx,
		readDone: make(chan struct{}), leaderDone: make(chan struct{}), done: make(chan struct{}),
		rows: spec.Rows, cols: spec.Cols, scroll: newRing(m.cfg.Scrollback),
		watchers: make(map[*watcher]struct{}),
	}
	for _, kv := range slices.Backward(cmd.Env) {
		if v, ok := strings.CutPrefix(kv, "USER="); ok {
			s.user = v
			break
		}
	}
	return s, nil
}

// loginShell returns the login shell of cmd's user from the user database
// if it is an executable file (and not nologin or false), else "".
func (m *Manager) loginShell(cmd *exec.Cmd) string {
	uid := os.Geteuid()
	if cmd.SysProcAttr != nil && cmd.SysProcAttr.Credential != nil {
		uid = int(cmd.SysProcAttr.Credential.Uid)
	}
	us, err := user.ParsePasswdFileFilter(m.cfg.Passwd, func(u user.User) bool { return u.Uid == uid })
	if err != nil || len(us) == 0 {
		return ""
	}
	sh := us[0].Shell
	if !filepath.IsAbs(sh) {
		return ""
	}
	switch filepath.Base(sh) {
	case "nologin", "false":
		return ""
	}
	fi, err := os.Stat(sh)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return ""
	}
	return sh
}

// Get returns the session id, running or recently ended.
func (m *Manager) Get(id string) (*Session, error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("session_id", "must not be empty")
	}
	m.mu.Lock()
	s, ok := m.sessions[id]
	m.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFound("terminal session %q", id)
	}
	return s, nil
}

// Attach attaches a client to session id; see Session.Attach.
func (m *Manager) Attach(id string, replay bool) (*Attachment, error) {
	s, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	return s.Attach(replay), nil
}

// List describes the sessions, running and recently ended, oldest first.
func (m *Manager) List() []Info {
	m.mu.Lock()
	ss := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	out := make([]Info, 0, len(ss))
	for _, s := range ss {
		out = append(out, s.Info())
	}
	slices.SortFunc(out, func(a, b Info) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Kill ends session id (SIGHUP to its processes, SIGKILL after the kill
// grace) and waits until it ended or ctx is done; killing an ended session
// does nothing. With a signal (a name or number, see process.ParseSignal)
// it only sends that signal to every process of the session, and fails
// with errdefs.ErrFailedPrecondition once the session ended.
func (m *Manager) Kill(ctx context.Context, id, signal string) error {
	s, err := m.Get(id)
	if err != nil {
		return err
	}
	if signal != "" {
		sig, err := process.ParseSignal(signal)
		if err != nil {
			return err
		}
		if !s.signalAll(sig) {
			return s.endedError()
		}
		return nil
	}
	s.stop()
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ended records that s ended: it frees its slot and keeps it visible for
// the retention period.
func (m *Manager) ended(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running--
	if m.closed {
		delete(m.sessions, s.id)
		return
	}
	m.retired.Add(s)
}

// forgetLocked drops an ended session from the index; the retention list
// calls it with m.mu held.
func (m *Manager) forgetLocked(s *Session) {
	if m.sessions[s.id] == s {
		delete(m.sessions, s.id)
	}
}

// Close ends every session (SIGHUP, SIGKILL after the kill grace), waits
// for them and forgets them. Later Opens fail with errdefs.ErrUnavailable.
// Close is idempotent.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	live := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		live = append(live, s)
	}
	m.retired.Clear()
	m.mu.Unlock()
	for _, s := range live {
		s.stop()
	}
	for _, s := range live {
		<-s.done
	}
	m.mu.Lock()
	clear(m.sessions)
	m.mu.Unlock()
}

// newID returns a session id like "t-1f2e3d4c5b6a7988".
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "t-" + hex.EncodeToString(b[:])
}

var hangupOnce sync.Once

// restoreHangup makes the shells this process starts hang up on SIGHUP
// again when the process itself was started with SIGHUP ignored (under
// nohup, by some supervisors): an ignored signal stays ignored across
// exec, and a session's shell would then outlive Kill until the SIGKILL
// of the kill grace. A handled signal is reset to its default by exec, so
// a handler that discards SIGHUP keeps this process ignoring it and gives
// the children the default back.
func restoreHangup() {
	hangupOnce.Do(func() {
		if !ossignal.Ignored(syscall.SIGHUP) {
			return
		}
		c := make(chan os.Signal, 1)
		ossignal.Notify(c, syscall.SIGHUP)
		go func() {
			for range c {
			}
		}()
	})
}
