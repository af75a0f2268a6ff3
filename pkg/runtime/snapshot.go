package runtime

import (
	"context"
	"regexp"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Labels on snapshot images (besides LabelManaged=true and LabelInstance).
const (
	// LabelSnapshot names the snapshot (its tag in SnapshotRepository).
	LabelSnapshot = "dev.berth.snapshot"
	// LabelSnapshotLease, LabelSnapshotConversation and LabelSnapshotOwner
	// name the lease the snapshot was taken of, its conversation and owner.
	LabelSnapshotLease        = "dev.berth.snapshot.lease"
	LabelSnapshotConversation = "dev.berth.snapshot.conversation"
	LabelSnapshotOwner        = "dev.berth.snapshot.owner"
	// LabelSnapshotImage is the image the snapshotted sandbox ran.
	LabelSnapshotImage = "dev.berth.snapshot.image"
	// LabelSnapshotUser is the user the snapshotted lease's commands ran as;
	// a fork runs as it unless it asks for another.
	LabelSnapshotUser = "dev.berth.snapshot.user"
)

// SnapshotRepository is the image repository snapshots are stored in: the
// snapshot NAME is the image SnapshotRepository:NAME (SnapshotRef).
const SnapshotRepository = "berth/snapshot"

// MaxSnapshotName bounds a snapshot's name (an image tag is at most 128
// characters).
const MaxSnapshotName = 128

var snapshotNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// ValidSnapshotName checks name: 1-128 characters of [a-z0-9_.-], starting
// with a letter or digit (a valid image tag). The error is
// errdefs.ErrInvalidArgument naming field.
func ValidSnapshotName(field, name string) error {
	if name == "" || len(name) > MaxSnapshotName || !snapshotNameRE.MatchString(name) {
		return errdefs.InvalidArgument(field, "%q is not a snapshot name (1-%d characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit)", name, MaxSnapshotName)
	}
	return nil
}

// SnapshotRef is the image reference of snapshot name.
func SnapshotRef(name string) string { return SnapshotRepository + ":" + name }

// SnapshotName returns the snapshot name an image reference names
// ("berth/snapshot:NAME", also with a docker.io/ prefix) and whether it
// names one.
func SnapshotName(ref string) (string, bool) {
	for _, p := range []string{SnapshotRepository + ":", "docker.io/" + SnapshotRepository + ":"} {
		if len(ref) > len(p) && ref[:len(p)] == p {
			return ref[len(p):], true
		}
	}
	return "", false
}

// SnapshotOptions says how to store a snapshot.
type SnapshotOptions struct {
	// Name is the snapshot's name (ValidSnapshotName); required. An
	// existing snapshot of that name is errdefs.ErrAlreadyExists.
	Name string
	// Labels are added to the image's labels; the caller sets the
	// LabelSnapshot* provenance labels. The backend adds LabelManaged,
	// LabelSnapshot and LabelInstance.
	Labels map[string]string
}

// SnapshotImage is a snapshot: a local image made of a sandbox's files.
type SnapshotImage struct {
	// Name is the snapshot's name, Ref its image reference (SnapshotRef).
	Name, Ref string
	// ID is the image id (its configuration digest).
	ID string
	// Size is the bytes the snapshot adds on top of the image the sandbox
	// ran (the layer of the sandbox's changes).
	Size int64
	// CreatedAt is when it was taken.
	CreatedAt time.Time
	// Labels are the image's labels.
	Labels map[string]string
}

// Snapshotter is the optional part of a Runtime that stores a sandbox's
// files as a local image (a snapshot) that later sandboxes can be created
// from (Spec.Image = SnapshotRef(name)): a fork. The snapshot holds the
// sandbox's root filesystem (the image's files plus its changes) and the
// configuration of the image it ran; never the agent, its token, the
// lease's environment or secrets, nor what is mounted into the sandbox.
// Docker and containerd implement it; callers type-assert:
// rt.(runtime.Snapshotter).
type Snapshotter interface {
	// Snapshot stores sandbox id's files as snapshot opts.Name. A running
	// sandbox is frozen while its files are read and thawed after; a
	// paused (frozen) or stopped one is left as it is. A missing sandbox
	// is NotFound, a taken name AlreadyExists.
	Snapshot(ctx context.Context, id string, opts SnapshotOptions) (SnapshotImage, error)
	// Snapshots lists the snapshots whose labels match sel (an empty sel:
	// every berth snapshot).
	Snapshots(ctx context.Context, sel Selector) ([]SnapshotImage, error)
	// RemoveSnapshot removes snapshot name: NotFound when there is none,
	// FailedPrecondition while a sandbox was created from it and exists.
	RemoveSnapshot(ctx context.Context, name string) error
}

// SnapshotLabels returns the labels of snapshot name of a backend
// instance: opts' labels, LabelManaged=true, LabelSnapshot and
// LabelInstance (instance) when not empty.
func SnapshotLabels(opts SnapshotOptions, instance string) map[string]string {
	labels := make(map[string]string, len(opts.Labels)+3)
	for k, v := range opts.Labels {
		labels[k] = v
	}
	labels[LabelManaged] = "true"
	labels[LabelSnapshot] = opts.Name
	if instance != "" && labels[LabelInstance] == "" {
		labels[LabelInstance] = instance
	}
	return labels
}
