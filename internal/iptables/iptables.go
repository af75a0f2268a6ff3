// Package iptables runs the iptables tools (iptables, ip6tables,
// iptables-save, iptables-restore) for the packages that program berth's
// host firewall rules, and serialises their changes across processes on
// the host.
package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Timeout bounds one command.
const Timeout = 30 * time.Second

// Run runs the command name with args, stdin as its input when not nil,
// and returns its standard output. It runs to the end even when ctx is
// cancelled (rules are removed during shutdown), bounded by Timeout. The
// error names the command and carries its standard error; a missing
// command wraps exec.ErrNotFound.
func Run(ctx context.Context, stdin []byte, name string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	var stdout, stderr strings.Builder
	c := exec.CommandContext(cctx, name, args...)
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Lock takes an exclusive flock on the file name in the temp dir, so that
// one process at a time on the host changes the rules it guards, and
// returns the function that releases it. It is best effort: when the file
// cannot be opened or locked, Lock returns at once and its release does
// nothing.
func Lock(name string) func() {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return func() {}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return func() {}
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
}
