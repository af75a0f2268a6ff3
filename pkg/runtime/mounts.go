package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// MountType says what a Mount mounts.
type MountType string

// Mount types.
const (
	// MountVolume mounts a berth-managed volume (Mount.Source is its name),
	// created by the backend when it does not exist yet.
	MountVolume MountType = "volume"
	// MountBind bind-mounts a host directory or file (Mount.Source is its
	// absolute, symlink-free host path). The backend does not check it
	// against any policy: the lease manager does (HostMountPolicy) before
	// the Spec is built.
	MountBind MountType = "bind"
)

// Labels of the volumes berth creates for persistent workspaces (besides
// LabelManaged=true and LabelConversation). The agent volume of the Docker
// backend is managed too, but has no LabelVolume, so it is never listed.
const (
	// LabelVolume marks a workspace volume; its value is VolumeKindWorkspace.
	LabelVolume = "dev.berth.volume"
	// LabelOwner is the owner of the conversation a volume belongs to.
	LabelOwner = "dev.berth.owner"
	// VolumeKindWorkspace is LabelVolume's value on workspace volumes.
	VolumeKindWorkspace = "workspace"
)

// MaxMounts bounds Spec.Mounts.
const MaxMounts = 16

// Mount is one mount of a sandbox (Spec.Mounts).
type Mount struct {
	// Type is MountVolume or MountBind.
	Type MountType `json:"type"`
	// Source is the volume's name (MountVolume) or the absolute host path
	// (MountBind).
	Source string `json:"source"`
	// Target is the absolute path inside the sandbox.
	Target string `json:"target"`
	// ReadOnly mounts it read-only.
	ReadOnly bool `json:"read_only,omitempty"`
	// VolumeLabels are the labels of a MountVolume's volume when the
	// backend creates it (LabelManaged=true is always added); an existing
	// volume keeps its own. Ignored for MountBind.
	VolumeLabels map[string]string `json:"volume_labels,omitempty"`
	// Pin is the identity of the host file or directory a MountBind's
	// Source named when HostMountPolicy.Pin checked it (at acquire):
	// HostMountPolicy.Verify compares it before every later bind of Source
	// (an in-place restart, a resume from hibernate). Zero when not
	// recorded (a lease written by an older berth); backends ignore it.
	Pin FileID `json:"pin,omitzero"`
}

// FileID identifies a host file: its device and inode numbers. It is
// written as the text "dev:ino" (JSON stores that hold numbers as int64 or
// float64 keep it whole).
type FileID struct {
	Dev uint64
	Ino uint64
}

// String is "dev:ino".
func (id FileID) String() string { return fmt.Sprintf("%d:%d", id.Dev, id.Ino) }

// MarshalText writes "dev:ino".
func (id FileID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText reads "dev:ino".
func (id *FileID) UnmarshalText(b []byte) error {
	dev, ino, ok := strings.Cut(string(b), ":")
	var err1, err2 error
	id.Dev, err1 = strconv.ParseUint(dev, 10, 64)
	id.Ino, err2 = strconv.ParseUint(ino, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("file id %q: want DEV:INO", b)
	}
	return nil
}

// volumeNameRE is the syntax of a volume name (Docker's, which containerd's
// directory names also satisfy).
var volumeNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)

// ValidVolumeName reports whether name is an acceptable volume name:
// 1-128 characters of letters, digits, '_', '.', '-', starting with a
// letter or digit.
func ValidVolumeName(name string) bool { return volumeNameRE.MatchString(name) }

