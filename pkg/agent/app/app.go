// Package app runs a lease's app: a server the image carries (OpenHands'
// agent-server is the one in view) that the agent starts as a supervised
// child, as the sandbox's user, and to which it forwards the routes it does
// not serve itself (Handler). Status tells whether the app listens on its
// port yet, or why it could not start; the agent's /healthz reports it, so
// a sandbox whose app cannot start fails its readiness with that reason.
package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// KeyHeader is the header the app's key is sent in on the requests the
// agent forwards (what the OpenHands agent-server checks).
const KeyHeader = "X-Session-API-Key"

// KeyEnv are the variables of the app's environment that carry its key:
// the OpenHands agent-server reads SESSION_API_KEY and, in newer versions,
// OH_SESSION_API_KEYS_0.
var KeyEnv = []string{"SESSION_API_KEY", "OH_SESSION_API_KEYS_0"}

// State is an app's state.
type State string

// States.
const (
	// Starting: the process runs but its port does not accept connections
	// yet (also after a restart).
	Starting State = "starting"
	// Running: the port accepted a connection.
	Running State = "running"
	// Failed: the process could not be started, or it ended before its
	// port ever accepted a connection. Failed is final.
	Failed State = "failed"
)

// Status is an app's state, the reason of a failure, how many times it was
// restarted, and the last lines of its output.
type Status struct {
	State    State  `json:"state"`
	Reason   string `json:"reason,omitempty"`
	Restarts int    `json:"restarts"`
	Output   string `json:"output,omitempty"`
}

// Config configures an app.
type Config struct {
	// Argv is the command line. Required.
	Argv []string
	// Port is the TCP port the app listens on, on 127.0.0.1 or every
	// interface. Required.
	Port int
	// Dir is the working directory. Required.
	Dir string
	// Env is the environment (KEY=VALUE).
	Env []string
	// Credential is the user it runs as; nil for the agent's own.
	Credential *syscall.Credential
	// Output receives a copy of its output (the agent's stderr, i.e. the
	// container log). Default os.Stderr.
	Output io.Writer
	// Key, when set, is sent as KeyHeader on every forwarded request except
	// WebSocket paths under /sockets/ (the client authenticates those to
	// the app itself).
	Key string
	// PollInterval is how often the port is tried while the app starts.
	// Default 50ms.
	PollInterval time.Duration
	// RestartMin and RestartMax bound the delay before a restart after the
	// app ended (it doubles, from RestartMin to RestartMax). Defaults 1s
	// and 30s.
	RestartMin, RestartMax time.Duration
	// Logger receives the app's lifecycle logs. Default slog.Default().
	Logger *slog.Logger
}

// tailLines is how many lines of output Status carries.
const tailLines = 50

// tailBytes bounds the output kept for Status.
const tailBytes = 16 << 10

// App is a supervised app. Create it with Start.
type App struct {
	cfg   Config
	log   *slog.Logger
	proxy *httputil.ReverseProxy
	done  chan struct{}

	mu   sync.Mutex
	st   Status
	tail []byte
}

// Start validates cfg and starts the app in the background until ctx ends
// (then its process group gets SIGTERM, and SIGKILL 5s later).
func Start(ctx context.Context, cfg Config) (*App, error) {
	switch {
	case len(cfg.Argv) == 0 || cfg.Argv[0] == "":
		return nil, errors.New("app: no command")
	case cfg.Port < 1 || cfg.Port > 65535:
		return nil, fmt.Errorf("app: port %d out of range", cfg.Port)
	}
	if cfg.Output == nil {
		cfg.Output = os.Stderr
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if cfg.RestartMin == 0 {
		cfg.RestartMin = time.Second
	}
	if cfg.RestartMax == 0 {
		cfg.RestartMax = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &App{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), st: Status{State: Starting}}
	a.proxy = a.newProxy()
	go a.run(ctx)
	return a, nil
}

// Done is closed when the app stopped for good (failed, or ctx ended).
func (a *App) Done() <-chan struct{} { return a.done }

// Status returns the app's status.
func (a *App) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.st
	st.Output = lastLines(a.tail, tailLines)
	return st
}

func (a *App) set(f func(*Status)) {
	a.mu.Lock()
	f(&a.st)
	a.mu.Unlock()
}

