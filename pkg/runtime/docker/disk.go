package docker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// noSizeDrivers are storage drivers that never honour HostConfig.StorageOpt
// "size": with them the engine refuses any create that sets it, so berth
// does not try.
var noSizeDrivers = map[string]bool{
	"fuse-overlayfs": true,
	"vfs":            true,
	"aufs":           true,
	"overlay":        true,
}

// diskMode is the cached answer to "does the engine bound a container's
// writable layer?".
type diskMode int

const (
	diskUnknown diskMode = iota // not asked yet, or to be found out by trying
	diskEngine                  // StorageOpt size works
	diskBerth                   // it does not: berth measures and enforces
)

// diskProbe caches the engine's storage-driver capability.
type diskProbe struct {
	mu     sync.Mutex
	mode   diskMode
	driver string
	asked  bool // Info answered (mode may still be diskUnknown: try at create)
}

// diskMode returns how a disk limit would be enforced on this engine. For a
// driver known not to support a size (fuse-overlayfs, vfs, ...) it answers
// diskBerth from `docker info` alone; for the others (overlay2, btrfs, zfs,
// devicemapper, ...) support depends on the backing filesystem and its mount
// options (overlay2 needs xfs with pquota), so it answers diskUnknown until
// the first create with a size has shown whether the engine accepts it.
func (r *Runtime) diskMode(ctx context.Context) diskMode {
	p := &r.disk
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode != diskUnknown || p.asked {
		return p.mode
	}
	info, err := r.cli.Info(ctx)
	if err != nil {
		// Try the size at create; its answer is cached instead.
		r.log.Debug("docker info failed; the disk limit's enforcement is found out at create", "err", err)
		return diskUnknown
	}
	p.asked, p.driver = true, info.Driver
	if noSizeDrivers[info.Driver] {
		p.mode = diskBerth
		r.log.Info("storage driver cannot bound a container's size; berth enforces disk limits", "driver", info.Driver)
	}
	return p.mode
}

// learnDisk records the outcome of a create that set StorageOpt size.
func (r *Runtime) learnDisk(m diskMode, why string) {
	p := &r.disk
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == m {
		return
	}
	p.mode = m
	if m == diskBerth {
		r.log.Info("the engine refused a size for the writable layer; berth enforces disk limits", "driver", p.driver, "detail", why)
	} else {
		r.log.Info("the engine bounds the writable layer (StorageOpt size)", "driver", p.driver)
	}
}

// storageOptRefused reports whether a create error is the engine refusing
// StorageOpt ("--storage-opt is not supported", "--storage-opt is supported
// only for overlay over xfs with 'pquota' mount option", ...).
func storageOptRefused(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "storage-opt")
}

// setDiskLimit puts the size on hc when the engine is to enforce it.
func setDiskLimit(hc *container.HostConfig, bytes int64) {
	if bytes > 0 {
		hc.StorageOpt = map[string]string{"size": strconv.FormatInt(bytes, 10)}
	}
}

// diskEnforcement names the enforcement of a sandbox whose limit is bytes.
func diskEnforcement(bytes int64, engine bool) string {
	switch {
	case bytes <= 0:
		return runtime.DiskEnforcementNone
	case engine:
		return runtime.DiskEnforcementEngine
	default:
		return runtime.DiskEnforcementBerth
	}
}

// Usage returns the size of the sandbox's writable layer, plus the size of
// the volumes it mounts read-write (a persistent workspace; the agent
// volume is read-only, host bind mounts are the operator's and not
// counted). With InjectCopy the agent binary berth copied into the layer
// is not counted.
//
// Where the layer's upper directory (the engine's GraphDriver UpperDir:
// overlay2, fuse-overlayfs) is readable on this host, Usage sums its files
// itself (upperDirSize), as the engine's overlay2 driver does; elsewhere
// (an engine on another host, another driver) it asks the engine
// (ContainerInspect with size). The engine's fuse-overlayfs driver has no
// such shortcut: it compares the whole mounted root filesystem with the
// image's, file by file through FUSE (2.5 s for a fresh berth/base
// sandbox on the test machines, and half a core under load with 20 leases:
// docs/benchmarks.md).
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	r.negotiate(ctx)
	if id == "" {
		return runtime.Usage{}, errdefs.InvalidArgument("id", "container id is required")
	}
	ins, _, err := r.cli.ContainerInspectWithRaw(ctx, id, false)
	if err != nil {
		return runtime.Usage{}, r.mapErr(err, "inspect container", id)
	}
	if err := runtime.CheckManaged("docker", id, labelsOf(ins)); err != nil {
		return runtime.Usage{}, err
	}
	u := runtime.Usage{MeasuredAt: time.Now()}
	if n, ok := upperDirSize(ins); ok {
		u.DiskBytes = n
	} else {
		ins, _, err = r.cli.ContainerInspectWithRaw(ctx, id, true)
		if err != nil {
			return runtime.Usage{}, r.mapErr(err, "inspect container size", id)
		}
		if ins.ContainerJSONBase != nil && ins.SizeRw != nil {
			u.DiskBytes = *ins.SizeRw
		}
	}
	if r.cfg.Injection == InjectCopy {
		u.DiskBytes = max(0, u.DiskBytes-r.agentSize)
	}
	u.DiskBytes += r.writableVolumesSize(ctx, ins.Mounts)
	return u, nil
}

// upperDirSize sums the regular files of a container's writable layer
// from its upper directory, when the engine reports one and it is a
// readable directory here; ok is false otherwise (the engine then
// measures). Deletions of image files (whiteouts: character devices or
// .wh. files of size 0) count nothing, a file changed from the image
// counts whole (it was copied up), hard links once: what the engine
// reports as SizeRw.
func upperDirSize(ins container.InspectResponse) (n int64, ok bool) {
	if ins.ContainerJSONBase == nil {
		return 0, false
	}
	upper := ins.GraphDriver.Data["UpperDir"]
	if upper == "" || !filepath.IsAbs(upper) {
		return 0, false
	}
	if st, err := os.Stat(upper); err != nil || !st.IsDir() {
		return 0, false
	}
	n, err := runtime.DirSize(upper)
	if err != nil {
		return 0, false
	}
	return n, true
}
