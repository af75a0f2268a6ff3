package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// containerd has no volume API, so a workspace volume is a directory under
// StateDir/volumes owned by berth:
//
//	StateDir/volumes/NAME/volume.json   {"labels": {...}, "created_at": ...}
//	StateDir/volumes/NAME/data/         bind-mounted into the sandbox
//
// volume.json carries the labels Docker would keep on the volume (managed,
// workspace, owner, conversation); a directory without it is not a
// volume and is never listed nor removed. The data directory of a new
// volume is owned by the sandbox's user (its host ids with user
// namespaces), mode 0755; unlike Docker's named volumes, the image's files
// at the target are not copied into it.

var _ runtime.VolumeManager = (*Runtime)(nil)

const (
	volumesDir     = "volumes"
	volumeMetaFile = "volume.json"
	volumeDataDir  = "data"
)

// volumeMeta is the content of volume.json.
type volumeMeta struct {
	Labels    map[string]string `json:"labels"`
	CreatedAt time.Time         `json:"created_at"`
}

// volMu serialises the creation and removal of volume directories.
var volMu sync.Mutex

// volumesRoot is the directory holding every workspace volume.
func (r *Runtime) volumesRoot() string { return filepath.Join(r.cfg.StateDir, volumesDir) }

// volumeData is the directory a volume's sandbox mounts.
func (r *Runtime) volumeData(name string) string {
	return filepath.Join(r.volumesRoot(), name, volumeDataDir)
}

// volumeMounts converts a Spec's mounts into OCI bind mounts, parents
// first: a volume binds its data directory, a host path itself.
func (r *Runtime) volumeMounts(ms []runtime.Mount) []specs.Mount {
	out := make([]specs.Mount, 0, len(ms))
	for _, m := range runtime.SortMounts(ms) {
		src := m.Source
		if m.Type == runtime.MountVolume {
			src = r.volumeData(m.Source)
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		out = append(out, specs.Mount{Type: "bind", Source: src, Destination: m.Target,
			Options: []string{"rbind", "rprivate", "nosuid", "nodev", mode}})
	}
	return out
}

// withVolumes creates the volumes of ms that do not exist yet, their data
// directory owned by the commands' user: it runs after withImageUser set
// the process user (and before withRootAgent resets it to root). hostBase
// is the host id of the sandbox's root (user namespaces).
func (r *Runtime) withVolumes(ms []runtime.Mount, hostBase int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		for _, m := range ms {
			if m.Type != runtime.MountVolume {
				continue
			}
			uid, gid := hostBase+int(s.Process.User.UID), hostBase+int(s.Process.User.GID)
			if err := r.ensureVolume(m.Source, m.VolumeLabels, uid, gid); err != nil {
				return &userError{err}
			}
		}
		return nil
	}
}

// ensureVolume creates volume name (labels plus runtime.LabelManaged)
// unless it exists; a directory of that name that is not a volume is
// FailedPrecondition.
func (r *Runtime) ensureVolume(name string, labels map[string]string, uid, gid int) error {
	volMu.Lock()
	defer volMu.Unlock()
	dir := filepath.Join(r.volumesRoot(), name)
	if _, err := readVolumeMeta(dir); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("containerd: volume %s: %w", name, err)
	}
	if _, err := os.Lstat(dir); err == nil {
		if ents, _ := os.ReadDir(dir); len(ents) > 0 {
			return errdefs.FailedPrecondition("containerd: %s exists but is not a berth volume (no %s)", dir, volumeMetaFile)
		}
	}
	data := filepath.Join(dir, volumeDataDir)
	if err := os.MkdirAll(data, 0o755); err != nil {
		return fmt.Errorf("containerd: create volume %s: %w", name, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("containerd: create volume %s: %w", name, err)
	}
	if err := os.Lchown(data, uid, gid); err != nil {
		return fmt.Errorf("containerd: create volume %s: %w", name, err)
	}
	l := maps.Clone(labels)
	if l == nil {
		l = map[string]string{}
	}
	l[runtime.LabelManaged] = "true"
	b, err := json.Marshal(volumeMeta{Labels: l, CreatedAt: time.Now().UTC()})
	if err != nil {
		return err
	}
	// Written last and atomically: its presence means the volume is whole.
	tmp := filepath.Join(dir, volumeMetaFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("containerd: create volume %s: %w", name, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, volumeMetaFile)); err != nil {
		return fmt.Errorf("containerd: create volume %s: %w", name, err)
	}
	r.log.Info("created workspace volume", "volume", name, "conversation_id", l[runtime.LabelConversation])
	return nil
}

