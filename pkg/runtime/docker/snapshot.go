package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

var _ runtime.Snapshotter = (*Runtime)(nil)

// Snapshot commits sandbox id's files into the local image
// runtime.SnapshotRef(opts.Tagged()) (docker commit). The image's
// configuration is the one of the image the sandbox ran: the sandbox's
// entrypoint (the agent), its user (root), its labels and its environment
// (token, lease env, secrets) are not carried over — Docker merges the
// container's configuration into a commit's, so each variable and label the
// sandbox added is kept only as a key with an empty value. With InjectCopy
// the agent binary and its token file in the writable layer are emptied for
// the commit and put back right after (the sandbox stays frozen meanwhile);
// with InjectVolume the agent is on a volume, which a commit never holds.
// A running sandbox is frozen during the commit and thawed after.
func (r *Runtime) Snapshot(ctx context.Context, id string, opts runtime.SnapshotOptions) (runtime.SnapshotImage, error) {
	r.negotiate(ctx)
	if err := runtime.ValidSnapshotOptions(opts); err != nil {
		return runtime.SnapshotImage{}, err
	}
	tag := opts.Tagged()
	ref := runtime.SnapshotRef(tag)
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	ins, err := r.inspectManaged(ctx, id)
	if err != nil {
		return runtime.SnapshotImage{}, err
	}
	if _, err := r.cli.ImageInspect(ctx, ref); err == nil {
		return runtime.SnapshotImage{}, errdefs.AlreadyExists("snapshot %s (tag %s)", opts.Name, tag)
	} else if mapped := r.mapErr(err, "inspect image", ref); !errdefs.IsNotFound(mapped) {
		return runtime.SnapshotImage{}, mapped
	}
	src, err := r.cli.ImageInspect(ctx, ins.Image)
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "inspect image", ins.Image)
	}
	cfg := commitConfig(src.Config, ins.Config, runtime.SnapshotLabels(opts, r.cfg.InstanceID))

	// Cleanup runs even when the caller gave up: a sandbox must not stay
	// frozen, nor without its agent.
	if st := ins.State; st != nil && st.Running && !st.Paused {
		if err := r.cli.ContainerPause(ctx, id); err != nil {
			return runtime.SnapshotImage{}, r.mapErr(err, "pause container", id)
		}
		defer func() {
			cctx, cancel := runtime.Detached(ctx)
			defer cancel()
			if err := r.cli.ContainerUnpause(cctx, id); err != nil {
				r.log.Warn("thawing a sandbox after its snapshot failed", "container_id", id, "err", err)
			}
		}()
	}
	if r.cfg.Injection == InjectCopy {
		restore, err := r.hideAgent(ctx, id)
		if err != nil {
			return runtime.SnapshotImage{}, err
		}
		defer restore()
	}
	t0 := time.Now()
	resp, err := r.cli.ContainerCommit(ctx, id, container.CommitOptions{
		Reference: ref,
		Comment:   "berth snapshot " + opts.Name,
		Pause:     false, // frozen above when it was running
		Config:    cfg,
	})
	if err != nil {
		return runtime.SnapshotImage{}, r.mapErr(err, "commit container", id)
	}
	snap := runtime.SnapshotImage{Name: opts.Name, Tag: tag, Ref: ref, ID: resp.ID, CreatedAt: time.Now(), Labels: cfg.Labels}
	snap.Size = r.layerSize(ctx, resp.ID)
	r.log.Debug("sandbox snapshotted", "container_id", id, "snapshot", opts.Name, "commit", time.Since(t0), "size_bytes", snap.Size)
	return snap, nil
}

// commitConfig is the configuration of a snapshot of a container (c) of
// image src: src's, with labels added, and with every environment
// variable and label the container has but src has not set empty (Docker
// merges the container's into it otherwise).
func commitConfig(src *dockerspec.DockerOCIImageConfig, c *container.Config, labels map[string]string) *container.Config {
	if src == nil {
		src = &dockerspec.DockerOCIImageConfig{}
	}
	out := &container.Config{
		User:       src.User,
		Env:        append([]string(nil), src.Env...),
		Cmd:        src.Cmd,
		Entrypoint: src.Entrypoint,
		WorkingDir: src.WorkingDir,
		Volumes:    src.Volumes,
		StopSignal: src.StopSignal,
		Labels:     map[string]string{},
	}
	has := map[string]bool{}
	for _, kv := range out.Env {
		k, _, _ := strings.Cut(kv, "=")
		has[k] = true
	}
	if c != nil {
		var extra []string
		for _, kv := range c.Env {
			if k, _, _ := strings.Cut(kv, "="); !has[k] {
				has[k] = true
				extra = append(extra, k+"=")
			}
		}
		sort.Strings(extra)
		out.Env = append(out.Env, extra...)
		for k := range c.Labels {
			out.Labels[k] = ""
		}
	}
	for k, v := range src.Labels {
		out.Labels[k] = v
	}
	for k, v := range labels {
		out.Labels[k] = v
	}
	return out
}

