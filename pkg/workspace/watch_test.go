package workspace_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/workspace"
)

// TestWatchCloseEndsWatches: closing a workspace ends the sequences of its
// running watches (Local: the watches stop; Remote: the connection goes).
func TestWatchCloseEndsWatches(t *testing.T) {
	local, err := workspace.NewLocal(t.TempDir(), workspace.WithLogger(quietLog()))
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t)
	for name, ws := range map[string]workspace.Workspace{
		"local": local,
		"grpc":  newRemote(t, workspace.RemoteConfig{Target: a.Addr, Token: agentToken}),
		"rest":  newRemote(t, workspace.RemoteConfig{Target: a.Base, Token: agentToken, Transport: workspace.TransportREST}),
	} {
		t.Run(name, func(t *testing.T) {
			seq, err := ws.Watch(testCtx(t), "", workspace.WatchOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ended := make(chan error, 1)
			go func() {
				var last error
				for _, err := range seq {
					last = err
				}
				ended <- last
			}()
			time.Sleep(50 * time.Millisecond)
			ws.Close()
			select {
			case err := <-ended:
				if err != nil && !errors.Is(err, workspace.ErrClosed) {
					t.Fatalf("after Close the sequence ended with %v, want nothing or ErrClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the sequence did not end after Close")
			}
			if _, err := ws.Watch(testCtx(t), "", workspace.WatchOptions{}); !errors.Is(err, workspace.ErrClosed) {
				t.Fatalf("Watch after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// TestWatchRangedOnce: a watch's sequence is single-use.
func TestWatchRangedOnce(t *testing.T) {
	dir := t.TempDir()
	ws, err := workspace.NewLocal(dir, workspace.WithLogger(quietLog()))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	ctx, cancel := context.WithCancel(testCtx(t))
	seq, err := ws.Watch(ctx, "", workspace.WatchOptions{Debounce: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for ev, err := range seq {
		if err != nil || ev.Kind != workspace.WatchCreated || ev.Path != "f" {
			t.Fatalf("event %+v, %v; want f created", ev, err)
		}
		break
	}
	for _, err := range seq {
		if !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("second range: %v, want failed precondition", err)
		}
	}
	cancel()
}