// reservedTargets may not be mount targets: the agent's directory, the
// kernel filesystems and the files the backends manage themselves.
var reservedTargets = []string{AgentDir, "/proc", "/sys", "/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}

// ValidateMounts checks mounts (Spec.Mounts); field names the field in
// errors ("mounts"). Errors are errdefs.ErrInvalidArgument naming the
// mount's index and the bad value.
func ValidateMounts(field string, mounts []Mount) error {
	if len(mounts) > MaxMounts {
		return errdefs.InvalidArgument(field, "%d mounts, at most %d", len(mounts), MaxMounts)
	}
	seen := map[string]bool{}
	for i, m := range mounts {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := ValidTarget(f+".target", m.Target); err != nil {
			return err
		}
		if seen[m.Target] {
			return errdefs.InvalidArgument(f+".target", "%s is mounted twice", m.Target)
		}
		seen[m.Target] = true
		switch m.Type {
		case MountVolume:
			if !ValidVolumeName(m.Source) {
				return errdefs.InvalidArgument(f+".source", "%q is not a volume name (1-128 of [a-zA-Z0-9_.-], starting with a letter or digit)", m.Source)
			}
		case MountBind:
			if !filepath.IsAbs(m.Source) || filepath.Clean(m.Source) != m.Source {
				return errdefs.InvalidArgument(f+".host_path", "%q must be an absolute, clean path", m.Source)
			}
			if strings.ContainsAny(m.Source, ",:\x00") {
				return errdefs.InvalidArgument(f+".host_path", "%q may not contain ',', ':' or NUL", m.Source)
			}
		default:
			return errdefs.InvalidArgument(f+".type", "unknown mount type %q (want volume or bind)", string(m.Type))
		}
	}
	return nil
}

// ValidTarget checks a mount target: an absolute, clean path, not "/", not
// one of the paths berth reserves (/.berth, /proc, /sys, /dev, /etc/hosts,
// /etc/hostname, /etc/resolv.conf) nor under them.
func ValidTarget(field, target string) error {
	switch {
	case target == "":
		return errdefs.InvalidArgument(field, "required")
	case !strings.HasPrefix(target, "/") || filepath.Clean(target) != target:
		return errdefs.InvalidArgument(field, "%q must be an absolute, clean path", target)
	case target == "/":
		return errdefs.InvalidArgument(field, "may not be /")
	case len(target) > 4096 || strings.ContainsAny(target, ",:\x00"):
		return errdefs.InvalidArgument(field, "%q may not contain ',', ':' or NUL", target)
	}
	for _, r := range reservedTargets {
		if target == r || strings.HasPrefix(target, r+"/") {
			return errdefs.InvalidArgument(field, "%s is reserved by berth", target)
		}
	}
	return nil
}

// SortMounts returns mounts ordered so that a parent target comes before
// the targets under it (the order an OCI runtime must mount them in).
func SortMounts(mounts []Mount) []Mount {
	out := slices.Clone(mounts)
	slices.SortStableFunc(out, func(a, b Mount) int {
		return strings.Count(a.Target, "/") - strings.Count(b.Target, "/")
	})
	return out
}

// HostMountPrefix is a host directory under which acquires may mount host
// paths.
type HostMountPrefix struct {
	// Path is an absolute host path.
	Path string
	// ReadOnly allows only read-only mounts under Path.
	ReadOnly bool
}

// String is the prefix in the form ParseHostMountPolicy reads ("/data:ro").
func (p HostMountPrefix) String() string {
	if p.ReadOnly {
		return p.Path + ":ro"
	}
	return p.Path + ":rw"
}

// HostMountPolicy is the host directories an operator allows acquires to
// mount. The zero value allows none.
type HostMountPolicy []HostMountPrefix

// ParseHostMountPolicy parses "PATH[:ro|:rw],..." ("/srv/projects:rw,/data:ro";
// a prefix without a mode is read-only). Paths must be absolute; they are
// cleaned. "" is the empty policy (nothing allowed).
func ParseHostMountPolicy(s string) (HostMountPolicy, error) {
	var p HostMountPolicy
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		path, mode := part, "ro"
		if i := strings.LastIndex(part, ":"); i >= 0 {
			path, mode = part[:i], part[i+1:]
		}
		if mode != "ro" && mode != "rw" {
			return nil, errdefs.InvalidArgument("allow_host_mount", "%q: mode %q is not ro or rw", part, mode)
		}
		if !filepath.IsAbs(path) {
			return nil, errdefs.InvalidArgument("allow_host_mount", "%q: the path must be absolute", part)
		}
		p = append(p, HostMountPrefix{Path: filepath.Clean(path), ReadOnly: mode == "ro"})
	}
	return p, nil
}

// String is the policy in the form ParseHostMountPolicy reads.
func (p HostMountPolicy) String() string {
	parts := make([]string, len(p))
	for i, x := range p {
		parts[i] = x.String()
	}
	return strings.Join(parts, ",")
}

// Resolve checks that hostPath may be mounted (read-only when readOnly) and
// returns the path to bind: Pin with the prefixes' own symlinks resolved
// first (Resolved), without the FileID. The lease manager uses Pin, with
// the policy resolved once at its start, and Verify.
func (p HostMountPolicy) Resolve(field, hostPath string, readOnly bool) (string, error) {
	resolved, _, err := p.Resolved().Pin(field, hostPath, readOnly)
	return resolved, err
}

// under reports whether path is dir or lies under it (both clean).
func under(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

// Volume is a berth-managed workspace volume as a backend reports it.
type Volume struct {
	// Name is the volume's name.
	Name string
	// Labels are all its labels (LabelManaged, LabelVolume, LabelOwner,
	// LabelConversation).
	Labels map[string]string
	// Owner and ConversationID are read back from the labels.
	Owner          string
	ConversationID string
	// CreatedAt is when the backend created it.
	CreatedAt time.Time
	// SizeBytes is the size of its files; -1 when it was not measured
	// (List does not measure; Inspect does).
	SizeBytes int64
}

// VolumeManager is the optional part of a Runtime that manages workspace
// volumes (Mount of type MountVolume). Docker implements it with named
// volumes, containerd with directories under a berth-owned root. Callers
// type-assert: rt.(runtime.VolumeManager).
type VolumeManager interface {
	// ListVolumes returns the workspace volumes (LabelVolume set) whose
	// labels match sel, without measuring their size (SizeBytes -1).
	ListVolumes(ctx context.Context, sel Selector) ([]Volume, error)
	// InspectVolume returns one workspace volume with its size measured;
	// errdefs.ErrNotFound when there is none (or it is not berth's).
	InspectVolume(ctx context.Context, name string) (Volume, error)
	// RemoveVolume removes a workspace volume and its files; a missing one
	// is success. A volume a sandbox still mounts is FailedPrecondition
	// where the backend can tell (Docker); the lease manager checks its
	// leases first on every backend.
	RemoveVolume(ctx context.Context, name string) error
}

// VolumeLabels returns the labels of the workspace volume of owner's
// conversation.
func VolumeLabels(owner, conversationID string) map[string]string {
	return map[string]string{
		LabelManaged:      "true",
		LabelVolume:       VolumeKindWorkspace,
		LabelOwner:        owner,
		LabelConversation: conversationID,
	}
}

// SetLabels sets v.Labels to labels and reads the owner and conversation
// back from them.
func (v *Volume) SetLabels(labels map[string]string) {
	v.Labels = labels
	v.Owner = labels[LabelOwner]
	v.ConversationID = labels[LabelConversation]
}

// IsWorkspaceVolume reports whether labels mark a berth workspace volume.
func IsWorkspaceVolume(labels map[string]string) bool {
	return IsManaged(labels) && labels[LabelVolume] == VolumeKindWorkspace
}

// DirSize returns the apparent size of the regular files under dir
// (hard links counted once). Backends measure a volume's directory with it
// when they can read it.
func DirSize(dir string) (int64, error) {
	var total int64
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += info.Size()
		return nil
	})
	return total, err
}
