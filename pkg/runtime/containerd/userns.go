package containerd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	ctd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// DefaultUserNSBase is the first host uid/gid of the sandboxes' user
// namespace range (Config.UserNSBase): far above the host's users and the
// usual /etc/subuid ranges of people (100000+65536·n).
const DefaultUserNSBase uint32 = 1 << 30

// userNSSize is the number of uids (and gids) mapped into a sandbox.
const userNSSize uint32 = 65536

// idMaps are the sandboxes' uid and gid mappings with UserNamespaces.
func (r *Runtime) idMaps() []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: r.cfg.UserNSBase, Size: userNSSize}}
}

// snapshotOpt creates the sandbox's writable snapshot on the image's, or,
// with UserNamespaces, on parent: the image's snapshot with its files
// chowned into the sandboxes' range (see remappedParent).
func (r *Runtime) snapshotOpt(id string, img ctd.Image, parent string) ctd.NewContainerOpts {
	if parent == "" {
		return ctd.WithNewSnapshot(id, img)
	}
	return func(ctx context.Context, client *ctd.Client, c *containers.Container) error {
		if _, err := client.SnapshotService(c.Snapshotter).Prepare(ctx, id, parent); err != nil {
			return err
		}
		c.SnapshotKey = id
		c.Image = img.Name()
		return nil
	}
}

// remapTimeout bounds the creation of one remapped image snapshot (a walk
// that chowns every file of the image, copying each one up on overlayfs).
const remapTimeout = 10 * time.Minute

// remappedPrefix starts the keys of remapped image snapshots.
const remappedPrefix = "berth-userns-"

// remappedParent returns the key of img's remapped snapshot (UserNamespaces
// only; "" otherwise), creating it when it does not exist: a committed
// snapshot of the image's files chowned by UserNSBase, labelled as a
// garbage-collection root so that it outlives the sandboxes and later
// sandboxes of the image start on it without paying the walk again. It is
// bounded by remapTimeout, not by the sandbox's ready timeout: the first
// sandbox of an image with user namespaces waits for it.
func (r *Runtime) remappedParent(ctx context.Context, img ctd.Image) (string, error) {
	if !r.cfg.UserNamespaces {
		return "", nil
	}
	// Again on every Create: an engine restart may have recreated its
	// state directories closed.
	if err := r.ensureTraversable(); err != nil {
		return "", err
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return "", r.mapErr(err, "read layers of image", img.Name())
	}
	chain := identity.ChainID(diffIDs).String()
	key := fmt.Sprintf("%s%d-%s", remappedPrefix, r.cfg.UserNSBase, chain)
	unlock := r.unpackMu.lock(key)
	defer unlock()
	sn := r.cli.SnapshotService(r.cfg.Snapshotter)
	if _, err := sn.Stat(ctx, key); err == nil {
		return key, nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), remapTimeout)
	defer cancel()
	cctx, done, err := r.cli.WithLease(cctx)
	if err != nil {
		return "", r.mapErr(err, "lease for remapping image", img.Name())
	}
	defer done(context.WithoutCancel(cctx))
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	tmp := key + "-remap-" + hex.EncodeToString(rnd[:])
	began := time.Now()
	mounts, err := sn.Prepare(cctx, tmp, chain)
	if err != nil {
		return "", r.mapErr(err, "prepare remapped snapshot of image", img.Name())
	}
	n := 0
	err = mount.WithTempMount(cctx, mounts, func(root string) error {
		var werr error
		n, werr = chownTree(root, int(r.cfg.UserNSBase))
		return werr
	})
	if err == nil {
		err = sn.Commit(cctx, key, tmp, snapshots.WithLabels(map[string]string{
			"containerd.io/gc.root": time.Now().UTC().Format(time.RFC3339),
		}))
	}
	if err != nil {
		_ = sn.Remove(context.WithoutCancel(cctx), tmp)
		if _, serr := sn.Stat(cctx, key); serr == nil { // a concurrent process made it
			return key, nil
		}
		return "", fmt.Errorf("%w: containerd: remap image %s into uids %d+: %w", errdefs.ErrInternal, img.Name(), r.cfg.UserNSBase, err)
	}
	r.log.Info("remapped image for user namespaces", "image", img.Name(), "snapshot", key, "files", n, "duration", time.Since(began))
	return key, nil
}

