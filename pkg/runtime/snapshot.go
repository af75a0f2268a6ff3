package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"time"

	"github.com/distribution/reference"

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

// SnapshotRef is the image reference of the snapshot stored under tag
// (SnapshotImage.Tag) in SnapshotRepository.
func SnapshotRef(tag string) string { return SnapshotRepository + ":" + tag }

// snapshotTagPrefix bounds the part of a snapshot's name its tag repeats.
const snapshotTagPrefix = 64

// SnapshotTag is the image tag snapshot name of owner is stored under on
// orchestrator instance: at most the first 64 characters of name, '-', and
// 24 hex digits of the SHA-256 of instance, owner and name. Names are per
// owner: two owners' snapshots of one name have two tags, and no owner can
// take (or learn about) another's tag by naming a snapshot. The tag is no
// capability: an acquire naming it opens nothing (ParseImageRef, and the
// fork path looks names up by owner).
func SnapshotTag(instance, owner, name string) string {
	h := sha256.Sum256([]byte(instance + "\x00" + owner + "\x00" + name))
	prefix := name
	if len(prefix) > snapshotTagPrefix {
		prefix = prefix[:snapshotTagPrefix]
	}
	return prefix + "-" + hex.EncodeToString(h[:12])
}

// SnapshotTagOf returns the tag of an image name in SnapshotRepository
// (familiar "berth/snapshot:TAG" or normalised
// "docker.io/berth/snapshot:TAG", as the engines list them) and whether it
// is one.
func SnapshotTagOf(image string) (string, bool) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil || reference.Domain(named) != snapshotDomain || reference.Path(named) != SnapshotRepository {
		return "", false
	}
	tagged, ok := named.(reference.Tagged)
	if !ok {
		return "", false
	}
	if _, digested := named.(reference.Digested); digested {
		return "", false
	}
	return tagged.Tag(), true
}

// SnapshotOptions says how to store a snapshot.
type SnapshotOptions struct {
	// Name is the snapshot's name (ValidSnapshotName); required.
	Name string
	// Tag is the image tag it is stored under in SnapshotRepository
	// (SnapshotTag; ValidSnapshotName); "" stores it under Name. An
	// existing snapshot of that tag is errdefs.ErrAlreadyExists.
	Tag string
	// Labels are added to the image's labels; the caller sets the
	// LabelSnapshot* provenance labels. The backend adds LabelManaged,
	// LabelSnapshot and LabelInstance.
	Labels map[string]string
}

// SnapshotImage is a snapshot: a local image made of a sandbox's files.
type SnapshotImage struct {
	// Name is the snapshot's name (its LabelSnapshot), Tag the image tag it
	// is stored under and Ref its image reference (SnapshotRef(Tag)).
	Name, Tag, Ref string
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
// from (Spec.Image = SnapshotRef(tag)): a fork. The snapshot holds the
// sandbox's root filesystem (the image's files plus its changes) and the
// configuration of the image it ran; never the agent, its token, the
// lease's environment or secrets, nor what is mounted into the sandbox.
// Docker and containerd implement it; callers type-assert:
// rt.(runtime.Snapshotter).
type Snapshotter interface {
	// Snapshot stores sandbox id's files as snapshot opts.Name under tag
	// opts.Tag. A running sandbox is frozen while its files are read and
	// thawed after; a paused (frozen) or stopped one is left as it is. A
	// missing sandbox is NotFound, a taken tag AlreadyExists.
	Snapshot(ctx context.Context, id string, opts SnapshotOptions) (SnapshotImage, error)
	// Snapshots lists the snapshots whose labels match sel (an empty sel:
	// every berth snapshot).
	Snapshots(ctx context.Context, sel Selector) ([]SnapshotImage, error)
	// RemoveSnapshot removes the snapshot stored under tag
	// (SnapshotImage.Tag): NotFound when there is none, FailedPrecondition
	// while a sandbox was created from it and exists.
	RemoveSnapshot(ctx context.Context, tag string) error
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

// ValidSnapshotOptions checks opts' name and tag (errdefs.ErrInvalidArgument
// naming "name" or "tag").
func ValidSnapshotOptions(opts SnapshotOptions) error {
	if err := ValidSnapshotName("name", opts.Name); err != nil {
		return err
	}
	if opts.Tag != "" {
		return ValidSnapshotName("tag", opts.Tag)
	}
	return nil
}

// Tagged returns opts.Tag, or opts.Name when it is empty.
func (o SnapshotOptions) Tagged() string {
	if o.Tag != "" {
		return o.Tag
	}
	return o.Name
}
