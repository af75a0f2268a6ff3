package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestVolumeLimitDocker performs the attack of a tenant (a client token)
// that creates workspace volume after workspace volume on Docker: past
// --max-volumes-per-owner the acquire is 429 naming the limit and no
// volume is created; the tenant removing one of its volumes makes room.
func TestVolumeLimitDocker(t *testing.T) {
	requireDocker(t)
	requireImage(t, baseImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) { c.Clients = persistClients; c.Volumes.MaxPerOwner = 2 })
	volumeLimitScenario(t, persistTarget{a: o.api, vm: dockerRT, reap: func() { removeContainers(runtime.LabelInstance + "=" + instance) }}, instance)
}

// TestVolumeLimitContainerd is TestVolumeLimitDocker on containerd.
func TestVolumeLimitContainerd(t *testing.T) {
	rt := requireContainerd(t)
	requireCtrdImage(t, minimalImage)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, func(c *orchestrator.Config) { c.Clients = persistClients; c.Volumes.MaxPerOwner = 2 })
	volumeLimitScenario(t, persistTarget{a: o.api, vm: rt, reap: func() { o.reapAll(t); waitNoLive(t, o.api) }}, env.instance)
}

// volumeLimitScenario: with a limit of 2 volumes per owner, a client
// token's third persisting acquire is 429 naming the limit and the engine
// has no third volume; after the tenant removes one, the acquire passes.
func volumeLimitScenario(t *testing.T, tgt persistTarget, instance string) {
	tok := persistClients[0].Token
	acquire := func(conv string) (int, []byte, *orchv1.AcquireResponse) {
		t.Helper()
		body := map[string]any{"conversationId": conv, "ttl": "600s", "workspace": map[string]any{"persist": true}}
		code, _, b := tgt.a.mustCall(t, http.MethodPost, "/v1/leases", body, tok)
		if code != http.StatusOK {
			return code, b, nil
		}
		var r orchv1.AcquireResponse
		if err := decode(b, &r); err != nil {
			t.Fatal(err)
		}
		removeVolumeAtEnd(t, tgt, r.GetLease().GetWorkspace().GetVolume())
		return code, b, &r
	}
	prefix := "bounds-vol-" + randHex(4) + "-"
	var first *orchv1.AcquireResponse
	for i, conv := range []string{"a", "b"} {
		code, b, r := acquire(prefix + conv)
		if code != http.StatusOK {
			t.Fatalf("acquire %d: HTTP %d: %s", i, code, b)
		}
		if first == nil {
			first = r
		}
	}
	code, b, _ := acquire(prefix + "c")
	want := `volume limit: owner "persist-team" has 2 workspace volumes, at most 2 per owner`
	if e := parseErr(t, b); code != http.StatusTooManyRequests || !strings.Contains(e.Message, want) {
		t.Fatalf("a third volume: HTTP %d: %s; want 429 %q", code, b, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if vols, err := tgt.vm.ListVolumes(ctx, runtime.Selector{runtime.LabelInstance: instance}); err != nil || len(vols) != 2 {
		t.Fatalf("the engine has %d volumes of the instance (%v), want 2", len(vols), err)
	}
	// The tenant frees one: release its lease, remove its volume.
	if code, _, b := tgt.a.mustCall(t, http.MethodDelete, "/v1/leases/"+first.GetLease().GetId(), nil, tok); code != http.StatusOK {
		t.Fatalf("release: HTTP %d: %s", code, b)
	}
	vol := first.GetLease().GetWorkspace().GetVolume()
	if !eventually(30*time.Second, 100*time.Millisecond, func() bool {
		code, _, _ := tgt.a.mustCall(t, http.MethodDelete, "/v1/volumes/"+vol, nil, tok)
		return code == http.StatusOK
	}) {
		t.Fatalf("could not remove volume %s", vol)
	}
	if code, b, _ := acquire(prefix + "c"); code != http.StatusOK {
		t.Fatalf("acquire after removing a volume: HTTP %d: %s", code, b)
	}
}

// removeVolumeAtEnd removes vol (after the test's sandboxes) when the
// test ends.
func removeVolumeAtEnd(t *testing.T, tgt persistTarget, vol string) {
	t.Cleanup(func() {
		tgt.reap()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		for range 50 { // the sandbox may still be going
			if err = tgt.vm.RemoveVolume(ctx, vol); err == nil || !errdefs.IsFailedPrecondition(err) && !errdefs.IsNotFound(err) {
				break
			}
			if errdefs.IsNotFound(err) {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("cleanup: remove volume %s: %v", vol, err)
		}
	})
}
