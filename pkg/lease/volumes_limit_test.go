package lease

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// TestVolumeLimitPerOwner performs the attack of a tenant that persists
// workspace after workspace: past Config.Volumes.MaxPerOwner, an acquire
// that would create another volume is RESOURCE_EXHAUSTED naming the limit,
// also when the acquires race; acquiring an existing volume's
// conversation again, another owner, and the operator are not refused;
// removing a volume makes room.
func TestVolumeLimitPerOwner(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Volumes.MaxPerOwner = 3 })
	ctx := context.Background()
	acquire := func(owner, conv string, noLimit bool) (Lease, error) {
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{Owner: owner, ConversationID: conv, Persist: true, NoOwnerLimit: noLimit})
		return l, err
	}
	// Eight acquires at once for eight conversations: three win.
	var wg sync.WaitGroup
	var won, refused atomic.Int32
	for i := range 8 {
		wg.Go(func() {
			_, err := acquire("mallory", fmt.Sprintf("c%d", i), false)
			switch {
			case err == nil:
				won.Add(1)
			case errdefs.IsResourceExhausted(err) && strings.Contains(err.Error(), "volume limit: owner \"mallory\" has 3 workspace volumes, at most 3 per owner"):
				refused.Add(1)
			default:
				t.Errorf("acquire: %v", err)
			}
		})
	}
	wg.Wait()
	if won.Load() != 3 || refused.Load() != 5 {
		t.Fatalf("%d acquires created volumes, %d refused; want 3 and 5", won.Load(), refused.Load())
	}
	vols, err := h.m.Volumes().List(ctx, VolumeFilter{Owner: "mallory"})
	if err != nil || len(vols) != 3 {
		t.Fatalf("mallory's volumes: %d, %v", len(vols), err)
	}
	// Released, the volumes still count; the conversations still mount them.
	for _, v := range vols {
		if _, err := h.m.Release(ctx, v.LeaseID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := acquire("mallory", "c-new", false); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a fourth volume after release: %v", err)
	}
	if _, err := acquire("mallory", vols[0].ConversationID, false); err != nil {
		t.Fatalf("mounting an existing volume again: %v", err)
	}
	if _, err := acquire("alice", "c1", false); err != nil {
		t.Fatalf("another owner: %v", err)
	}
	// Removing an unused volume makes room.
	eventually(t, 5*time.Second, "volume removable", func() bool { return h.m.Volumes().Remove(ctx, vols[1].Name) == nil })
	if _, err := acquire("mallory", "c-new", false); err != nil {
		t.Fatalf("after removing a volume: %v", err)
	}
	if _, err := acquire("mallory", "c-newer", false); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("past the limit again: %v", err)
	}
	// The operator (NoOwnerLimit) is not refused.
	if _, err := acquire("mallory", "op", true); err != nil {
		t.Fatalf("the operator's acquire: %v", err)
	}
}

// TestVolumeRetentionClock checks the retention against an injected
// clock, with no waiting: a volume unused for longer than the retention
// is removed by the reaper; one in use, or used within it, is kept.
func TestVolumeRetentionClock(t *testing.T) {
	var offset atomic.Int64
	h := newHarness(t, func(c *Config) {
		c.Volumes.Retention = 30 * 24 * time.Hour
		c.Volumes.ReapInterval = time.Hour // the test calls reapVolumes itself
		c.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	})
	ctx := context.Background()
	old, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "old", Persist: true})
	if err != nil {
		t.Fatal(err)
	}
	used, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "in-use", Persist: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Release(ctx, old.ID, "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "volume no longer in use", func() bool {
		v, err := h.m.Volumes().Inspect(ctx, old.Volume)
		return err == nil && !v.InUse()
	})
	if got := h.m.vols.reapVolumes(ctx); len(got) != 0 {
		t.Fatalf("reaped %v right after the last use", got)
	}
	offset.Store(int64(29 * 24 * time.Hour))
	if got := h.m.vols.reapVolumes(ctx); len(got) != 0 {
		t.Fatalf("reaped %v within the retention", got)
	}
	// The other lease may expire on the new clock; its volume's last use
	// is then now, and it is kept either way.
	offset.Store(int64(31 * 24 * time.Hour))
	got := h.m.vols.reapVolumes(ctx)
	if len(got) != 1 || got[0] != old.Volume {
		t.Fatalf("reaped %v, want only %s", got, old.Volume)
	}
	if _, err := h.m.Volumes().Inspect(ctx, old.Volume); !errdefs.IsNotFound(err) {
		t.Fatalf("the old volume after the reap: %v", err)
	}
	if _, err := h.m.Volumes().Inspect(ctx, used.Volume); err != nil {
		t.Fatalf("the volume in use was reaped: %v", err)
	}
}
