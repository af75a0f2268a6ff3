package containerd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	ctd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/rootfs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	specsgo "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

var _ runtime.Snapshotter = (*Runtime)(nil)

// snapMu makes one Snapshot at a time (a name is checked, then taken).
var snapMu sync.Mutex

// Snapshot stores sandbox id's files as the image
// runtime.SnapshotRef(opts.Tagged()): the diff service compares the sandbox's
// active snapshot with its parent (the image's files) into a new layer in
// the content store; a configuration (the image's, with the layer and the
// snapshot's labels added) and a manifest (the image's layers plus the new
// one) are written beside it and named by an image record, which is then
// unpacked: the new layer is committed into the snapshotter on top of the
// image's snapshots, ready for forks. The agent, its token and the host
// files are bind mounts, never in the active snapshot; the configuration is
// the image's, without the sandbox's environment. A running sandbox's task
// is frozen while its files are compared and thawed after. Sandboxes with
// user namespaces (files owned by remapped ids) are FailedPrecondition.
func (r *Runtime) Snapshot(ctx context.Context, id string, opts runtime.SnapshotOptions) (runtime.SnapshotImage, error) {
	ctx = r.withNS(ctx)
	if err := runtime.ValidSnapshotOptions(opts); err != nil {
		return runtime.SnapshotImage{}, err
	}
	tag := opts.Tagged()
	if r.cfg.UserNamespaces {
		return runtime.SnapshotImage{}, errdefs.FailedPrecondition("containerd: snapshots are not supported with user namespaces (the sandbox's files are owned by remapped ids)")
	}
	ref := runtime.SnapshotRef(tag)
	name, err := normalizeRef(ref)
	if err != nil {
		return runtime.SnapshotImage{}, err
	}
	snapMu.Lock()
	defer snapMu.Unlock()
	c, err := r.getManaged(ctx, id)
	if err != nil {
		return runtime.SnapshotImage{}, err
	}
	if _, err := r.cli.ImageService().Get(ctx, name); err == nil {
		return runtime.SnapshotImage{}, errdefs.AlreadyExists("snapshot %s (tag %s)", opts.Name, tag)
	} else if mapped := r.mapErr(err, "get image", name); !errdefs.IsNotFound(mapped) {
		return runtime.SnapshotImage{}, mapped
	}
	src, err := r.cli.ImageService().Get(ctx, c.Image)
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "get image", c.Image)
	}
	cs := r.cli.ContentStore()
	mf, err := images.Manifest(ctx, cs, src.Target, platforms.Default())
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "read manifest of image", c.Image)
	}
	var cfg ocispec.Image
	b, err := content.ReadBlob(ctx, cs, mf.Config)
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "read configuration of image", c.Image)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return runtime.SnapshotImage{}, fmt.Errorf("containerd: decode configuration of image %s: %w", c.Image, err)
	}

	// The content written below is held by a lease until the image record
	// references it (the garbage collector could take it before).
	lctx, done, err := r.cli.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "create lease", "")
	}
	defer func() {
		cctx, cancel := runtime.Detached(ctx)
		defer cancel()
		_ = done(cctx)
	}()
	layer, err := r.diffSandbox(lctx, id, c)
	if err != nil {
		return runtime.SnapshotImage{}, err
	}

	now := time.Now().UTC()
	labels := runtime.SnapshotLabels(opts, r.cfg.InstanceID)
	cfg.Created = &now
	cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, layer.Digest) // uncompressed: digest = diff id
	cfg.History = append(cfg.History, ocispec.History{Created: &now, CreatedBy: "berth snapshot " + opts.Name})
	if cfg.Config.Labels == nil {
		cfg.Config.Labels = map[string]string{}
	}
	for k, v := range labels {
		cfg.Config.Labels[k] = v
	}
	cfgDesc, err := writeJSON(lctx, cs, ocispec.MediaTypeImageConfig, "berth-snapshot-config-"+tag, cfg, nil)
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "write configuration of snapshot", opts.Name)
	}
	newMf := ocispec.Manifest{
		Versioned: specsgo.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    cfgDesc,
		Layers:    append(append([]ocispec.Descriptor(nil), mf.Layers...), layer),
	}
	gc := map[string]string{"containerd.io/gc.ref.content.config": cfgDesc.Digest.String()}
	for i, l := range newMf.Layers {
		gc[fmt.Sprintf("containerd.io/gc.ref.content.l.%d", i)] = l.Digest.String()
	}
	mfDesc, err := writeJSON(lctx, cs, ocispec.MediaTypeImageManifest, "berth-snapshot-manifest-"+tag, newMf, gc)
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "write manifest of snapshot", opts.Name)
	}
	meta, err := r.cli.ImageService().Create(lctx, images.Image{Name: name, Target: mfDesc, Labels: labels, CreatedAt: now, UpdatedAt: now})
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "create image", name)
	}
	if err := ctd.NewImage(r.cli, meta).Unpack(lctx, r.cfg.Snapshotter); err != nil {
		cctx, cancel := runtime.Detached(ctx)
		defer cancel()
		_ = r.cli.ImageService().Delete(cctx, name)
		return runtime.SnapshotImage{}, r.mapErr(err, "unpack snapshot", opts.Name)
	}
	return runtime.SnapshotImage{Name: opts.Name, Tag: tag, Ref: ref, ID: cfgDesc.Digest.String(), Size: layer.Size, CreatedAt: now, Labels: labels}, nil
}

