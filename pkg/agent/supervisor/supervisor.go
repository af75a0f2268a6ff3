// Package supervisor is the agent's init mode. When the agent runs as PID 1 of
// a container (or with --init), the first process becomes a small supervisor:
// it starts the agent server as a child, optionally starts the image's own
// entrypoint as a second child, forwards termination signals to them, and
// reaps every zombie that is re-parented to it. Keeping the reaper in its own
// process (as tini does) means it never races the server's exec.Cmd.Wait for
// the exit status of the commands the server runs.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ChildEnv marks the re-executed server process so it does not supervise again.
const ChildEnv = "BERTH_AGENT_SUPERVISED"

// Config configures a supervisor.
type Config struct {
	// Server is the agent server's argv, usually /proc/self/exe and the
	// original flags. Required.
	Server []string
	// Entrypoint is the image's own command, run as a sibling of the server;
	// empty for none. Its exit is logged; the sandbox keeps serving.
	Entrypoint []string
	// Subreaper makes this process a child subreaper (PR_SET_CHILD_SUBREAPER)
	// so orphans are re-parented to it even when it is not PID 1. Default false.
	Subreaper bool
	// StopGrace is how long the remaining processes get after SIGTERM before
	// SIGKILL when the supervisor stops. Default 5s.
	StopGrace time.Duration
	// Logger receives the supervisor's logs. Default slog.Default().
	Logger *slog.Logger
}

// forwarded are the signals passed on to the children.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// Run supervises until the server child exits, and returns the exit code the
// process should exit with: the server's.
func Run(ctx context.Context, cfg Config) (int, error) {
	if len(cfg.Server) == 0 {
		return 1, errors.New("supervisor: no server command")
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return 1, fmt.Errorf("supervisor: set child subreaper: %w", err)
		}
	}
	// Subscribe before starting children so no SIGCHLD or SIGTERM is missed.
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, append([]os.Signal{syscall.SIGCHLD}, forwarded...)...)
	defer signal.Stop(sigs)

	server, err := start(cfg.Server, append(os.Environ(), ChildEnv+"=1"), true)
	if err != nil {
		return 1, fmt.Errorf("supervisor: start server: %w", err)
	}
	log.Info("supervisor started server", "pid", server)
	entry := 0
	if len(cfg.Entrypoint) > 0 {
		entry, err = start(cfg.Entrypoint, withoutToken(os.Environ()), false)
		if err != nil {
			log.Error("supervisor: entrypoint did not start", "argv", cfg.Entrypoint, "err", err)
		} else {
			log.Info("supervisor started entrypoint", "pid", entry, "argv", cfg.Entrypoint)
		}
	}

	done := ctx.Done()
	for {
		select {
		case <-done:
			done = nil // once is enough; wait for the server to exit
			_ = syscall.Kill(server, syscall.SIGTERM)
			continue
		case sig := <-sigs:
			if sig != syscall.SIGCHLD {
				s := sig.(syscall.Signal)
				log.Info("supervisor forwarding signal", "signal", s.String())
				_ = syscall.Kill(server, s)
				if entry > 0 {
					_ = syscall.Kill(entry, s)
				}
				continue
			}
		}
		// Reap everything that has exited; note the children we care about.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			switch pid {
			case server:
				code := exitCode(ws)
				log.Info("supervisor: server exited", "code", code)
				stopRest(cfg.StopGrace, log)
				return code, nil
			case entry:
				log.Info("supervisor: entrypoint exited", "code", exitCode(ws))
				entry = 0
			default:
				log.Debug("supervisor reaped orphan", "pid", pid)
			}
		}
	}
}

// start starts argv as a child in the supervisor's process group, with
// standard streams inherited so container logs show its output. With
// dieWithParent the child is killed if the supervisor dies, so a server is
// never left running without its reaper.
func start(argv []string, env []string, dieWithParent bool) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	if dieWithParent {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	// The supervisor reaps with Wait4(-1); release the os.Process handle so
	// the runtime does not also wait for it.
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	return pid, nil
}

// stopRest terminates every remaining descendant: TERM, a grace period, KILL.
// As PID 1 kill(-1) reaches every process in the container; as a subreaper
// only our own descendants are left re-parented to us, and we signal those.
func stopRest(grace time.Duration, log *slog.Logger) {
	kill := func(sig syscall.Signal) {
		if os.Getpid() == 1 {
			_ = syscall.Kill(-1, sig)
			return
		}
		for _, pid := range children() {
			_ = syscall.Kill(pid, sig)
		}
	}
	kill(syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.ECHILD) {
			return
		}
		if pid <= 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	log.Warn("supervisor: processes left after grace, killing")
	kill(syscall.SIGKILL)
	for {
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(-1, &ws, 0, nil); err != nil {
			return
		}
	}
}

func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// withoutToken drops BERTH_AGENT_TOKEN so the image's entrypoint never sees it.
func withoutToken(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "BERTH_AGENT_TOKEN=") {
			out = append(out, kv)
		}
	}
	return out
}