// hideAgent empties the agent binary and the token file in container id's
// writable layer (InjectCopy put them there) and returns the function that
// puts them back. The running agent keeps its open binary (the engine
// replaces the file, it does not write into it).
func (r *Runtime) hideAgent(ctx context.Context, id string) (restore func(), err error) {
	token, err := r.readToken(ctx, id)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	dir := strings.TrimPrefix(runtime.AgentDir, "/") + "/"
	for _, h := range []tar.Header{
		{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: now},
		{Typeflag: tar.TypeReg, Name: dir + runtime.AgentFile, Mode: 0o755, ModTime: now},
		{Typeflag: tar.TypeReg, Name: dir + runtime.TokenFile, Mode: 0o400, ModTime: now},
	} {
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := r.cli.CopyToContainer(ctx, id, "/", &buf, container.CopyToContainerOptions{}); err != nil {
		return nil, r.mapErr(err, "empty the agent in container", id)
	}
	return func() {
		cctx, cancel := runtime.Detached(ctx)
		defer cancel()
		if err := r.inject(cctx, id, archive{agent: true, token: token}); err != nil {
			r.log.Error("putting the agent back into a sandbox after its snapshot failed; it cannot restart", "container_id", id, "err", err)
		}
	}, nil
}

// readToken reads the agent's token file from container id.
func (r *Runtime) readToken(ctx context.Context, id string) (string, error) {
	rc, _, err := r.cli.CopyFromContainer(ctx, id, runtime.TokenPath)
	if err != nil {
		return "", r.mapErr(err, "read the agent token of container", id)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			return "", fmt.Errorf("docker: read the agent token of container %s: %w", id, err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(io.LimitReader(tr, 4096))
			if err != nil {
				return "", fmt.Errorf("docker: read the agent token of container %s: %w", id, err)
			}
			return string(b), nil
		}
	}
}

// layerSize is the size of image id's top layer (what a commit added), or
// 0 when the engine cannot tell.
func (r *Runtime) layerSize(ctx context.Context, id string) int64 {
	h, err := r.cli.ImageHistory(ctx, id)
	if err != nil || len(h) == 0 {
		return 0
	}
	return h[0].Size
}

// Snapshots lists the berth snapshots whose labels match sel.
func (r *Runtime) Snapshots(ctx context.Context, sel runtime.Selector) ([]runtime.SnapshotImage, error) {
	r.negotiate(ctx)
	f := filters.NewArgs(filters.Arg("label", runtime.LabelSnapshot), filters.Arg("label", runtime.LabelManaged+"=true"))
	for k, v := range sel {
		f.Add("label", k+"="+v)
	}
	list, err := r.cli.ImageList(ctx, image.ListOptions{Filters: f})
	if err != nil {
		return nil, r.mapErr(err, "list images", "")
	}
	var out []runtime.SnapshotImage
	for _, s := range list {
		tag, ok := snapshotTag(s.RepoTags)
		if !sel.Matches(s.Labels) || !ok {
			continue
		}
		out = append(out, runtime.SnapshotImage{Name: s.Labels[runtime.LabelSnapshot], Tag: tag, Ref: runtime.SnapshotRef(tag), ID: s.ID, CreatedAt: time.Unix(s.Created, 0),
			Labels: s.Labels, Size: r.layerSize(ctx, s.ID)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// snapshotTag returns the tag of the first of an image's repository tags
// that is in runtime.SnapshotRepository.
func snapshotTag(repoTags []string) (string, bool) {
	for _, t := range repoTags {
		if tag, ok := runtime.SnapshotTagOf(t); ok {
			return tag, true
		}
	}
	return "", false
}

// RemoveSnapshot removes the snapshot image stored under tag. A container
// created from it (or an image built on it) keeps it: FailedPrecondition.
func (r *Runtime) RemoveSnapshot(ctx context.Context, tag string) error {
	r.negotiate(ctx)
	if err := runtime.ValidSnapshotName("tag", tag); err != nil {
		return err
	}
	name := tag
	ref := runtime.SnapshotRef(tag)
	img, err := r.cli.ImageInspect(ctx, ref)
	if err != nil {
		if mapped := r.mapErr(err, "inspect image", ref); !errdefs.IsNotFound(mapped) {
			return mapped
		}
		return errdefs.NotFound("snapshot %s", name)
	}
	if img.Config == nil || !runtime.IsManaged(img.Config.Labels) || img.Config.Labels[runtime.LabelSnapshot] == "" {
		return errdefs.NotFound("snapshot %s", name)
	}
	users, err := r.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("ancestor", img.ID))})
	if err != nil {
		return r.mapErr(err, "list containers", "")
	}
	if len(users) > 0 {
		names := make([]string, 0, len(users))
		for _, c := range users {
			names = append(names, strings.TrimPrefix(firstName(c.Names), "/"))
		}
		return errdefs.FailedPrecondition("snapshot %s is in use by %d sandbox(es) (%s); release the leases forked from it first", name, len(users), strings.Join(names, ", "))
	}
	if _, err := r.cli.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true}); err != nil {
		mapped := r.mapErr(err, "remove image", ref)
		if errdefs.IsNotFound(mapped) {
			return errdefs.NotFound("snapshot %s", name)
		}
		if strings.Contains(err.Error(), "conflict") {
			return fmt.Errorf("%w: snapshot %s is in use: %v", errdefs.ErrFailedPrecondition, name, err)
		}
		return mapped
	}
	return nil
}

func firstName(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return names[0]
}
