package terminal

import (
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// waitExited blocks until process pid has exited but leaves it a zombie
// (waitid with WNOWAIT), so its pid — and so the terminal's session id —
// stays reserved until it is reaped.
func waitExited(pid int) error {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return err
		}
	}
}

// sessionMembers returns the live processes whose session id is sid. A sid
// stays reserved while any process is in the session, so the answer cannot
// name an unrelated process as long as the session's leader is not reaped.
func sessionMembers(sid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...; comm may hold anything.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(data[i+1:])
		if len(f) < 4 || f[0][0] == 'Z' || f[0][0] == 'X' {
			continue
		}
		if s, err := strconv.Atoi(string(f[3])); err == nil && s == sid {
			out = append(out, pid)
		}
	}
	return out
}
