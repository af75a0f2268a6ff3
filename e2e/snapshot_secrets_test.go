package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
)

// secretsPool is the warm pool of the snapshot secrets tests.
func secretsPool(image string) func(*orchestrator.Config) {
	return func(c *orchestrator.Config) {
		c.Pools = []orchestrator.Pool{{Name: "sec", Image: image, Min: 1, Max: 1}}
	}
}

// snapshotSecrets performs the attack of issue 21 item 2 on one backend: a
// lease claimed from a warm pool gets its env and secret through the
// agent's Configure; its owner snapshots it. Neither value may be in the
// saved image (imageBytes returns every byte of it: configuration and
// uncompressed layers), and a fork of the snapshot must run without them
// (with the secret it brings itself).
func snapshotSecrets(t *testing.T, a *api, m *lease.Manager, image string, imageBytes func(t *testing.T, ref string) []byte) {
	waitPool(t, m, "sec", 1)
	secret, plain := "pool-secret-"+randHex(12), "pool-env-"+randHex(12)
	r := a.acquireBody(t, map[string]any{"conversationId": "c-sec-src", "image": image, "ttl": "600s",
		"env": map[string]string{"PLAIN_X": plain}, "secrets": map[string]string{"SECRET_X": secret}})
	src := r.GetLease()
	if src.GetPool() != "sec" {
		t.Fatalf("lease pool %q, want sec: the test needs a claimed sandbox (Configure)", src.GetPool())
	}
	defer a.mustRelease(t, src.GetId())
	if out, _ := pexec(t, a, src.GetId(), r.GetToken(), `echo "$PLAIN_X $SECRET_X"`); out != plain+" <secret:SECRET_X>\n" {
		t.Fatalf("the claimed lease sees %q", out)
	}
	pexec(t, a, src.GetId(), r.GetToken(), "echo kept > /workspace/kept.txt")

	snap := snapshotCall(t, a, src.GetId(), "e2e-"+runID+"-"+randHex(4), r.GetToken())
	saved := imageBytes(t, snap.GetRef())
	if len(saved) == 0 {
		t.Fatalf("the saved image %s is empty", snap.GetRef())
	}
	if !bytes.Contains(saved, []byte("kept")) {
		t.Fatalf("the saved image %s does not hold the lease's file: the search would prove nothing", snap.GetRef())
	}
	for what, v := range map[string]string{"secret": secret, "env value": plain} {
		if bytes.Contains(saved, []byte(v)) {
			t.Errorf("the snapshot %s holds the claimed lease's %s %q", snap.GetRef(), what, v)
		}
	}

	own := "fork-secret-" + randHex(12)
	f := a.acquireBody(t, map[string]any{"conversationId": "c-sec-fork", "snapshot": snap.GetName(), "ttl": "600s",
		"secrets": map[string]string{"OWN_X": own}})
	out, _ := pexec(t, a, f.GetLease().GetId(), f.GetToken(), `cat /workspace/kept.txt; echo "[$SECRET_X] [$PLAIN_X] [$OWN_X]"`)
	if want := "kept\n[] [] [<secret:OWN_X>]\n"; out != want {
		t.Errorf("the fork sees %q, want %q: another lease's configuration was applied", out, want)
	}
	a.mustRelease(t, f.GetLease().GetId())
	if code, _, b := a.mustCall(t, http.MethodDelete, "/v1/snapshots/"+snap.GetName(), nil, operatorToken); code != http.StatusOK {
		t.Errorf("DELETE /v1/snapshots/%s: HTTP %d: %s", snap.GetName(), code, b)
	}
}

// TestSnapshotSecretsDocker runs snapshotSecrets on Docker, searching the
// output of docker save.
func TestSnapshotSecretsDocker(t *testing.T) {
	requireImage(t, minimalImage)
	dir, instance := newDataDir(t)
	removeSnapshotImages(t, instance)
	o := startOrch(t, dir, secretsPool(minimalImage))
	snapshotSecrets(t, o.api, o.srv.Manager(), minimalImage, func(t *testing.T, ref string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "docker", "save", ref).Output()
		if err != nil {
			t.Fatalf("docker save %s: %v", ref, err)
		}
		return untarAll(t, out)
	})
}

// TestSnapshotSecretsContainerd runs snapshotSecrets on containerd,
// reading the image's configuration and layers from the content store.
func TestSnapshotSecretsContainerd(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	removeCtrdSnapshots(t, env)
	o := startCtrdOrch(t, env, secretsPool(minimalImage))
	snapshotSecrets(t, o.api, o.srv.Manager(), minimalImage, ctrdImageBytes)
	// The pool's refilled member goes with a restart without the pool.
	o.stop(t)
	o = startCtrdOrch(t, env)
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
		boxes, err := o.rt.List(context.Background(), runtime.Selector{runtime.LabelInstance: env.instance})
		return err == nil && len(boxes) == 0
	}) {
		t.Fatal("the pool's members were left behind after a restart without the pool")
	}
}

// untarAll returns every file of the tar archive b, each decompressed
// when it is compressed, one after the other.
func untarAll(t *testing.T, b []byte) []byte {
	t.Helper()
	var all bytes.Buffer
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return all.Bytes()
		}
		if err != nil {
			t.Fatalf("reading the saved image: %v", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		f, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(decompressed(t, f))
	}
}

// decompressed returns b, decompressed when it is gzip or zstd.
func decompressed(t *testing.T, b []byte) []byte {
	t.Helper()
	rc, err := compression.DecompressStream(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("decompress: %v", err)
	}
	defer rc.Close()
	out, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("decompress: %v", err)
	}
	return out
}

// ctrdImageBytes returns the configuration and every layer (decompressed,
// as tars) of image ref in the test containerd's namespace.
func ctrdImageBytes(t *testing.T, ref string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	name := named.String()
	cli := ctrd.rt.Client()
	ctx = namespaces.WithNamespace(ctx, ctrd.rt.Namespace())
	img, err := cli.ImageService().Get(ctx, name)
	if err != nil {
		t.Fatalf("image %s: %v", name, err)
	}
	cs := cli.ContentStore()
	mf, err := images.Manifest(ctx, cs, img.Target, platforms.Default())
	if err != nil {
		t.Fatalf("manifest of %s: %v", name, err)
	}
	var all bytes.Buffer
	for _, d := range append(mf.Layers, mf.Config) {
		b, err := content.ReadBlob(ctx, cs, d)
		if err != nil {
			t.Fatalf("blob %s of %s: %v", d.Digest, name, err)
		}
		all.Write(decompressed(t, b)) // a layer's tar holds its files' bytes plainly
	}
	return all.Bytes()
}
