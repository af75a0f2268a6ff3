//go:build !linux

package terminal

import "errors"

// waitExited is not available: the session's leader is reaped by Wait.
func waitExited(int) error { return errors.New("waitid: not supported on this system") }

// sessionMembers is not available: only the leader's process group is
// signalled.
func sessionMembers(int) []int { return nil }

// procStat is what /proc would say of a process; there is none here.
type procStat struct {
	state byte
	ppid  int
	sid   int
}

func (s procStat) live() bool { return s.state != 'Z' && s.state != 'X' }

// readStat finds nothing without /proc.
func readStat(int) (procStat, bool) { return procStat{}, false }

// pids finds nothing without /proc.
func pids() []int { return nil }