// chownTree adds base to the owner and group of every file under root
// (ids below userNSSize; others become the range's nobody) and restores the
// set-id bits that chown clears. It returns the number of files.
func chownTree(root string, base int) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		uid, gid := int(st.Uid), int(st.Gid)
		if uid >= int(userNSSize) {
			uid = int(userNSSize) - 2 // nobody
		}
		if gid >= int(userNSSize) {
			gid = int(userNSSize) - 2
		}
		if err := os.Lchown(p, base+uid, base+gid); err != nil {
			return err
		}
		n++
		if m := fi.Mode(); m&fs.ModeSymlink == 0 && m&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			return os.Chmod(p, m)
		}
		return nil
	})
	return n, err
}

// withUserNS puts the sandbox in a user namespace with the range mapped
// (UserNamespaces only). A new sysfs cannot be mounted there: the kernel
// allows it only to the user namespace that owns the network namespace, and
// the sandbox's is made on the host (by CNI) before the task exists (runc:
// "mount sysfs:/sys … operation not permitted"). /sys is the host's sysfs
// instead, bound read-only (recursively: in a user namespace the kernel
// refuses a bind that would uncover what the host's submounts hide, EINVAL;
// the submounts stay the host's, writable only with capabilities the
// sandbox does not have in the host's namespace); the sandbox's own cgroup
// is mounted over /sys/fs/cgroup as usual. Its /sys/class/net lists the
// host's interfaces.
func (r *Runtime) withUserNS(ctx context.Context, c oci.Client, cont *containers.Container, s *oci.Spec) error {
	if !r.cfg.UserNamespaces {
		return nil
	}
	m := r.idMaps()
	if err := oci.WithUserNamespace(m, m)(ctx, c, cont, s); err != nil {
		return err
	}
	for i, mt := range s.Mounts {
		if mt.Destination == "/sys" && mt.Type == "sysfs" {
			s.Mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys",
				Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}
		}
	}
	return nil
}

// hostRoot is the host uid and gid of the sandboxes' root: 0, or the base
// of the range with UserNamespaces.
func (r *Runtime) hostRoot() (uid, gid int) {
	if r.cfg.UserNamespaces {
		return int(r.cfg.UserNSBase), int(r.cfg.UserNSBase)
	}
	return 0, 0
}

// chownToSandboxRoot gives path to the sandboxes' root (with
// UserNamespaces; a no-op otherwise), e.g. the 0400 token file that only
// the agent may read.
func (r *Runtime) chownToSandboxRoot(path string) error {
	if !r.cfg.UserNamespaces {
		return nil
	}
	uid, gid := r.hostRoot()
	return os.Lchown(path, uid, gid)
}

// ensureTraversable lets the sandboxes' root (an unprivileged host uid with
// UserNamespaces) reach the task bundles under containerd's state
// directory: runc bind-mounts the bundle's rootfs from inside the user
// namespace, which fails with "mount …/rootfs … permission denied" when a
// directory on the way is closed to others, as the Docker Engine's
// /run/docker and /run/docker/containerd (0700) are. It adds the search bit
// for others (o+x: enter, not list) to the socket's directory and its
// ancestors, and logs each change.
func (r *Runtime) ensureTraversable() error {
	if !r.cfg.UserNamespaces {
		return nil
	}
	sock := strings.TrimPrefix(r.cfg.Address, "unix://")
	dir, err := filepath.EvalSymlinks(filepath.Dir(sock))
	if err != nil {
		return fmt.Errorf("%w: containerd: resolve %s: %w", errdefs.ErrFailedPrecondition, filepath.Dir(sock), err)
	}
	for ; dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("%w: containerd: %w", errdefs.ErrFailedPrecondition, err)
		}
		if m := fi.Mode().Perm(); m&0o001 == 0 {
			if err := os.Chmod(dir, m|0o001); err != nil {
				return fmt.Errorf("%w: containerd: user namespaces need others to search %s: %w", errdefs.ErrFailedPrecondition, dir, err)
			}
			r.log.Warn("opened a directory to search by others so that user-namespaced sandboxes can reach their bundles",
				"dir", dir, "mode_before", fmt.Sprintf("%04o", m), "mode", fmt.Sprintf("%04o", m|0o001))
		}
	}
	return nil
}

// PrepareImage makes image ref ready for a fast first sandbox: unpacked
// and, with UserNamespaces, remapped (the walk that would otherwise make the
// image's first Create take seconds to tens of seconds). The orchestrator
// calls it for its default image at start.
func (r *Runtime) PrepareImage(ctx context.Context, ref string) error {
	ctx = r.withNS(ctx)
	img, _, err := r.image(ctx, ref)
	if err != nil {
		return err
	}
	_, err = r.remappedParent(ctx, img)
	return err
}
