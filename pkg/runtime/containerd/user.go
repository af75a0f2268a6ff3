package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/continuity/fs"
	"github.com/moby/sys/user"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// userError carries a berth error out of containerd's NewContainer, which
// returns spec option errors as they are.
type userError struct{ err error }

func (e *userError) Error() string { return e.err.Error() }
func (e *userError) Unwrap() error { return e.err }

// withImageUser sets the process user from the image's user spec ("",
// "name", "uid", "name:group", "uid:gid", ...) like Docker: names are
// resolved from the image's /etc/passwd and /etc/group, which also give the
// supplementary groups. When makeWorkdir is set (the image has no working
// directory) runtime.DefaultWorkDir is created owned by that user, so a non-root
// image can write to it.
//
// A root user needs no lookup and no mount (runc creates a missing working
// directory as root); other users are resolved in one temporary mount of
// the container's snapshot. A user that does not exist fails Create at once
// with errdefs.ErrFailedPrecondition, before anything runs. Paths are
// resolved inside the mounted root filesystem (symlinks cannot point out of
// it).
//
// hostBase is the host uid/gid of the sandbox's uid 0 (non-zero with user
// namespaces): the working directory is created owned by the user's host
// ids.
func withImageUser(userSpec string, makeWorkdir bool, hostBase int) oci.SpecOpts {
	return func(ctx context.Context, client oci.Client, c *containers.Container, s *oci.Spec) error {
		u, g, _ := strings.Cut(userSpec, ":")
		if (u == "" || u == "0" || u == "root") && (g == "" || g == "0" || g == "root") {
			s.Process.User = specs.User{UID: 0, GID: 0}
			return nil
		}
		if c.Snapshotter == "" || c.SnapshotKey == "" {
			return errors.New("withImageUser: the container has no snapshot yet")
		}
		mounts, err := client.SnapshotService(c.Snapshotter).Mounts(ctx, c.SnapshotKey)
		if err != nil {
			return err
		}
		var eu *user.ExecUser
		err = mount.WithTempMount(ctx, mounts, func(root string) error {
			passwd, err := fs.RootPath(root, "/etc/passwd")
			if err != nil {
				return err
			}
			group, err := fs.RootPath(root, "/etc/group")
			if err != nil {
				return err
			}
			eu, err = user.GetExecUserPath(userSpec, &user.ExecUser{Uid: 0, Gid: 0, Home: "/"}, passwd, group)
			if err != nil {
				return &userError{fmt.Errorf("%w: containerd: the image's user %q cannot be used: %v", errdefs.ErrFailedPrecondition, userSpec, err)}
			}
			if makeWorkdir {
				return ensureDir(root, runtime.DefaultWorkDir, hostBase+eu.Uid, hostBase+eu.Gid)
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.Process.User = specs.User{UID: uint32(eu.Uid), GID: uint32(eu.Gid)}
		for _, g := range eu.Sgids {
			if g != eu.Gid {
				s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, uint32(g))
			}
		}
		return nil
	}
}

// ensureDir creates path (one level, mode 0755) under root owned by
// uid:gid unless something exists there already.
func ensureDir(root, path string, uid, gid int) error {
	p, err := fs.RootPath(root, path)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(p); err == nil || !os.IsNotExist(err) {
		return err
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return fmt.Errorf("create %s in the image: %w", path, err)
	}
	return os.Lchown(p, uid, gid)
}

// withRootAgent runs the agent (the container's process) as root, after
// withImageUser resolved the commands' user: the commands, run as that user
// by the agent, can then neither read the agent's token nor signal it.
func withRootAgent(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	s.Process.User = specs.User{UID: 0, GID: 0}
	return nil
}
