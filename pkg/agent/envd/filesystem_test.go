package envd

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	pb "github.com/berth-dev/berth/proto/e2b/envd/filesystem"
	"github.com/berth-dev/berth/proto/e2b/envd/filesystem/filesystemconnect"
)

// TestFilesystemOps: MakeDir (relative, with parents; again is
// already_exists), Stat, ListDir at depths 1 and 2, Move, Remove, with
// both codecs.
func TestFilesystemOps(t *testing.T) {
	for i, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, "")
			fs := []filesystemconnect.FilesystemClient{e.fs, e.fsJS}[i]
			ctx := ctxT(t)
			mk, err := fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: "a/b"}))
			if err != nil {
				t.Fatal(err)
			}
			if ent := mk.Msg.Entry; ent.Path != filepath.Join(e.workDir, "a/b") || ent.Name != "b" || ent.Type != pb.FileType_FILE_TYPE_DIRECTORY ||
				ent.Permissions != "drwxr-xr-x" || ent.Mode != 0o755 || ent.Owner == "" || ent.ModifiedTime == nil {
				t.Fatalf("mkdir entry = %v", ent)
			}
			if _, err := fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: "a/b"})); codeOf(err) != connect.CodeAlreadyExists {
				t.Fatalf("second mkdir: %v", err)
			}
			if err := os.WriteFile(filepath.Join(e.workDir, "a/b/f.txt"), []byte("12345"), 0o640); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("b/f.txt", filepath.Join(e.workDir, "a/link")); err != nil {
				t.Fatal(err)
			}
			st, err := fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: filepath.Join(e.workDir, "a/b/f.txt")}))
			if err != nil {
				t.Fatal(err)
			}
			if ent := st.Msg.Entry; ent.Type != pb.FileType_FILE_TYPE_FILE || ent.Size != 5 || ent.Permissions != "-rw-r-----" || ent.SymlinkTarget != nil {
				t.Fatalf("stat = %v", ent)
			}
			ln, err := fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: "a/link"}))
			if err != nil {
				t.Fatal(err)
			}
			if ent := ln.Msg.Entry; ent.Type != pb.FileType_FILE_TYPE_SYMLINK || ent.GetSymlinkTarget() != "b/f.txt" {
				t.Fatalf("stat link = %v", ent)
			}

			names := func(depth uint32) []string {
				t.Helper()
				res, err := fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: "a", Depth: depth}))
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, ent := range res.Msg.Entries {
					rel, _ := filepath.Rel(e.workDir, ent.Path)
					out = append(out, rel)
				}
				return out
			}
			if got, want := names(1), []string{"a/b", "a/link"}; !slices.Equal(got, want) {
				t.Errorf("depth 1: %v, want %v", got, want)
			}
			if got, want := names(2), []string{"a/b", "a/b/f.txt", "a/link"}; !slices.Equal(got, want) {
				t.Errorf("depth 2: %v, want %v", got, want)
			}

			mv, err := fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: "a/b/f.txt", Destination: "a/g.txt"}))
			if err != nil {
				t.Fatal(err)
			}
			if mv.Msg.Entry.Path != filepath.Join(e.workDir, "a/g.txt") || mv.Msg.Entry.Size != 5 {
				t.Fatalf("move entry = %v", mv.Msg.Entry)
			}
			if _, err := os.Stat(filepath.Join(e.workDir, "a/b/f.txt")); !os.IsNotExist(err) {
				t.Fatalf("source still there: %v", err)
			}
			if _, err := fs.Remove(ctx, connect.NewRequest(&pb.RemoveRequest{Path: "a"})); err != nil {
				t.Fatal(err)
			}
			if _, err := fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: "a"})); codeOf(err) != connect.CodeNotFound {
				t.Fatalf("stat after remove: %v", err)
			}
			if _, err := fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: "missing"})); codeOf(err) != connect.CodeNotFound {
				t.Fatalf("list missing: %v", err)
			}
			if err := os.WriteFile(filepath.Join(e.workDir, "plain"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: "plain"})); codeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("list a file: %v", err)
			}
			if _, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: "plain"})); codeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("watch a file: %v", err)
			}
		})
	}
}

