package files

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// as runs fn with the file-system identity of Config.AsUser, if set: the
// calling goroutine is locked to its OS thread, whose fsuid and fsgid (per
// thread on Linux) are switched for the call, so the kernel checks every
// path fn touches against that user, and the root-only capabilities
// (CAP_DAC_OVERRIDE, CAP_CHOWN, CAP_FOWNER…) leave the thread's effective
// set meanwhile. When the identity cannot be restored the thread stays
// locked, so it ends with the goroutine instead of serving others.
func (f *FS) as(fn func() error) error {
	id := f.asUser
	if id == nil {
		return fn()
	}
	runtime.LockOSThread()
	prevGID, _ := unix.SetfsgidRetGid(int(id.GID))
	prevUID, _ := unix.SetfsuidRetUid(int(id.UID))
	curUID, _ := unix.SetfsuidRetUid(-1)
	curGID, _ := unix.SetfsgidRetGid(-1)
	if curUID != int(id.UID) || curGID != int(id.GID) {
		restored := restoreFS(prevUID, prevGID)
		if restored {
			runtime.UnlockOSThread()
		}
		return fmt.Errorf("%w: files: cannot act as uid %d gid %d (file-system ids now %d/%d)", errdefs.ErrFailedPrecondition, id.UID, id.GID, curUID, curGID)
	}
	err := fn()
	if restoreFS(prevUID, prevGID) {
		runtime.UnlockOSThread()
	}
	return err
}

// restoreFS sets the thread's file-system ids back and reports whether it
// worked.
func restoreFS(uid, gid int) bool {
	_, _ = unix.SetfsuidRetUid(uid)
	_, _ = unix.SetfsgidRetGid(gid)
	u, _ := unix.SetfsuidRetUid(-1)
	g, _ := unix.SetfsgidRetGid(-1)
	return u == uid && g == gid
}