// readVolumeMeta reads dir's volume.json.
func readVolumeMeta(dir string) (volumeMeta, error) {
	var m volumeMeta
	b, err := os.ReadFile(filepath.Join(dir, volumeMetaFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%s: %w", volumeMetaFile, err)
	}
	return m, nil
}

// ListVolumes implements runtime.VolumeManager: the workspace volumes under
// StateDir/volumes whose labels match sel (sizes not measured: -1).
func (r *Runtime) ListVolumes(_ context.Context, sel runtime.Selector) ([]runtime.Volume, error) {
	ents, err := os.ReadDir(r.volumesRoot())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("containerd: list volumes: %w", err)
	}
	var out []runtime.Volume
	for _, e := range ents {
		if !e.IsDir() || !runtime.ValidVolumeName(e.Name()) {
			continue
		}
		m, err := readVolumeMeta(filepath.Join(r.volumesRoot(), e.Name()))
		if err != nil || !runtime.IsWorkspaceVolume(m.Labels) || !sel.Matches(m.Labels) {
			continue
		}
		out = append(out, toVolume(e.Name(), m, -1))
	}
	return out, nil
}

// InspectVolume implements runtime.VolumeManager, measuring the size of
// the volume's files.
func (r *Runtime) InspectVolume(_ context.Context, name string) (runtime.Volume, error) {
	m, err := r.workspaceVolume(name)
	if err != nil {
		return runtime.Volume{}, err
	}
	size, err := runtime.DirSize(r.volumeData(name))
	if err != nil {
		size = -1
	}
	return toVolume(name, m, size), nil
}

// RemoveVolume implements runtime.VolumeManager. A volume a container of
// berth's namespace still mounts is FailedPrecondition.
func (r *Runtime) RemoveVolume(ctx context.Context, name string) error {
	if _, err := r.workspaceVolume(name); err != nil {
		if errdefs.IsNotFound(err) {
			if _, serr := os.Lstat(filepath.Join(r.volumesRoot(), name)); errors.Is(serr, fs.ErrNotExist) {
				return nil // gone already
			}
		}
		return err
	}
	if id, err := r.volumeUser(r.withNS(ctx), name); err != nil {
		return err
	} else if id != "" {
		return errdefs.FailedPrecondition("containerd: volume %s is in use by sandbox %s", name, id)
	}
	volMu.Lock()
	defer volMu.Unlock()
	dir := filepath.Join(r.volumesRoot(), name)
	// The metadata goes first: a removal cut short leaves no half volume
	// that looks whole.
	if err := os.Remove(filepath.Join(dir, volumeMetaFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("containerd: remove volume %s: %w", name, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("containerd: remove volume %s: %w", name, err)
	}
	r.log.Info("removed workspace volume", "volume", name)
	return nil
}

// workspaceVolume reads a workspace volume's metadata; anything else is
// NotFound.
func (r *Runtime) workspaceVolume(name string) (volumeMeta, error) {
	if !runtime.ValidVolumeName(name) {
		return volumeMeta{}, errdefs.InvalidArgument("name", "%q is not a volume name", name)
	}
	m, err := readVolumeMeta(filepath.Join(r.volumesRoot(), name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return m, errdefs.NotFound("containerd: volume %s not found", name)
		}
		return m, fmt.Errorf("containerd: volume %s: %w", name, err)
	}
	if !runtime.IsWorkspaceVolume(m.Labels) {
		return m, errdefs.NotFound("containerd: volume %s is not a berth workspace volume", name)
	}
	return m, nil
}

// volumeUser returns the id of a container whose spec mounts volume name,
// or "".
func (r *Runtime) volumeUser(ctx context.Context, name string) (string, error) {
	cs, err := r.cli.ContainerService().List(ctx)
	if err != nil {
		return "", r.mapErr(err, "list containers", "")
	}
	data := r.volumeData(name)
	for _, c := range cs {
		for _, m := range specMounts(c) {
			if m.Source == data {
				return c.ID, nil
			}
		}
	}
	return "", nil
}

// specMounts returns the mounts of c's OCI spec (none when it cannot be
// read).
func specMounts(c containers.Container) []specs.Mount {
	if c.Spec == nil {
		return nil
	}
	var s specs.Spec
	if err := json.Unmarshal(c.Spec.GetValue(), &s); err != nil {
		return nil
	}
	return s.Mounts
}

// writableVolumesSize is the size of the workspace volumes c mounts
// read-write (part of its Usage).
func (r *Runtime) writableVolumesSize(c containers.Container) int64 {
	var total int64
	root := r.volumesRoot() + string(filepath.Separator)
	for _, m := range specMounts(c) {
		if !strings.HasPrefix(m.Source, root) {
			continue
		}
		ro := false
		for _, o := range m.Options {
			ro = ro || o == "ro"
		}
		if ro {
			continue
		}
		if n, err := runtime.DirSize(m.Source); err == nil {
			total += n
		}
	}
	return total
}

// toVolume converts a volume's metadata.
func toVolume(name string, m volumeMeta, size int64) runtime.Volume {
	v := runtime.Volume{Name: name, CreatedAt: m.CreatedAt, SizeBytes: size}
	v.SetLabels(m.Labels)
	return v
}
