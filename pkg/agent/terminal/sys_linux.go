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
	var out []int
	for _, pid := range pids() {
		if st, ok := readStat(pid); ok && st.live() && st.sid == sid {
			out = append(out, pid)
		}
	}
	return out
}

// procStat is what /proc/PID/stat says of a process.
type procStat struct {
	state byte // R, S, D, Z (zombie), X (dead), ...
	ppid  int
	sid   int
}

func (s procStat) live() bool { return s.state != 'Z' && s.state != 'X' }

// readStat reads /proc/PID/stat; false when the process is gone.
func readStat(pid int) (procStat, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid pgrp session ...; comm may hold anything.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 4 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	sid, err2 := strconv.Atoi(string(f[3]))
	if err1 != nil || err2 != nil {
		return procStat{}, false
	}
	return procStat{state: f[0][0], ppid: ppid, sid: sid}, true
}

// pids lists the processes in /proc.
func pids() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make([]int, 0, len(ents))
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
