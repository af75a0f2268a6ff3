package process

import (
	"strconv"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// signals maps signal names without the SIG prefix to signals.
var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT,
	"ILL": syscall.SIGILL, "TRAP": syscall.SIGTRAP, "ABRT": syscall.SIGABRT,
	"BUS": syscall.SIGBUS, "FPE": syscall.SIGFPE, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "SEGV": syscall.SIGSEGV, "USR2": syscall.SIGUSR2,
	"PIPE": syscall.SIGPIPE, "ALRM": syscall.SIGALRM, "TERM": syscall.SIGTERM,
	"CHLD": syscall.SIGCHLD, "CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP,
	"TSTP": syscall.SIGTSTP, "TTIN": syscall.SIGTTIN, "TTOU": syscall.SIGTTOU,
	"URG": syscall.SIGURG, "XCPU": syscall.SIGXCPU, "XFSZ": syscall.SIGXFSZ,
	"VTALRM": syscall.SIGVTALRM, "PROF": syscall.SIGPROF, "WINCH": syscall.SIGWINCH,
	"IO": syscall.SIGIO, "SYS": syscall.SIGSYS,
}

var signalNames = func() map[syscall.Signal]string {
	m := make(map[syscall.Signal]string, len(signals))
	for name, s := range signals {
		m[s] = "SIG" + name
	}
	return m
}()

// ParseSignal parses a signal given as a name, with or without the SIG
// prefix and in any case ("TERM", "sigkill"), or as a number ("9"). The
// empty string is SIGTERM. Errors are errdefs.ErrInvalidArgument naming the
// field "signal".
func ParseSignal(s string) (syscall.Signal, error) {
	if s == "" {
		return syscall.SIGTERM, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, errdefs.InvalidArgument("signal", "number %d out of range 1-64", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if sig, ok := signals[name]; ok {
		return sig, nil
	}
	return 0, errdefs.InvalidArgument("signal", "unknown signal %q", s)
}

// SignalName returns the name of sig, like "SIGKILL", or "SIG<n>" for a
// signal without a name.
func SignalName(sig syscall.Signal) string {
	if name, ok := signalNames[sig]; ok {
		return name
	}
	return "SIG" + strconv.Itoa(int(sig))
}
