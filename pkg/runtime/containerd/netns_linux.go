package containerd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// prepareNetnsDir creates dir and makes it a shared mount point, as
// `ip netns add` does, so namespace bind mounts made in it propagate to
// every mount namespace that shares it (e.g. a containerd started with its
// own mount namespace).
func prepareNetnsDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	// Not a mount point yet: bind it onto itself, then make it shared.
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
}

// createNetns creates a new network namespace, brings its loopback
// interface up and bind-mounts it at path (which must not exist), so it
// outlives every process in it until removeNetns. The work happens on a
// dedicated OS thread that is thrown away afterwards (it stays locked), so
// no other goroutine ever runs in the new namespace.
func createNetns(path string) (err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		// Never unlocked: the thread exits with this goroutine.
		if err = unix.Unshare(unix.CLONE_NEWNET); err != nil {
			err = fmt.Errorf("unshare: %w", err)
			return
		}
		if err = loopbackUp(); err != nil {
			err = fmt.Errorf("bring up lo: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err = unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			err = fmt.Errorf("bind mount %s: %w", self, err)
		}
	}()
	wg.Wait()
	return err
}

// loopbackUp sets IFF_UP on lo in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// removeNetns unmounts and removes the namespace bind mount at path. A
// missing path, or one that is not mounted, is fine.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// setPortIsolated turns on the bridge port flag "isolated" of interface
// name (`bridge link set dev NAME isolated on`, Linux 4.18+): isolated
// ports cannot forward frames to each other, only to non-isolated ones
// (the bridge device, i.e. the host).
func setPortIsolated(name string) error {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	attr := func(typ uint16, data []byte) []byte {
		l := unix.SizeofRtAttr + len(data)
		b := make([]byte, (l+unix.RTA_ALIGNTO-1) & ^(unix.RTA_ALIGNTO-1))
		binary.NativeEndian.PutUint16(b[0:], uint16(l))
		binary.NativeEndian.PutUint16(b[2:], typ)
		copy(b[unix.SizeofRtAttr:], data)
		return b
	}
	protinfo := attr(unix.IFLA_PROTINFO|unix.NLA_F_NESTED, attr(unix.IFLA_BRPORT_ISOLATED, []byte{1}))
	ifinfo := make([]byte, unix.SizeofIfInfomsg)
	ifinfo[0] = unix.AF_BRIDGE
	binary.NativeEndian.PutUint32(ifinfo[4:], uint32(ifi.Index))
	body := append(ifinfo, protinfo...)
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], unix.RTM_SETLINK)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], 1) // sequence number
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != 1 {
				continue
			}
			if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
					return fmt.Errorf("RTM_SETLINK: %w", unix.Errno(-code))
				}
				return nil
			}
		}
	}
}

// removeCgroups removes the (empty) cgroups of container id in namespace
// ns, at containerd's default cgroupsPath /NS/ID, in every cgroup v1
// hierarchy and in the v2 one. runc removes them when it deletes a
// container, but not always after a failed create. rmdir only removes empty
// cgroups, so this never disturbs a live one.
func removeCgroups(ns, id string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", ns, id))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", ns, id))
	for _, d := range dirs {
		_ = unix.Rmdir(d)
	}
}
