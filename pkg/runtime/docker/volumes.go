package docker

import (
	"context"
	"maps"
	"os"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

var _ runtime.VolumeManager = (*Runtime)(nil)

// engineMounts converts a Spec's mounts: a workspace volume is a named
// volume of the local driver (which copies the image's files at the
// target into it when it is empty, ownership included, so /workspace stays
// the image user's); a host path is a private bind mount.
func engineMounts(ms []runtime.Mount) []mount.Mount {
	out := make([]mount.Mount, 0, len(ms))
	for _, m := range ms {
		switch m.Type {
		case runtime.MountVolume:
			out = append(out, mount.Mount{Type: mount.TypeVolume, Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
		case runtime.MountBind:
			out = append(out, mount.Mount{Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly,
				BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate}})
		}
	}
	return out
}

// ensureVolumes creates the volumes of ms that do not exist yet, labelled
// with their VolumeLabels and runtime.LabelManaged. An existing volume of
// that name that berth did not create is FailedPrecondition: berth never
// mounts what it does not own.
func (r *Runtime) ensureVolumes(ctx context.Context, ms []runtime.Mount) error {
	for _, m := range ms {
		if m.Type != runtime.MountVolume {
			continue
		}
		v, err := r.cli.VolumeInspect(ctx, m.Source)
		if err == nil {
			if !runtime.IsManaged(v.Labels) {
				return errdefs.FailedPrecondition("docker: volume %s exists but berth did not create it (no %s=true label)", m.Source, runtime.LabelManaged)
			}
			continue
		}
		if mapped := r.mapErr(err, "inspect volume", m.Source); !errdefs.IsNotFound(mapped) {
			return mapped
		}
		labels := maps.Clone(m.VolumeLabels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[runtime.LabelManaged] = "true"
		if _, err := r.cli.VolumeCreate(ctx, volume.CreateOptions{Name: m.Source, Driver: "local", Labels: labels}); err != nil {
			return r.mapErr(err, "create volume", m.Source)
		}
		r.log.Info("created workspace volume", "volume", m.Source, "conversation_id", labels[runtime.LabelConversation])
	}
	return nil
}

// ListVolumes implements runtime.VolumeManager: the engine's volumes
// labelled runtime.LabelVolume=workspace (and managed) whose labels match
// sel. Sizes are not measured (-1).
func (r *Runtime) ListVolumes(ctx context.Context, sel runtime.Selector) ([]runtime.Volume, error) {
	r.negotiate(ctx)
	args := filters.NewArgs(
		filters.Arg("label", runtime.LabelManaged+"=true"),
		filters.Arg("label", runtime.LabelVolume+"="+runtime.VolumeKindWorkspace))
	resp, err := r.cli.VolumeList(ctx, volume.ListOptions{Filters: args})
	if err != nil {
		return nil, r.mapErr(err, "list volumes", "")
	}
	out := make([]runtime.Volume, 0, len(resp.Volumes))
	for _, v := range resp.Volumes {
		if v == nil || !runtime.IsWorkspaceVolume(v.Labels) || !sel.Matches(v.Labels) {
			continue
		}
		out = append(out, toVolume(*v, -1))
	}
	return out, nil
}

// InspectVolume implements runtime.VolumeManager. The size is measured by
// walking the volume's directory when this process can read it (the
// orchestrator runs as root beside the engine), else with the engine's
// disk-usage call; -1 when neither works.
func (r *Runtime) InspectVolume(ctx context.Context, name string) (runtime.Volume, error) {
	r.negotiate(ctx)
	v, err := r.workspaceVolume(ctx, name)
	if err != nil {
		return runtime.Volume{}, err
	}
	return toVolume(v, r.volumeSize(ctx, v.Name, v.Mountpoint)), nil
}

// RemoveVolume implements runtime.VolumeManager. A volume a container
// still mounts is FailedPrecondition (the engine refuses, never forced).
func (r *Runtime) RemoveVolume(ctx context.Context, name string) error {
	r.negotiate(ctx)
	if !runtime.ValidVolumeName(name) {
		return errdefs.InvalidArgument("name", "%q is not a volume name", name)
	}
	v, err := r.cli.VolumeInspect(ctx, name)
	if err != nil {
		mapped := r.mapErr(err, "inspect volume", name)
		if errdefs.IsNotFound(mapped) {
			return nil // gone already
		}
		return mapped
	}
	if !runtime.IsWorkspaceVolume(v.Labels) {
		return errdefs.NotFound("docker: volume %s is not a berth workspace volume", name)
	}
	if err := r.cli.VolumeRemove(ctx, name, false); err != nil {
		mapped := r.mapErr(err, "remove volume", name)
		if errdefs.IsNotFound(mapped) {
			return nil
		}
		return mapped
	}
	r.log.Info("removed workspace volume", "volume", name)
	return nil
}

// workspaceVolume inspects a volume berth created for a workspace;
// anything else is NotFound.
func (r *Runtime) workspaceVolume(ctx context.Context, name string) (volume.Volume, error) {
	if !runtime.ValidVolumeName(name) {
		return volume.Volume{}, errdefs.InvalidArgument("name", "%q is not a volume name", name)
	}
	v, err := r.cli.VolumeInspect(ctx, name)
	if err != nil {
		mapped := r.mapErr(err, "inspect volume", name)
		if errdefs.IsNotFound(mapped) {
			return volume.Volume{}, errdefs.NotFound("docker: volume %s not found", name)
		}
		return volume.Volume{}, mapped
	}
	if !runtime.IsWorkspaceVolume(v.Labels) {
		return volume.Volume{}, errdefs.NotFound("docker: volume %s is not a berth workspace volume", name)
	}
	return v, nil
}

// volumeSize measures a volume: its directory when readable here, else
// the engine's disk usage of volumes; -1 when neither works.
func (r *Runtime) volumeSize(ctx context.Context, name, mountpoint string) int64 {
	if mountpoint != "" {
		if st, err := os.Stat(mountpoint); err == nil && st.IsDir() {
			if n, err := runtime.DirSize(mountpoint); err == nil {
				return n
			}
		}
	}
	du, err := r.cli.DiskUsage(ctx, types.DiskUsageOptions{Types: []types.DiskUsageObject{types.VolumeObject}})
	if err != nil {
		return -1
	}
	for _, v := range du.Volumes {
		if v != nil && v.Name == name && v.UsageData != nil {
			return v.UsageData.Size
		}
	}
	return -1
}

// writableVolumesSize is the size of the workspace volumes a container
// mounts read-write (part of its Usage); the agent's state volume (a few
// hundred bytes of berth's own) is not one.
func (r *Runtime) writableVolumesSize(ctx context.Context, mounts []container.MountPoint) int64 {
	var total int64
	for _, mp := range mounts {
		if mp.Type != mount.TypeVolume || !mp.RW || mp.Name == "" || mp.Destination == runtime.AgentStateDir {
			continue
		}
		if n := r.volumeSize(ctx, mp.Name, mp.Source); n > 0 {
			total += n
		}
	}
	return total
}

// toVolume converts an engine volume.
func toVolume(v volume.Volume, size int64) runtime.Volume {
	out := runtime.Volume{Name: v.Name, SizeBytes: size}
	out.SetLabels(v.Labels)
	if t, err := time.Parse(time.RFC3339Nano, v.CreatedAt); err == nil {
		out.CreatedAt = t.UTC()
	}
	return out
}
