//go:build unix

package git

import (
	"os/exec"
	"syscall"
)

// setProcessGroup runs cmd in a new session, as the leader of its own
// process group, and makes cancellation kill the whole group, so hooks,
// helpers and transports that git starts die with it. Without a controlling
// terminal, nothing git starts (ssh asking about a host key, a credential
// helper) can wait for input from a terminal: it fails at once instead.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if err == syscall.ESRCH {
			return nil
		}
		return err
	}
}
