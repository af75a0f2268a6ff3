package containerd

import (
	"context"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// diskEnforcement names who enforces a sandbox's disk limit. containerd
// 1.6's snapshotters take no size when a snapshot is prepared (overlayfs
// has no project-quota support there; native, btrfs and zfs take no size
// label either), so a limit is always berth's: the lease manager measures
// Usage and acts past the limit.
func diskEnforcement(bytes int64) string {
	if bytes <= 0 {
		return runtime.DiskEnforcementNone
	}
	return runtime.DiskEnforcementBerth
}

// Usage returns the size of the sandbox's writable snapshot as the
// snapshotter reports it (overlayfs walks the snapshot's upper directory,
// so it costs in proportion to how many files were written), plus the size
// of the workspace volumes it mounts read-write (host paths not counted).
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	if id == "" {
		return runtime.Usage{}, errdefs.InvalidArgument("id", "container id is required")
	}
	ctx = r.withNS(ctx)
	c, err := r.getManaged(ctx, id)
	if err != nil {
		return runtime.Usage{}, err
	}
	vols := r.writableVolumesSize(c) // a persistent workspace
	if c.SnapshotKey == "" {
		return runtime.Usage{DiskBytes: vols, MeasuredAt: time.Now()}, nil
	}
	sn := c.Snapshotter
	if sn == "" {
		sn = r.cfg.Snapshotter
	}
	u, err := r.cli.SnapshotService(sn).Usage(ctx, c.SnapshotKey)
	if err != nil {
		return runtime.Usage{}, r.mapErr(err, "snapshot usage", c.SnapshotKey)
	}
	return runtime.Usage{DiskBytes: u.Size + vols, MeasuredAt: time.Now()}, nil
}
