package containerd

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	ctd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	dockerclient "github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// imageInfo is what Create needs from an image's configuration.
type imageInfo struct {
	config ocispec.ImageConfig
}

// normalizeRef turns a Docker-style reference ("berth/base",
// "berth/base:latest") into the fully qualified name containerd stores
// images under ("docker.io/berth/base:latest").
func normalizeRef(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", errdefs.InvalidArgument("image", "%q is not a valid image reference: %v", ref, err)
	}
	return named.String(), nil
}

// familiar turns a containerd image name back into the short form Docker
// users know ("docker.io/berth/base:latest" -> "berth/base:latest").
func familiar(name string) string {
	if named, err := reference.ParseNormalizedNamed(name); err == nil {
		return reference.FamiliarString(named)
	}
	return name
}

// missingImage is the NotFound error of an image that is not in the
// namespace, with the commands that put it there.
func (r *Runtime) missingImage(ref string) error {
	return fmt.Errorf("%w: image %s is not present in containerd namespace %q (%s); berth builds images locally (make images) since no registry is reachable, then import them: docker save %s | ctr -a %s -n %s images import -  (or Runtime.ImportFromDocker)",
		errdefs.ErrNotFound, ref, r.cfg.Namespace, r.cfg.Address, ref, r.cfg.Address, r.cfg.Namespace)
}

// image resolves ref in the namespace (by name, or by image id: a manifest
// or config digest or a prefix of one), makes sure it is unpacked into the
// snapshotter and returns its configuration.
func (r *Runtime) image(ctx context.Context, ref string) (ctd.Image, imageInfo, error) {
	var meta images.Image
	var err error
	if runtime.ImageIDRE.MatchString(ref) {
		meta, err = r.imageByID(ctx, ref)
	} else {
		var name string
		if name, err = normalizeRef(ref); err != nil {
			return nil, imageInfo{}, err
		}
		meta, err = r.cli.ImageService().Get(ctx, name)
		if err != nil {
			err = r.mapErr(err, "get image", name)
		}
	}
	if errdefs.IsNotFound(err) {
		return nil, imageInfo{}, r.missingImage(ref)
	}
	if err != nil {
		return nil, imageInfo{}, err
	}
	img := ctd.NewImage(r.cli, meta)
	key := meta.Target.Digest.String()

	r.imgMu.Lock()
	info, cached := r.imgInfos[key]
	r.imgMu.Unlock()
	if !cached {
		spec, err := img.Spec(ctx)
		if err != nil {
			return nil, imageInfo{}, r.mapErr(err, "read configuration of image", ref)
		}
		if spec.OS != "" && spec.OS != "linux" {
			return nil, imageInfo{}, errdefs.InvalidArgument("image", "%s is a %s image; berth runs linux images", ref, spec.OS)
		}
		info = imageInfo{config: spec.Config}
	}
	if err := r.unpack(ctx, img, key); err != nil {
		return nil, imageInfo{}, err
	}
	if !cached {
		r.imgMu.Lock()
		r.imgInfos[key] = info
		r.imgMu.Unlock()
	}
	return img, info, nil
}

// unpack unpacks img into the snapshotter unless it is unpacked already;
// concurrent Creates of the same image unpack it once.
func (r *Runtime) unpack(ctx context.Context, img ctd.Image, key string) error {
	unlock := r.unpackMu.lock(key)
	defer unlock()
	ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter)
	if err != nil {
		return r.mapErr(err, "check unpacked image", familiar(img.Name()))
	}
	if ok {
		return nil
	}
	r.log.Info("unpacking image", "image", familiar(img.Name()), "snapshotter", r.cfg.Snapshotter)
	if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
		return r.mapErr(err, "unpack image", familiar(img.Name()))
	}
	return nil
}

// imageByID finds the image whose manifest or configuration digest is (or
// starts with) id, as Docker accepts image ids.
func (r *Runtime) imageByID(ctx context.Context, id string) (images.Image, error) {
	hexID := strings.TrimPrefix(id, "sha256:")
	list, err := r.cli.ImageService().List(ctx)
	if err != nil {
		return images.Image{}, r.mapErr(err, "list images", "")
	}
	var found []images.Image
	for _, m := range list {
		if strings.HasPrefix(m.Target.Digest.Encoded(), hexID) {
			found = append(found, m)
			continue
		}
		if cfg, err := ctd.NewImage(r.cli, m).Config(ctx); err == nil && strings.HasPrefix(cfg.Digest.Encoded(), hexID) {
			found = append(found, m)
		}
	}
	if len(found) == 0 {
		return images.Image{}, errdefs.NotFound("image %s", id)
	}
	for _, m := range found[1:] {
		if m.Target.Digest != found[0].Target.Digest {
			return images.Image{}, errdefs.InvalidArgument("image", "image id %s is ambiguous", id)
		}
	}
	return found[0], nil
}