// Write keeps the last tailBytes of output and copies them to
// Config.Output.
func (a *App) Write(p []byte) (int, error) {
	a.mu.Lock()
	a.tail = append(a.tail, p...)
	if len(a.tail) > tailBytes {
		a.tail = append(a.tail[:0:0], a.tail[len(a.tail)-tailBytes:]...)
	}
	a.mu.Unlock()
	_, _ = a.cfg.Output.Write(p)
	return len(p), nil
}

func lastLines(b []byte, n int) string {
	s := strings.TrimRight(string(bytes.ToValidUTF8(b, []byte("\uFFFD"))), "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run starts the app and restarts it after it ended, until it fails or ctx
// ends.
func (a *App) run(ctx context.Context) {
	defer close(a.done)
	delay := a.cfg.RestartMin
	everRan := false
	for {
		ran, err := a.once(ctx)
		if ctx.Err() != nil {
			return
		}
		everRan = everRan || ran
		if !everRan {
			a.log.Error("app did not start", "argv", a.cfg.Argv, "err", err)
			a.set(func(s *Status) { s.State, s.Reason = Failed, err.Error() })
			return
		}
		a.log.Warn("app ended; restarting", "err", err, "delay", delay)
		a.set(func(s *Status) { s.State, s.Reason = Starting, err.Error() })
		if ran {
			delay = a.cfg.RestartMin
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(delay*2, a.cfg.RestartMax)
		a.set(func(s *Status) { s.Restarts++ })
	}
}

// once runs the app until it ends: ran reports whether its port accepted a
// connection; err says how it ended.
func (a *App) once(ctx context.Context) (ran bool, err error) {
	cmd := exec.Command(a.cfg.Argv[0], a.cfg.Argv[1:]...)
	cmd.Dir, cmd.Env = a.cfg.Dir, a.cfg.Env
	cmd.Stdout, cmd.Stderr = a, a
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: a.cfg.Credential}
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("start %s: %w", a.name(), err)
	}
	a.log.Info("app started", "pid", cmd.Process.Pid, "argv", a.cfg.Argv, "port", a.cfg.Port)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(a.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			return ran, fmt.Errorf("%s %s before it listened on port %d", a.name(), exitText(err), a.cfg.Port)
		case <-ctx.Done():
			stop(cmd.Process.Pid, exited)
			return ran, ctx.Err()
		case <-tick.C:
		}
		if ran {
			continue
		}
		if c, err := net.DialTimeout("tcp", a.addr(), time.Second); err == nil {
			c.Close()
			ran = true
			tick.Reset(time.Hour) // only the exit or ctx matter now
			a.set(func(s *Status) { s.State, s.Reason = Running, "" })
			a.log.Info("app is listening", "port", a.cfg.Port)
		}
	}
}

// name is the app's command line for messages: at most 200 bytes.
func (a *App) name() string {
	s := strings.Join(a.cfg.Argv, " ")
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return s
}

// exitText describes how a process ended.
func exitText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by " + ws.Signal().String()
		}
		return "exited with status " + strconv.Itoa(ee.ExitCode())
	}
	if err == nil {
		return "exited with status 0"
	}
	return "ended: " + err.Error()
}

// stop ends the app's process group: SIGTERM, SIGKILL after 5s.
func stop(pid int, exited <-chan error) {
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-exited
	}
}

func (a *App) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.cfg.Port)) }

// newProxy is the reverse proxy to the app (WebSocket upgrades included:
// httputil.ReverseProxy passes them through).
func (a *App) newProxy() *httputil.ReverseProxy {
	target := &url.URL{Scheme: "http", Host: a.addr()}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			// berth's own credentials never reach the app.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del(KeyHeader)
			if a.cfg.Key != "" && !strings.HasPrefix(pr.In.URL.Path, "/sockets/") {
				pr.Out.Header.Set(KeyHeader, a.cfg.Key)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			st := a.Status()
			msg := fmt.Sprintf("the sandbox's app (port %d) did not answer: %v (app %s", a.cfg.Port, err, st.State)
			if st.Reason != "" {
				msg += ": " + st.Reason
			}
			a.log.Debug("app proxy error", "path", r.URL.Path, "err", err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = fmt.Fprintf(w, "{\"detail\":%q}\n", msg+")")
		},
	}
}

// Handler forwards requests to the app.
func (a *App) Handler() http.Handler { return a.proxy }
