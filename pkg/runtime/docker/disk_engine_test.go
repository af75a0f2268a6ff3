package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/system"
	"github.com/docker/docker/client"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/docker"
)

// claimOverlay2 is the real engine's client, except that docker info
// claims overlay2, a driver that may support StorageOpt size: the backend
// then has to find out by trying.
type claimOverlay2 struct{ *client.Client }

func (c claimOverlay2) Info(ctx context.Context) (system.Info, error) {
	info, err := c.Client.Info(ctx)
	info.Driver = "overlay2"
	return info, err
}

// TestDiskLimitOnThisEngine creates sandboxes with a disk limit on the
// real engine: whatever its storage driver, Create succeeds and reports who
// enforces the limit; where the engine refuses a size (fuse-overlayfs,
// overlay2 without pquota) the refusal is recognised and learned, and Usage
// measures the writable layer.
func TestDiskLimitOnThisEngine(t *testing.T) {
	requireDocker(t)
	ctx := context.Background()
	info, err := dockerCli.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cli  docker.Client
	}{{"as reported", nil}, {"driver claimed overlay2", claimOverlay2{dockerCli}}} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testenv.SyncBuffer
			rt := newRuntime(t, func(c *docker.Config) {
				c.Client = tc.cli
				c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			for i := range 2 {
				spec := testSpec(t, rt, emptyImage)
				spec.Resources.DiskBytes = 20 << 20
				sb, err := rt.Create(ctx, spec)
				if err != nil {
					t.Fatalf("create %d with a disk limit: %v", i, err)
				}
				t.Logf("driver %s: enforcement %q", info.Driver, sb.DiskEnforcement)
				if sb.DiskEnforcement != runtime.DiskEnforcementEngine && sb.DiskEnforcement != runtime.DiskEnforcementBerth {
					t.Fatalf("enforcement %q", sb.DiskEnforcement)
				}
				if info.Driver == "fuse-overlayfs" && sb.DiskEnforcement != runtime.DiskEnforcementBerth {
					t.Fatalf("fuse-overlayfs cannot bound a size, got enforcement %q", sb.DiskEnforcement)
				}
				u, err := rt.Usage(ctx, sb.ID)
				if err != nil || u.DiskBytes < 0 || u.DiskBytes > 1<<20 || u.MeasuredAt.IsZero() {
					t.Fatalf("Usage of a fresh sandbox = %+v, %v", u, err)
				}
			}
			if tc.cli != nil && info.Driver == "fuse-overlayfs" && !strings.Contains(logs.String(), "the engine refused a size") {
				t.Fatalf("the engine's refusal of StorageOpt was not tried and learned; logs:\n%s", logs.String())
			}
		})
	}
}

// TestUsageAgreesWithEngine: a file written into a running sandbox's
// writable layer grows Usage (which sums the layer's upper directory here)
// by the file's size, as it grows the engine's own measurement (SizeRw of
// ContainerInspect with size), and the two agree on the layer's size.
func TestUsageAgreesWithEngine(t *testing.T) {
	requireDocker(t)
	ctx := context.Background()
	rt := newRuntime(t)
	spec := testSpec(t, rt, emptyImage)
	spec.Resources.DiskBytes = 64 << 20
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	engineSize := func() int64 {
		ins, _, err := dockerCli.ContainerInspectWithRaw(ctx, sb.ID, true)
		if err != nil || ins.SizeRw == nil {
			t.Fatalf("inspect with size: %v", err)
		}
		return *ins.SizeRw
	}
	before, err := rt.Usage(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	engineBefore := engineSize()
	const size = 3<<20 + 123
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "written.bin", Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(bytes.Repeat([]byte{7}, size)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dockerCli.CopyToContainer(ctx, sb.ID, "/", &buf, container.CopyToContainerOptions{}); err != nil {
		t.Fatal(err)
	}
	after, err := rt.Usage(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	engineAfter := engineSize()
	if got := after.DiskBytes - before.DiskBytes; got != size {
		t.Errorf("Usage grew by %d bytes, want %d (before %d, after %d)", got, size, before.DiskBytes, after.DiskBytes)
	}
	if got := engineAfter - engineBefore; got != size {
		t.Errorf("the engine's SizeRw grew by %d bytes, want %d", got, size)
	}
	// The agent berth copied into the layer (InjectCopy) is in SizeRw, not in Usage.
	if d := engineAfter - after.DiskBytes; d < 0 || d > 64<<20 {
		t.Errorf("Usage %d bytes, the engine's SizeRw %d: they disagree beyond the agent's copy", after.DiskBytes, engineAfter)
	}
	t.Logf("Usage %d -> %d bytes; engine SizeRw %d -> %d", before.DiskBytes, after.DiskBytes, engineBefore, engineAfter)
}
