//go:build !linux

package terminal

import "errors"

// waitExited is not available: the session's leader is reaped by Wait.
func waitExited(int) error { return errors.New("waitid: not supported on this system") }

// sessionMembers is not available: only the leader's process group is
// signalled.
func sessionMembers(int) []int { return nil }