// Import reads an image archive from rd — `docker save` output or an OCI
// image layout tar — into the namespace with containerd's content and image
// services (not the transfer service, which containerd 1.6 lacks), unpacks
// every image into the snapshotter and returns the imported names in their
// familiar form ("berth/base:latest"). It is what
//
//	docker save berth/base | ctr -a SOCKET -n berth images import -
//
// does, plus the unpacking that `ctr` would do on the first `ctr run`.
// Re-importing an image that is present is cheap and harmless.
func (r *Runtime) Import(ctx context.Context, rd io.Reader) ([]string, error) {
	ctx = r.withNS(ctx)
	imgs, err := r.cli.Import(ctx, rd)
	if err != nil {
		return nil, r.mapErr(err, "import images", "")
	}
	var names []string
	for _, m := range imgs {
		img := ctd.NewImage(r.cli, m)
		if err := r.unpack(ctx, img, m.Target.Digest.String()); err != nil {
			return names, err
		}
		r.imgMu.Lock()
		delete(r.imgInfos, m.Target.Digest.String())
		r.imgMu.Unlock()
		names = append(names, familiar(m.Name))
	}
	if len(names) == 0 {
		return nil, errdefs.InvalidArgument("archive", "the archive holds no named image (save images by name, e.g. docker save berth/base:latest)")
	}
	return names, nil
}

// ImportFromDocker copies images from the local Docker Engine (configured
// from DOCKER_HOST etc.) into the namespace: Import of the Engine's
// `docker save` stream, without the CLI. Images the namespace already holds
// with the same image id (configuration digest), unpacked, are skipped, so
// calling it at every start is cheap. refs default to berth/base:latest and
// berth/minimal:latest. An image the Engine lacks is errdefs.ErrNotFound
// telling to run `make images`.
func (r *Runtime) ImportFromDocker(ctx context.Context, refs ...string) ([]string, error) {
	if len(refs) == 0 {
		refs = []string{"berth/base:latest", "berth/minimal:latest"}
	}
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		return nil, errdefs.Unavailable("docker: create client: %v", err)
	}
	defer cli.Close()
	var names, stale []string
	for _, ref := range refs {
		ins, err := cli.ImageInspect(ctx, ref)
		if err != nil {
			if cerrdefs.IsNotFound(err) {
				return nil, fmt.Errorf("%w: image %s is not present in the Docker Engine; build it (make images)", errdefs.ErrNotFound, ref)
			}
			return nil, fmt.Errorf("%w: docker: inspect image %s: %w", errdefs.ErrUnavailable, ref, err)
		}
		if r.upToDate(ctx, ref, ins.ID) {
			names = append(names, familiar(ref))
		} else {
			stale = append(stale, ref)
		}
	}
	if len(stale) == 0 {
		return names, nil
	}
	rc, err := cli.ImageSave(ctx, stale)
	if err != nil {
		return nil, fmt.Errorf("%w: docker: save %s: %w", errdefs.ErrUnavailable, strings.Join(stale, " "), err)
	}
	defer rc.Close()
	imported, err := r.Import(ctx, rc)
	if err != nil {
		return names, fmt.Errorf("import %s from docker: %w", strings.Join(stale, " "), err)
	}
	return append(names, imported...), nil
}

// upToDate reports whether the namespace holds ref, unpacked, with the
// configuration digest id (a Docker image id).
func (r *Runtime) upToDate(ctx context.Context, ref, id string) bool {
	ctx = r.withNS(ctx)
	name, err := normalizeRef(ref)
	if err != nil {
		return false
	}
	meta, err := r.cli.ImageService().Get(ctx, name)
	if err != nil {
		return false
	}
	img := ctd.NewImage(r.cli, meta)
	cfg, err := img.Config(ctx)
	if err != nil || cfg.Digest.String() != id {
		return false
	}
	ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter)
	return err == nil && ok
}

// RemoveImage deletes image ref from the namespace (its content and
// snapshots are garbage-collected once no container uses them). A missing
// image is success.
func (r *Runtime) RemoveImage(ctx context.Context, ref string) error {
	ctx = r.withNS(ctx)
	name, err := normalizeRef(ref)
	if err != nil {
		return err
	}
	if err := r.cli.ImageService().Delete(ctx, name, images.SynchronousDelete()); err != nil {
		if mapped := r.mapErr(err, "delete image", name); !errdefs.IsNotFound(mapped) {
			return mapped
		}
	}
	return nil
}

// keyedMutex serialises work per key.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks key and returns its unlock function.
func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