// diffSandbox writes the difference between container c's files and its
// image's as an uncompressed layer into the content store; a running task
// is frozen meanwhile.
func (r *Runtime) diffSandbox(ctx context.Context, id string, c containers.Container) (ocispec.Descriptor, error) {
	proc, err := r.taskProcess(ctx, id)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if proc != nil && proc.GetStatus() == tasktypes.Status_RUNNING {
		if err := r.Pause(ctx, id); err != nil {
			return ocispec.Descriptor{}, err
		}
		defer func() {
			cctx, cancel := runtime.Detached(ctx)
			defer cancel()
			if err := r.Resume(cctx, id); err != nil {
				r.log.Warn("thawing a sandbox after its snapshot failed", "container_id", id, "err", err)
			}
		}()
	}
	sn := r.cli.SnapshotService(c.Snapshotter)
	layer, err := rootfs.CreateDiff(ctx, c.SnapshotKey, sn, r.cli.DiffService(),
		diff.WithMediaType(ocispec.MediaTypeImageLayer), diff.WithReference("berth-snapshot-layer-"+id))
	if err != nil {
		return ocispec.Descriptor{}, r.mapErr(err, "diff the files of", id)
	}
	return layer, nil
}

// writeJSON writes v as a blob of mediaType with labels into the content
// store and returns its descriptor.
func writeJSON(ctx context.Context, cs content.Store, mediaType, ref string, v any, labels map[string]string) (ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	var opts []content.Opt
	if labels != nil {
		opts = append(opts, content.WithLabels(labels))
	}
	return desc, content.WriteBlob(ctx, cs, ref, bytes.NewReader(b), desc, opts...)
}

// snapshotFilter selects berth's snapshot images.
var snapshotFilter = `labels."` + runtime.LabelSnapshot + `"`

// Snapshots lists the berth snapshots whose labels match sel.
func (r *Runtime) Snapshots(ctx context.Context, sel runtime.Selector) ([]runtime.SnapshotImage, error) {
	ctx = r.withNS(ctx)
	list, err := r.cli.ImageService().List(ctx, snapshotFilter)
	if err != nil {
		return nil, r.mapErr(err, "list images", "")
	}
	cs := r.cli.ContentStore()
	var out []runtime.SnapshotImage
	for _, m := range list {
		tag, ok := runtime.SnapshotTagOf(m.Name)
		if !runtime.IsManaged(m.Labels) || !sel.Matches(m.Labels) || !ok {
			continue
		}
		s := runtime.SnapshotImage{Name: m.Labels[runtime.LabelSnapshot], Tag: tag, Ref: runtime.SnapshotRef(tag), CreatedAt: m.CreatedAt, Labels: m.Labels}
		if mf, err := images.Manifest(ctx, cs, m.Target, platforms.Default()); err == nil {
			s.ID = mf.Config.Digest.String()
			if n := len(mf.Layers); n > 0 {
				s.Size = mf.Layers[n-1].Size
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveSnapshot removes the snapshot image stored under tag (its content
// and snapshots are garbage-collected once nothing uses them). While a
// sandbox created from it exists it is FailedPrecondition.
func (r *Runtime) RemoveSnapshot(ctx context.Context, tag string) error {
	ctx = r.withNS(ctx)
	if err := runtime.ValidSnapshotName("tag", tag); err != nil {
		return err
	}
	name := tag
	full, err := normalizeRef(runtime.SnapshotRef(tag))
	if err != nil {
		return err
	}
	m, err := r.cli.ImageService().Get(ctx, full)
	if err != nil {
		if mapped := r.mapErr(err, "get image", full); !errdefs.IsNotFound(mapped) {
			return mapped
		}
		return errdefs.NotFound("snapshot %s", name)
	}
	if !runtime.IsManaged(m.Labels) || m.Labels[runtime.LabelSnapshot] == "" {
		return errdefs.NotFound("snapshot %s", name)
	}
	users, err := r.cli.ContainerService().List(ctx, "image=="+full)
	if err != nil {
		return r.mapErr(err, "list containers", "")
	}
	if len(users) > 0 {
		ids := make([]string, 0, len(users))
		for _, c := range users {
			ids = append(ids, c.ID)
		}
		return errdefs.FailedPrecondition("snapshot %s is in use by %d sandbox(es) (%s); release the leases forked from it first", name, len(users), strings.Join(ids, ", "))
	}
	if err := r.cli.ImageService().Delete(ctx, full, images.SynchronousDelete()); err != nil {
		if mapped := r.mapErr(err, "delete image", full); !errdefs.IsNotFound(mapped) {
			return mapped
		}
		return errdefs.NotFound("snapshot %s", name)
	}
	return nil
}
