//go:build !unix

package git

import "os/exec"

// setProcessGroup keeps exec's default: cancellation kills the git process.
func setProcessGroup(cmd *exec.Cmd) {}
