package terminal

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// pollable returns a non-blocking, poller-registered duplicate of the
// terminal's master and closes f. creack/pty leaves the master in blocking
// mode (it calls Fd); a blocking read could be neither interrupted by Close
// nor bounded by a deadline, and a stray process holding the terminal open
// would pin the reader forever.
func pollable(f *os.File) (*os.File, error) {
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup terminal: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("terminal non-blocking: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// control runs fn on f's descriptor without switching it to blocking mode.
func control(f *os.File, fn func(fd int) error) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := sc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// setWinsize sets the terminal's size; the kernel sends SIGWINCH to the
// foreground process group when it changes.
func setWinsize(f *os.File, rows, cols uint16) error {
	return control(f, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
}

// foregroundGroup returns the terminal's foreground process group.
func foregroundGroup(f *os.File) (int, error) {
	var pg int
	err := control(f, func(fd int) (err error) {
		pg, err = unix.IoctlGetInt(fd, unix.TIOCGPGRP)
		return err
	})
	return pg, err
}
