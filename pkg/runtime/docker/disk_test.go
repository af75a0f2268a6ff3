package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/system"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// diskFake is a fake engine with a storage driver: it records the
// StorageOpt of every create and refuses it unless acceptSize is set.
type diskFake struct {
	*fakeClient
	driver     string
	acceptSize bool
	infoCalls  int

	mu   sync.Mutex
	opts []map[string]string // StorageOpt of each create

	inspect   func(id string) (container.InspectResponse, error)
	sizeCalls int // inspects that asked the engine for the size
}

func (d *diskFake) Info(context.Context) (system.Info, error) {
	d.infoCalls++
	return system.Info{Driver: d.driver}, nil
}

func (d *diskFake) ContainerInspectWithRaw(_ context.Context, id string, getSize bool) (container.InspectResponse, []byte, error) {
	ins, err := d.inspect(id)
	if getSize {
		d.mu.Lock()
		d.sizeCalls++
		d.mu.Unlock()
	}
	if !getSize && ins.ContainerJSONBase != nil {
		ins.SizeRw = nil // the engine measures only when asked
	}
	return ins, nil, err
}

func newDiskFake(driver string, accept bool) *diskFake {
	d := &diskFake{driver: driver, acceptSize: accept}
	d.fakeClient = &fakeClient{
		imageInspect: func(string) (image.InspectResponse, error) { return image.InspectResponse{Os: "linux"}, nil },
		containerCreate: func(name string, _ *container.Config, hc *container.HostConfig) (container.CreateResponse, error) {
			d.mu.Lock()
			d.opts = append(d.opts, hc.StorageOpt)
			d.mu.Unlock()
			if hc.StorageOpt != nil && !d.acceptSize {
				// What Engine 20.10 answers with overlay2 on a filesystem without project quotas.
				return container.CreateResponse{}, fmt.Errorf("Error response from daemon: --storage-opt is supported only for overlay over xfs with 'pquota' mount option: %w", cerrdefs.ErrInvalidArgument)
			}
			return container.CreateResponse{ID: "cid-" + name}, nil
		},
		// Start fails: these tests look at what was asked of the engine.
		containerStart: func(string) error { return errors.New("not started in this test") },
	}
	return d
}

func (d *diskFake) created() []map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]map[string]string(nil), d.opts...)
}

func createWithDisk(t *testing.T, r *Runtime, lease string, disk int64) {
	t.Helper()
	_, err := r.Create(context.Background(), runtime.Spec{LeaseID: lease, Image: "x", AgentToken: "tok", Resources: runtime.Resources{DiskBytes: disk}})
	if err == nil {
		t.Fatal("Create succeeded with a start that fails")
	}
}

func TestDiskLimitNotTriedOnFuseOverlayfs(t *testing.T) {
	f := newDiskFake("fuse-overlayfs", false)
	r := newFakeRuntime(t, f.fakeClient)
	r.cli = f
	createWithDisk(t, r, "l1", 20<<20)
	createWithDisk(t, r, "l2", 20<<20)
	got := f.created()
	if len(got) != 2 || got[0] != nil || got[1] != nil {
		t.Fatalf("creates asked for %v, want two creates without StorageOpt", got)
	}
	if f.infoCalls != 1 || r.disk.mode != diskBerth {
		t.Fatalf("info calls %d, mode %v; want docker info asked once and berth enforcing", f.infoCalls, r.disk.mode)
	}
}

func TestDiskLimitRefusedByEngineIsLearned(t *testing.T) {
	f := newDiskFake("overlay2", false)
	r := newFakeRuntime(t, f.fakeClient)
	r.cli = f
	createWithDisk(t, r, "l1", 20<<20)
	got := f.created()
	if len(got) != 2 || got[0]["size"] != "20971520" || got[1] != nil {
		t.Fatalf("creates asked for %v, want one with size 20971520 then one without", got)
	}
	if r.disk.mode != diskBerth {
		t.Fatalf("mode %v, want berth after the engine refused the size", r.disk.mode)
	}
	createWithDisk(t, r, "l2", 20<<20)
	if got := f.created(); len(got) != 3 || got[2] != nil {
		t.Fatalf("creates asked for %v, want the answer cached (no size tried again)", got)
	}
}

