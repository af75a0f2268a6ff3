package conformance

import (
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/workspace"
)

// pauseCases apply to workspaces that implement workspace.Pauser.
var pauseCases = []testCase{
	{"PauseResume", testPauseResume},
}

// testPauseResume: a paused workspace (frozen, where the backend can
// freeze, and hibernated) keeps its files and serves the next operation
// without an explicit Resume; Pause and Resume are idempotent.
func testPauseResume(t *testing.T, ws workspace.Workspace) {
	p, ok := ws.(workspace.Pauser)
	if !ok {
		t.Skipf("%T does not implement workspace.Pauser", ws)
	}
	ctx := ctxFor(t)
	upload(t, ws, "paused.txt", "kept across pauses\n")
	for _, mode := range []workspace.PauseMode{workspace.PauseFreeze, workspace.PauseHibernate} {
		err := p.Pause(ctx, mode)
		if mode == workspace.PauseFreeze && errdefs.IsFailedPrecondition(err) {
			t.Logf("freeze is not available here: %v", err)
			continue
		}
		if mode == workspace.PauseHibernate && errdefs.IsFailedPrecondition(err) {
			t.Skipf("this workspace cannot be paused: %v", err)
		}
		if err != nil {
			t.Fatalf("Pause(%s): %v", mode, err)
		}
		if err := p.Pause(ctx, mode); err != nil {
			t.Fatalf("Pause(%s) of a paused workspace: %v", mode, err)
		}
		// The next operation resumes the sandbox by itself.
		if got := sh(t, ws, "cat paused.txt"); got != "kept across pauses\n" {
			t.Fatalf("after Pause(%s): cat = %q", mode, got)
		}
		if err := p.Resume(ctx); err != nil {
			t.Fatalf("Resume of a running workspace: %v", err)
		}
		if err := p.Pause(ctx, mode); err != nil {
			t.Fatalf("Pause(%s): %v", mode, err)
		}
		if err := p.Resume(ctx); err != nil {
			t.Fatalf("Resume after Pause(%s): %v", mode, err)
		}
		if got := string(download(t, ws, "paused.txt")); got != "kept across pauses\n" {
			t.Fatalf("after Pause(%s) and Resume: %q", mode, got)
		}
	}
}