// TestWatchDir streams a recursive watch with both codecs: start, then a
// created file (with its entry), a write, a rename, a removal.
func TestWatchDir(t *testing.T) {
	for i, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, "")
			fs := []filesystemconnect.FilesystemClient{e.fs, e.fsJS}[i]
			ctx := ctxT(t)
			dir := filepath.Join(e.workDir, "w")
			if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			req := connect.NewRequest(&pb.WatchDirRequest{Path: "w", Recursive: true, IncludeEntry: true})
			req.Header().Set(KeepaliveHeader, "60")
			st, err := fs.WatchDir(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			evs := make(chan *pb.WatchDirResponse, 100)
			go func() {
				defer close(evs)
				for st.Receive() {
					evs <- st.Msg()
				}
			}()
			nextFS := func() *pb.FilesystemEvent {
				t.Helper()
				select {
				case ev, ok := <-evs:
					if !ok {
						t.Fatalf("watch ended: %v", st.Err())
					}
					if ev.GetFilesystem() == nil {
						t.Fatalf("event %v, want a filesystem event", ev)
					}
					return ev.GetFilesystem()
				case <-time.After(30 * time.Second):
					t.Fatal("no event within 30s")
				}
				return nil
			}
			select {
			case ev := <-evs:
				if ev.GetStart() == nil {
					t.Fatalf("first event %v, want start", ev)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no start event")
			}
			f := filepath.Join(dir, "sub/new.txt")
			if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			if ev := nextFS(); ev.Name != "sub/new.txt" || ev.Type != pb.EventType_EVENT_TYPE_CREATE || ev.GetEntry().GetSize() != 1 {
				t.Fatalf("event %v, want sub/new.txt created", ev)
			}
			if err := os.WriteFile(f, []byte("xyz"), 0o644); err != nil {
				t.Fatal(err)
			}
			if ev := nextFS(); ev.Name != "sub/new.txt" || ev.Type != pb.EventType_EVENT_TYPE_WRITE {
				t.Fatalf("event %v, want sub/new.txt written", ev)
			}
			if err := os.Rename(f, filepath.Join(dir, "moved.txt")); err != nil {
				t.Fatal(err)
			}
			if ev := nextFS(); ev.Name != "sub/new.txt" || ev.Type != pb.EventType_EVENT_TYPE_RENAME {
				t.Fatalf("event %v, want sub/new.txt renamed", ev)
			}
			if ev := nextFS(); ev.Name != "moved.txt" || ev.Type != pb.EventType_EVENT_TYPE_CREATE {
				t.Fatalf("event %v, want moved.txt created", ev)
			}
			if err := os.Remove(filepath.Join(dir, "moved.txt")); err != nil {
				t.Fatal(err)
			}
			if ev := nextFS(); ev.Name != "moved.txt" || ev.Type != pb.EventType_EVENT_TYPE_REMOVE || ev.Entry != nil {
				t.Fatalf("event %v, want moved.txt removed", ev)
			}
		})
	}
}

// TestPollWatcher: CreateWatcher, then GetWatcherEvents until the created
// file shows up, then RemoveWatcher; the id is unknown after.
func TestPollWatcher(t *testing.T) {
	e := newEnv(t, "")
	ctx := ctxT(t)
	if _, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: "missing"})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("watch missing dir: %v", err)
	}
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: e.workDir}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.WatcherId
	if err := os.WriteFile(filepath.Join(e.workDir, "p.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var got []*pb.FilesystemEvent
	for len(got) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no event within 30s")
		}
		res, err := e.fsJS.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		got = res.Msg.Events
		if len(got) == 0 {
			time.Sleep(20 * time.Millisecond) // poll, as the SDK does
		}
	}
	if len(got) != 1 || got[0].Name != "p.txt" || got[0].Type != pb.EventType_EVENT_TYPE_CREATE {
		t.Fatalf("events = %v", got)
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("events of a removed watcher: %v", err)
	}
}
