//go:build !linux

package process

// waitNoReap is not available on this system: the leader is reaped first
// and its group killed after, which leaves a small window in which the
// group id could be reused.
func waitNoReap(int) error { return errUnsupported }
