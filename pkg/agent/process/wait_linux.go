package process

import (
	"syscall"
	"unsafe"
)

// waitNoReap blocks until process pid has exited but leaves it a zombie
// (waitid with WNOWAIT), so that its pid, and so its process group id, stay
// reserved until it is reaped.
func waitNoReap(pid int) error {
	var info [128]byte // siginfo_t
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, 1 /* P_PID */, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch e {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return e
		}
	}
}
