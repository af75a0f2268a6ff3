package conformance

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// testSnapshot checks runtime.Snapshotter, on a runtime that implements it:
// a snapshot holds the sandbox's files but not the agent, its token, the
// sandbox's environment or secrets; a sandbox created from it (a fork)
// finds the files; the source keeps running; a snapshot in use cannot be
// removed.
func (s *suite) testSnapshot(t *testing.T) {
	t.Parallel()
	sn, ok := s.rt.(runtime.Snapshotter)
	if !ok {
		t.Skipf("%T does not implement runtime.Snapshotter", s.rt)
	}
	s.needShell(t)
	ctx := context.Background()
	spec := s.spec(s.images.Shell)
	spec.Env = map[string]string{"SNAP_ENV": "env-" + randomHex(8)}
	spec.Secrets = map[string]string{"SNAP_SECRET": "secret-" + randomHex(8)}
	src := s.create(t, spec)
	s.sh(t, src, spec.AgentToken, `mkdir -p snapdir && echo forked-file > snapdir/a.txt`)

	name := fmt.Sprintf("conf-%s-%d", s.runID, s.seq.Add(1))
	tag := runtime.SnapshotTag(s.instance, "conformance", name) // stored under a tag of its own
	t.Cleanup(func() {
		if err := sn.RemoveSnapshot(context.Background(), tag); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("cleanup: RemoveSnapshot %s: %v", tag, err)
		}
	})
	began := time.Now()
	img, err := sn.Snapshot(ctx, src.ID, runtime.SnapshotOptions{Name: name, Tag: tag,
		Labels: map[string]string{runtime.LabelSnapshotLease: spec.LeaseID, runtime.LabelInstance: s.instance}})
	if errdefs.IsFailedPrecondition(err) {
		// A configuration that cannot snapshot (containerd with user
		// namespaces) says so rather than storing remapped files.
		t.Skipf("this runtime's configuration cannot snapshot: %v", err)
	}
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Logf("Snapshot = %s (%s, %d bytes) in %s", img.Ref, shortID(img.ID), img.Size, time.Since(began).Round(time.Millisecond))
	if img.Name != name || img.Tag != tag || img.Ref != runtime.SnapshotRef(tag) || img.ID == "" {
		t.Errorf("Snapshot = %+v", img)
	}
	// The agent (megabytes) is not in it: only the few files written.
	if img.Size <= 0 || img.Size > 1<<20 {
		t.Errorf("snapshot size %d bytes, want > 0 and < 1 MiB (no agent binary)", img.Size)
	}
	if _, err := sn.Snapshot(ctx, src.ID, runtime.SnapshotOptions{Name: name + "-other", Tag: tag}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Snapshot with a taken tag: %v, want ErrAlreadyExists", err)
	}
	if _, err := sn.Snapshot(ctx, "berth-no-such-sandbox", runtime.SnapshotOptions{Name: name + "-x"}); !errdefs.IsNotFound(err) {
		t.Errorf("Snapshot of a missing sandbox: %v, want ErrNotFound", err)
	}
	if _, err := sn.Snapshot(ctx, src.ID, runtime.SnapshotOptions{Name: "Bad Name"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Snapshot with a bad name: %v, want ErrInvalidArgument", err)
	}
	// The source runs on, thawed, with its agent.
	if got, err := s.rt.Get(ctx, src.ID); err != nil || got.State != runtime.StateRunning {
		t.Errorf("source after Snapshot: %+v %v, want running", got.State, err)
	}
	s.sh(t, src, spec.AgentToken, `cat snapdir/a.txt`)

	list, err := sn.Snapshots(ctx, runtime.Selector{runtime.LabelSnapshotLease: spec.LeaseID})
	if err != nil {
		t.Fatalf("Snapshots: %v", err)
	}
	if len(list) != 1 || list[0].Name != name || list[0].Tag != tag || list[0].Ref != img.Ref || list[0].Size != img.Size {
		t.Errorf("Snapshots = %+v, want just %s", list, name)
	}

	fork := s.spec(img.Ref)
	fsb := s.create(t, fork)
	out := s.sh(t, fsb, fork.AgentToken, `cat snapdir/a.txt; env`)
	if !strings.HasPrefix(out, "forked-file\n") {
		t.Errorf("fork: snapdir/a.txt = %q, want forked-file", out)
	}
	for _, leak := range []string{spec.Env["SNAP_ENV"], spec.Secrets["SNAP_SECRET"], spec.AgentToken} {
		if strings.Contains(out, leak) {
			t.Errorf("the fork's environment holds the source's value %q:\n%s", leak, out)
		}
	}
	if err := sn.RemoveSnapshot(ctx, tag); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("RemoveSnapshot while a fork exists: %v, want ErrFailedPrecondition", err)
	}
	if err := s.rt.Remove(ctx, fsb.ID); err != nil {
		t.Fatal(err)
	}
	if err := sn.RemoveSnapshot(ctx, tag); err != nil {
		t.Errorf("RemoveSnapshot: %v", err)
	}
	if err := sn.RemoveSnapshot(ctx, tag); !errdefs.IsNotFound(err) {
		t.Errorf("RemoveSnapshot of a removed snapshot: %v, want ErrNotFound", err)
	}
	if list, _ := sn.Snapshots(ctx, runtime.Selector{runtime.LabelSnapshotLease: spec.LeaseID}); len(list) != 0 {
		t.Errorf("Snapshots after RemoveSnapshot = %+v", list)
	}
}
