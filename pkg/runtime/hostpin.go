package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// ErrHostPathChanged is the cause of HostMountPolicy.Verify's errors: a
// host mount's source is no longer what was checked when it was allowed,
// so it is not bound again. It comes with errdefs.ErrFailedPrecondition.
var ErrHostPathChanged = errors.New("host mount changed")

// SymlinkError is a path component that is a symbolic link where
// HostMountPolicy.Pin and Verify accept none.
type SymlinkError struct {
	// Path is the path up to and including the symlink.
	Path string
}

// Error names the symlink.
func (e *SymlinkError) Error() string { return e.Path + " is a symlink" }

// Resolved returns the policy with every prefix's symlinks resolved
// (filepath.EvalSymlinks; a prefix that does not exist stays as it is).
// The lease manager resolves its policy once, when it starts: Pin and
// Verify then take the prefixes literally, so that a sandbox that can
// write to the parent of a prefix (nested prefixes) cannot move the
// prefix itself by putting a symlink in its place.
func (p HostMountPolicy) Resolved() HostMountPolicy {
	out := make(HostMountPolicy, len(p))
	for i, x := range p {
		if r, err := filepath.EvalSymlinks(x.Path); err == nil {
			x.Path = r
		}
		out[i] = x
	}
	return out
}

// Pin checks that hostPath may be mounted (read-only when readOnly) and
// returns the path to bind and the identity of the file it names. The
// path is hostPath with its symlinks and ".." resolved (a symlink a
// sandbox made under a prefix is followed, and its target must be under
// an allowed prefix too); the resolved path must equal a prefix of p (taken
// literally: see Resolved) or lie under it, the longest such prefix
// deciding whether a read-write mount is allowed. The resolved path is
// then opened component by component from "/" without following any
// symlink, which pins what was checked: a symlink swapped in since the
// resolution is refused, and the returned FileID is what Verify compares
// before every later bind. field names the field in errors.
//
// Errors name the path: errdefs.ErrInvalidArgument for a relative path or
// one that does not exist, errdefs.ErrPermissionDenied for a path outside
// every prefix, a read-write mount under a read-only prefix, or a symlink
// swapped in while it was checked.
func (p HostMountPolicy) Pin(field, hostPath string, readOnly bool) (string, FileID, error) {
	if hostPath == "" {
		return "", FileID{}, errdefs.InvalidArgument(field, "required")
	}
	if !filepath.IsAbs(hostPath) {
		return "", FileID{}, errdefs.InvalidArgument(field, "%q must be an absolute host path", hostPath)
	}
	if len(p) == 0 {
		return "", FileID{}, errdefs.PermissionDenied("%s: host path %s may not be mounted: the operator allows no host mounts (allow-host-mount)", field, hostPath)
	}
	resolved, err := filepath.EvalSymlinks(filepath.Clean(hostPath))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", FileID{}, errdefs.InvalidArgument(field, "host path %s does not exist", hostPath)
		}
		return "", FileID{}, errdefs.InvalidArgument(field, "host path %s: %v", hostPath, err)
	}
	shown := hostPath
	if resolved != hostPath {
		shown = fmt.Sprintf("%s (resolved: %s)", hostPath, resolved)
	}
	if err := p.allows(field, shown, resolved, readOnly); err != nil {
		return "", FileID{}, err
	}
	id, err := statNoFollow(resolved)
	if err != nil {
		return "", FileID{}, errdefs.PermissionDenied("%s: host path %s: %v (changed while it was checked)", field, shown, err)
	}
	return resolved, id, nil
}

// Verify checks, before host mount m (a MountBind whose Source Pin
// returned) is bound again — an in-place restart or a resume from
// hibernate, where the engine binds the path string again — that it is
// still what Pin allowed: under a prefix p allows (with m's mode), with
// no symlink in any component, and, when m.Pin is set, the same file
// (device and inode). A sandbox that can write to the parent of its
// mount's source can replace it by a symlink to anywhere on the host; the
// running bind is not affected, but the next one would follow it. Errors
// are errdefs.ErrFailedPrecondition and ErrHostPathChanged, naming field
// and the path; other mount types are not checked.
func (p HostMountPolicy) Verify(field string, m Mount) error {
	if m.Type != MountBind {
		return nil
	}
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %w: %s: host path %s %s; refusing to bind it again", errdefs.ErrFailedPrecondition, ErrHostPathChanged,
			field, m.Source, fmt.Sprintf(format, args...))
	}
	if !filepath.IsAbs(m.Source) || filepath.Clean(m.Source) != m.Source {
		return refuse("is not an absolute, clean path")
	}
	if err := p.allows(field, m.Source, m.Source, m.ReadOnly); err != nil {
		return refuse("is no longer allowed: %v", err)
	}
	id, err := statNoFollow(m.Source)
	if err != nil {
		return refuse("changed since it was allowed: %v", err)
	}
	if m.Pin != (FileID{}) && id != m.Pin {
		return refuse("changed since it was allowed: it is another file now (device:inode %s, was %s)", id, m.Pin)
	}
	return nil
}

// allows checks that real (a resolved path; shown is how errors show it)
// equals a prefix of p or lies under it, the longest such prefix allowing
// a read-write mount unless readOnly. Errors are
// errdefs.ErrPermissionDenied.
func (p HostMountPolicy) allows(field, shown, real string, readOnly bool) error {
	var best *HostMountPrefix
	for i := range p {
		if under(real, p[i].Path) && (best == nil || len(p[i].Path) > len(best.Path)) {
			best = &p[i]
		}
	}
	switch {
	case best == nil:
		return errdefs.PermissionDenied("%s: host path %s is not under a prefix the operator allows (%s)", field, shown, p)
	case best.ReadOnly && !readOnly:
		return errdefs.PermissionDenied("%s: host path %s is under %s, which the operator allows read-only; set read_only", field, shown, best.Path)
	}
	return nil
}
