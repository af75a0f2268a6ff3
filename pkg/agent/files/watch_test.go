package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recvWatch returns the next message of a watch stream within 5 s.
func recvWatch(t *testing.T, st agentv1.FileService_WatchClient) *agentv1.WatchEvent {
	t.Helper()
	type res struct {
		ev  *agentv1.WatchEvent
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ev, err := st.Recv()
		ch <- res{ev, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("watch stream: %v", r.err)
		}
		return r.ev
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event within 5 s")
	}
	return nil
}

func TestWatchGRPC(t *testing.T) {
	fsys := newTestFS(t, Config{})
	c := startGRPC(t, fsys)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.Watch(ctx, &agentv1.WatchRequest{Path: dir, Recursive: true, DebounceMs: 10})
	if err != nil {
		t.Fatal(err)
	}
	if ev := recvWatch(t, st); ev.GetKind() != agentv1.WatchEventKind_WATCH_EVENT_KIND_READY {
		t.Fatalf("first event %v, want ready", ev)
	}
	before := time.Now()
	writeFile(t, filepath.Join(dir, "sub", "a.txt"), "a")
	want := []string{"CREATED sub true", "CREATED sub/a.txt false"}
	for _, w := range want {
		ev := recvWatch(t, st)
		got := fmt.Sprintf("%s %s %v", ev.GetKind().String()[len("WATCH_EVENT_KIND_"):], ev.GetPath(), ev.GetIsDir())
		if got != w {
			t.Fatalf("event %q, want %q", got, w)
		}
		if at := ev.GetTime().AsTime(); at.Before(before.Add(-time.Second)) || at.After(time.Now()) {
			t.Fatalf("event time %v, want about %v", at, before)
		}
	}
	if err := os.Rename(filepath.Join(dir, "sub", "a.txt"), filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	if ev := recvWatch(t, st); ev.GetKind() != agentv1.WatchEventKind_WATCH_EVENT_KIND_RENAMED || ev.GetPath() != "b.txt" || ev.GetOldPath() != "sub/a.txt" {
		t.Fatalf("rename event %v", ev)
	}
	if w, d := fsys.watches.InUse(); w != 1 || d != 2 {
		t.Fatalf("in use: %d watches, %d directories; want 1 and 2", w, d)
	}
	// The client goes away: the watch ends and gives its budget back.
	cancel()
	waitFor(t, "the watch to end", func() bool { w, d := fsys.watches.InUse(); return w == 0 && d == 0 })

	// The watched directory goes: a removed event for it, then the end.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	gone := filepath.Join(dir, "gone")
	if err := os.Mkdir(gone, 0o755); err != nil {
		t.Fatal(err)
	}
	st, err = c.Watch(ctx2, &agentv1.WatchRequest{Path: gone})
	if err != nil {
		t.Fatal(err)
	}
	recvWatch(t, st)
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	if ev := recvWatch(t, st); ev.GetKind() != agentv1.WatchEventKind_WATCH_EVENT_KIND_REMOVED || ev.GetPath() != "" {
		t.Fatalf("event %v, want the directory's removal", ev)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the directory went: %v, want the end of the stream", err)
	}
}

func TestWatchRefused(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "file"), "f")
	for i := range 4 {
		if err := os.Mkdir(filepath.Join(dir, fmt.Sprintf("d%d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fsys := newTestFS(t, Config{MaxWatches: 2, MaxWatchDirs: 4})
	c := startGRPC(t, fsys)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchErr := func(req *agentv1.WatchRequest) error {
		st, err := c.Watch(ctx, req)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	for _, tc := range []struct {
		req  *agentv1.WatchRequest
		code codes.Code
	}{
		{&agentv1.WatchRequest{Path: "rel"}, codes.InvalidArgument},
		{&agentv1.WatchRequest{Path: dir, DebounceMs: 20000}, codes.InvalidArgument},
		{&agentv1.WatchRequest{Path: dir + "/missing"}, codes.NotFound},
		{&agentv1.WatchRequest{Path: dir + "/file"}, codes.FailedPrecondition},
		// 5 directories with the root: over the budget of 4.
		{&agentv1.WatchRequest{Path: dir, Recursive: true}, codes.ResourceExhausted},
	} {
		if err := watchErr(tc.req); status.Code(err) != tc.code {
			t.Errorf("Watch(%v): %v, want %v", tc.req, err, tc.code)
		}
	}
	// Two watches run; a third is refused.
	for range 2 {
		st, err := c.Watch(ctx, &agentv1.WatchRequest{Path: dir})
		if err != nil {
			t.Fatal(err)
		}
		recvWatch(t, st)
	}
	if err := watchErr(&agentv1.WatchRequest{Path: dir}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third watch: %v, want RESOURCE_EXHAUSTED", err)
	}
	cancel()
	waitFor(t, "the watches to end", func() bool { w, d := fsys.watches.InUse(); return w == 0 && d == 0 })
}

// TestWatchAsUser: with Config.AsUser a watch sees only what the user may
// read: a directory the user cannot read is PermissionDenied, and such a
// directory below a watched one is skipped.
func TestWatchAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "switching file-system ids needs root")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // testing makes them 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mine, private := filepath.Join(dir, "mine"), filepath.Join(dir, "mine", "private")
	for _, d := range []string{mine, private} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(mine, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(private, 0o700); err != nil { // root's
		t.Fatal(err)
	}
	fsys := New(Config{AsUser: &Identity{UID: 1000, GID: 1000}, Logger: discardLogger()})
	ctx := context.Background()
	if _, err := fsys.Watch(ctx, private, WatchOptions{}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("watching root's 0700 directory as 1000: %v, want PermissionDenied", err)
	}
	w, err := fsys.Watch(ctx, mine, WatchOptions{Recursive: true, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if ev := <-w.Events(); ev.Kind.String() != "ready" {
		t.Fatalf("first event %v", ev)
	}
	if _, d := fsys.watches.InUse(); d != 1 {
		t.Fatalf("%d directories watched, want 1 (private skipped)", d)
	}
	writeFile(t, filepath.Join(mine, "x"), "x")
	select {
	case ev := <-w.Events():
		if ev.Path != "x" {
			t.Fatalf("event %+v, want x", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	// The agent's own thread identity is root's again.
	if err := os.WriteFile(filepath.Join(private, "still-root"), []byte("r"), 0o600); err != nil {
		t.Fatalf("the agent lost root after the watch: %v", err)
	}
}