func TestDiskLimitByEngineWhereSupported(t *testing.T) {
	f := newDiskFake("overlay2", true)
	r := newFakeRuntime(t, f.fakeClient)
	r.cli = f
	createWithDisk(t, r, "l1", 20<<20)
	createWithDisk(t, r, "l2", 0) // no limit: no size
	got := f.created()
	if len(got) != 2 || got[0]["size"] != "20971520" || got[1] != nil {
		t.Fatalf("creates asked for %v", got)
	}
	if r.disk.mode != diskEngine {
		t.Fatalf("mode %v, want engine", r.disk.mode)
	}
	if e := diskEnforcement(20<<20, true); e != runtime.DiskEnforcementEngine {
		t.Fatalf("enforcement %q", e)
	}
	// A container created with a size is read back as engine-enforced.
	sb := r.fromInspect(container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{
		ID: "c", HostConfig: &container.HostConfig{StorageOpt: map[string]string{"size": "20971520"}}}})
	if sb.DiskEnforcement != runtime.DiskEnforcementEngine {
		t.Fatalf("fromInspect enforcement %q", sb.DiskEnforcement)
	}
}

func TestUsageFromSizeRw(t *testing.T) {
	f := newDiskFake("fuse-overlayfs", false)
	size := int64(5_000_000)
	f.inspect = func(id string) (container.InspectResponse, error) {
		switch id {
		case "managed":
			return container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{ID: id, SizeRw: &size},
				Config: &container.Config{Labels: map[string]string{runtime.LabelManaged: "true"}}}, nil
		case "foreign":
			return container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{ID: id, SizeRw: &size},
				Config: &container.Config{}}, nil
		}
		return container.InspectResponse{}, fmt.Errorf("No such container: %s: %w", id, cerrdefs.ErrNotFound)
	}
	r := newFakeRuntime(t, f.fakeClient)
	r.cli = f
	u, err := r.Usage(context.Background(), "managed")
	if err != nil || u.DiskBytes != size || u.MeasuredAt.IsZero() {
		t.Fatalf("Usage = %+v, %v; want %d bytes", u, err, size)
	}
	for _, id := range []string{"foreign", "missing"} {
		if _, err := r.Usage(context.Background(), id); !errdefs.IsNotFound(err) {
			t.Errorf("Usage(%s) = %v, want NotFound", id, err)
		}
	}
}

// TestUsageFromUpperDir: where the engine reports an upper directory that
// is readable here, Usage sums its regular files (a hard link once, a
// whiteout nothing) without asking the engine for the size; where it is
// not (another host's path), the engine measures.
func TestUsageFromUpperDir(t *testing.T) {
	upper := t.TempDir()
	if err := os.MkdirAll(filepath.Join(upper, "workspace", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]int{"workspace/a": 1000, "workspace/sub/b": 234} {
		if err := os.WriteFile(filepath.Join(upper, name), make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(upper, "workspace/a"), filepath.Join(upper, "a-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, ".wh.deleted"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	engine := int64(5_000_000)
	f := newDiskFake("fuse-overlayfs", false)
	dir := upper
	f.inspect = func(id string) (container.InspectResponse, error) {
		ins := container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{ID: id, SizeRw: &engine},
			Config: &container.Config{Labels: map[string]string{runtime.LabelManaged: "true"}}}
		ins.GraphDriver.Name = "fuse-overlayfs"
		ins.GraphDriver.Data = map[string]string{"UpperDir": dir}
		return ins, nil
	}
	r := newFakeRuntime(t, f.fakeClient)
	r.cli = f
	u, err := r.Usage(context.Background(), "managed")
	if err != nil || u.DiskBytes != 1234 || f.sizeCalls != 0 {
		t.Fatalf("Usage = %+v, %v, %d inspects with size; want 1234 bytes from the upper directory, none", u, err, f.sizeCalls)
	}
	dir = filepath.Join(upper, "not-here")
	u, err = r.Usage(context.Background(), "managed")
	if err != nil || u.DiskBytes != engine || f.sizeCalls != 1 {
		t.Fatalf("Usage = %+v, %v, %d inspects with size; want the engine's %d bytes", u, err, f.sizeCalls, engine)
	}
}
