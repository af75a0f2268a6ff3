package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

// TestKubernetesPersist: on the Kubernetes backend a persistent workspace
// is a PersistentVolumeClaim of the conversation that outlives its lease:
// a file written to /workspace is there when the conversation is acquired
// again after its release; the volumes API and CLI list, inspect and
// remove it (refused while in use, hidden from another owner's client),
// as on Docker. Host mounts are refused at the orchestrator's start
// (TestValidateHostMountsKubernetes).
func TestKubernetesPersist(t *testing.T) {
	a, rt, _ := startK8sOrch(t, func(c *orchestrator.Config) { c.Clients = persistClients })
	addr := strings.TrimPrefix(a.base, "http://")
	tgt := persistTarget{a: a, addr: addr, vm: rt, reap: func() {
		if code, _, b, err := a.call(http.MethodPost, "/v1/leases:reap", `{"all":true}`); err != nil || code != http.StatusOK {
			t.Errorf("cleanup: reap all: HTTP %d, %v: %s", code, err, b)
		}
		waitNoLive(t, a)
	}}
	conv := "k8s-persist-" + randHex(4)
	began := time.Now()
	r := acquirePersist(t, tgt, conv)
	t.Logf("first acquire of %s (claim created): %s", conv, time.Since(began).Round(time.Millisecond))
	l, tok := r.GetLease(), r.GetToken()
	vol := l.GetWorkspace().GetVolume()
	pexec(t, a, l.GetId(), tok, "echo kept across leases > /workspace/note.txt")

	// In use: listed with its lease, not removable, not another owner's.
	client := checkVolumeInUse(t, a, conv, vol, l.GetId())
	if code, _, b := a.mustCall(t, http.MethodGet, "/v1/volumes/"+vol, nil, client); code != http.StatusNotFound {
		t.Errorf("another owner's client inspect: HTTP %d: %s; want 404", code, b)
	}

	// Hibernate and resume keep it (the same claim, a new Pod).
	pauseCall(t, a, l.GetId(), "hibernate")
	pauseCall(t, a, l.GetId(), "")
	if out, _ := pexec(t, a, l.GetId(), tok, "cat /workspace/note.txt"); out != "kept across leases\n" {
		t.Errorf("after hibernate and resume: %q", out)
	}

	// Release, then acquire the conversation again: the file is there.
	a.mustRelease(t, l.GetId())
	v := waitUnused(t, a, vol)
	if v.GetLastUsedAt() == nil {
		t.Errorf("released volume = %+v, want its last use", v)
	}
	began = time.Now()
	r2 := acquirePersist(t, tgt, conv)
	t.Logf("re-acquired conversation %s with its claim in %s", conv, time.Since(began).Round(time.Millisecond))
	l2 := r2.GetLease()
	if l2.GetId() == l.GetId() || l2.GetWorkspace().GetVolume() != vol {
		t.Fatalf("second lease %s volume %q, want a new lease on %s", l2.GetId(), l2.GetWorkspace().GetVolume(), vol)
	}
	if out, _ := pexec(t, a, l2.GetId(), r2.GetToken(), "cat /workspace/note.txt && touch /workspace/again"); out != "kept across leases\n" {
		t.Errorf("the second lease reads %q from /workspace/note.txt", out)
	}
	a.mustRelease(t, l2.GetId())
	waitUnused(t, a, vol)

	// The CLI lists and removes it; the claim is gone.
	if out, errs, code := cliRun(t, addr, "volume", "list", "-o", "json"); code != 0 || !strings.Contains(out, vol) || !strings.Contains(out, conv) {
		t.Fatalf("volume list -o json: exit %d: %s %s", code, out, errs)
	}
	if out, errs, code := cliRun(t, addr, "volume", "rm", vol); code != 0 || !strings.Contains(out, "removed "+vol) {
		t.Fatalf("volume rm: exit %d: %s %s", code, out, errs)
	}
	if v := getVolume(t, a, vol); v != nil {
		t.Errorf("GET after rm: %+v", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := rt.InspectVolume(ctx, vol); !errdefs.IsNotFound(err) {
		t.Errorf("the cluster still has claim %s: %v", vol, err)
	}
}
