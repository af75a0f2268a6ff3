package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"os"
	"os/user"
	"path"
	"strconv"
	"sync"
	"syscall"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/agent/files/watch"
	"github.com/berth-dev/berth/pkg/errdefs"
	pb "github.com/berth-dev/berth/proto/e2b/envd/filesystem"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// maxPolledEvents bounds the events a pollable watcher holds between two
// GetWatcherEvents; beyond, the oldest are dropped.
const maxPolledEvents = 10000

// fsFor returns the file service acting as id: with its file-system
// identity when the agent is root and id is not, so that what it creates
// is id's and it reaches only what id may.
func (s *Service) fsFor(id identity) *files.FS {
	key := [2]uint32{id.UID, id.GID}
	s.fsMu.Lock()
	defer s.fsMu.Unlock()
	if f, ok := s.fsByID[key]; ok {
		return f
	}
	cfg := s.cfg.Files
	if os.Geteuid() == 0 && !id.Root() {
		cfg.AsUser = &files.Identity{UID: id.UID, GID: id.GID}
		cfg.Chown = nil
	}
	f := files.New(cfg)
	s.fsByID[key] = f
	return f
}

// entryInfo describes fi as envd does; owner and group are names when
// /etc/passwd and /etc/group know them.
func entryInfo(fi files.FileInfo) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		ModifiedTime: timestamppb.New(fi.ModTime),
	}
	mode := fi.Mode
	switch fi.Type {
	case files.TypeFile:
		e.Type = pb.FileType_FILE_TYPE_FILE
	case files.TypeDir:
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
		mode |= fs.ModeDir
	case files.TypeSymlink:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		mode |= fs.ModeSymlink
		target := fi.SymlinkTarget
		e.SymlinkTarget = &target
	}
	e.Permissions = mode.String()
	var st syscall.Stat_t
	if syscall.Lstat(fi.Path, &st) == nil {
		e.Owner, e.Group = strconv.FormatUint(uint64(st.Uid), 10), strconv.FormatUint(uint64(st.Gid), 10)
		if u, err := user.LookupId(e.Owner); err == nil {
			e.Owner = u.Username
		}
		if g, err := user.LookupGroupId(e.Group); err == nil {
			e.Group = g.Name
		}
	}
	return e
}

// notDir turns the file service's FailedPrecondition for a path that is
// not a directory (List, Watch) into envd's InvalidArgument.
func notDir(p string, err error) error {
	if errdefs.IsFailedPrecondition(err) {
		return errdefs.InvalidArgument("path", "%s is not a directory", p)
	}
	return err
}

// filesystemService implements filesystemconnect.FilesystemHandler.
type filesystemService struct {
	s *Service
}

func (f *filesystemService) stat(ctx context.Context, p string) (*pb.EntryInfo, error) {
	id := identityFrom(ctx)
	fi, err := f.s.fsFor(id).Stat(ctx, id.abs(p))
	if err != nil {
		return nil, err
	}
	return entryInfo(fi), nil
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	e, err := f.stat(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

// MakeDir creates the directory and its missing parents; an existing
// path is ALREADY_EXISTS (the SDK's make_dir then answers false).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	id := identityFrom(ctx)
	p := id.abs(req.Msg.GetPath())
	fsys := f.s.fsFor(id)
	if _, err := fsys.Stat(ctx, p); err == nil {
		return nil, toConnect(errdefs.AlreadyExists("%s already exists", p))
	}
	if err := fsys.MakeDir(ctx, p, true, 0o755); err != nil {
		return nil, toConnect(err)
	}
	e, err := f.stat(ctx, p)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, replacing a destination file.
func (f *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	id := identityFrom(ctx)
	dst := id.abs(req.Msg.GetDestination())
	if err := f.s.fsFor(id).Move(ctx, id.abs(req.Msg.GetSource()), dst, true); err != nil {
		return nil, toConnect(err)
	}
	e, err := f.stat(ctx, dst)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

// ListDir lists a directory down to depth levels (0 is 1).
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	id := identityFrom(ctx)
	p := id.abs(req.Msg.GetPath())
	res, err := f.s.fsFor(id).List(ctx, p, int(req.Msg.GetDepth()))
	if err != nil {
		return nil, toConnect(notDir(p, err))
	}
	out := &pb.ListDirResponse{Entries: make([]*pb.EntryInfo, 0, len(res.Entries))}
	for _, fi := range res.Entries {
		out.Entries = append(out.Entries, entryInfo(fi))
	}
	return connect.NewResponse(out), nil
}

// Remove deletes a file, a symlink or a directory with its contents.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	id := identityFrom(ctx)
	if err := f.s.fsFor(id).Remove(ctx, id.abs(req.Msg.GetPath()), true); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// fsEvents turns a watch event into envd's: a rename is the old name's
// RENAME and the new name's CREATE, as inotify reports them.
func (s *Service) fsEvents(ctx context.Context, root string, ev watch.Event, withEntry bool) []*pb.FilesystemEvent {
	mk := func(name string, t pb.EventType) *pb.FilesystemEvent {
		out := &pb.FilesystemEvent{Name: name, Type: t}
		if withEntry && t != pb.EventType_EVENT_TYPE_REMOVE && t != pb.EventType_EVENT_TYPE_RENAME {
			id := identityFrom(ctx)
			if fi, err := s.fsFor(id).Stat(ctx, path.Join(root, name)); err == nil {
				out.Entry = entryInfo(fi)
			}
		}
		return out
	}
	switch ev.Kind {
	case watch.KindCreated:
		return []*pb.FilesystemEvent{mk(ev.Path, pb.EventType_EVENT_TYPE_CREATE)}
	case watch.KindModified:
		return []*pb.FilesystemEvent{mk(ev.Path, pb.EventType_EVENT_TYPE_WRITE)}
	case watch.KindRemoved:
		return []*pb.FilesystemEvent{mk(ev.Path, pb.EventType_EVENT_TYPE_REMOVE)}
	case watch.KindRenamed:
		return []*pb.FilesystemEvent{mk(ev.OldPath, pb.EventType_EVENT_TYPE_RENAME), mk(ev.Path, pb.EventType_EVENT_TYPE_CREATE)}
	}
	return nil
}

// WatchDir streams the changes in a directory: a start event once it is
// watched, then one event per change, with keepalives as the request's
// KeepaliveHeader asks. The stream ends when the directory is removed.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	id := identityFrom(ctx)
	root := id.abs(req.Msg.GetPath())
	w, err := f.s.fsFor(id).Watch(ctx, root, files.WatchOptions{Recursive: req.Msg.GetRecursive()})
	if err != nil {
		return toConnect(notDir(root, err))
	}
	defer w.Close()
	send := serialize(stream.Send)
	stop := keepalive(ctx, keepaliveInterval(req.Header()), func() error {
		return send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}})
	})
	defer stop()
	for ev := range w.Events() {
		switch {
		case ev.Kind == watch.KindReady:
			if err := send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
				return err
			}
			continue
		case ev.Kind == watch.KindOverflow:
			f.s.log.Warn("envd watch lost events", "path", root)
			continue
		}
		for _, fe := range f.s.fsEvents(ctx, w.Root(), ev, req.Msg.GetIncludeEntry()) {
			if err := send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
				return err
			}
		}
	}
	if err := w.Err(); err != nil && ctx.Err() == nil {
		return toConnect(err)
	}
	return nil
}

// pollWatcher is a watch whose events GetWatcherEvents collects.
type pollWatcher struct {
	w      *watch.Watcher
	mu     sync.Mutex
	events []*pb.FilesystemEvent
	err    error
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	s := f.s
	id := identityFrom(ctx)
	root := id.abs(req.Msg.GetPath())
	w, err := s.fsFor(id).Watch(s.ctx, root, files.WatchOptions{Recursive: req.Msg.GetRecursive()})
	if err != nil {
		return nil, toConnect(notDir(root, err))
	}
	// The first event says the directory is watched: from then on every
	// change is collected.
	if ev, ok := <-w.Events(); !ok || ev.Kind != watch.KindReady {
		w.Close()
		if err := w.Err(); err != nil {
			return nil, toConnect(err)
		}
		return nil, toConnect(errdefs.Internal("watch %s ended before it started", root))
	}
	pw := &pollWatcher{w: w}
	var b [8]byte
	_, _ = rand.Read(b[:])
	wid := "w-" + hex.EncodeToString(b[:])
	s.watchMu.Lock()
	s.watchers[wid] = pw
	s.watchMu.Unlock()
	evCtx := context.WithValue(s.ctx, identityKey{}, id)
	withEntry := req.Msg.GetIncludeEntry()
	go func() {
		for ev := range w.Events() {
			fes := s.fsEvents(evCtx, w.Root(), ev, withEntry)
			pw.mu.Lock()
			pw.events = append(pw.events, fes...)
			if n := len(pw.events) - maxPolledEvents; n > 0 {
				pw.events = append(pw.events[:0], pw.events[n:]...)
			}
			pw.mu.Unlock()
		}
		pw.mu.Lock()
		pw.err = w.Err()
		pw.mu.Unlock()
	}()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: wid}), nil
}

func (s *Service) pollWatcher(wid string) (*pollWatcher, error) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	pw, ok := s.watchers[wid]
	if !ok {
		return nil, errdefs.NotFound("watcher %q not found", wid)
	}
	return pw, nil
}

// GetWatcherEvents returns the events since the last call; once the watch
// ended with an error and every event was returned, that error.
func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	pw, err := f.s.pollWatcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, toConnect(err)
	}
	pw.mu.Lock()
	evs, werr := pw.events, pw.err
	pw.events = nil
	pw.mu.Unlock()
	if len(evs) == 0 && werr != nil {
		return nil, toConnect(werr)
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	s := f.s
	s.watchMu.Lock()
	pw, ok := s.watchers[req.Msg.GetWatcherId()]
	delete(s.watchers, req.Msg.GetWatcherId())
	s.watchMu.Unlock()
	if !ok {
		return nil, toConnect(errdefs.NotFound("watcher %q not found", req.Msg.GetWatcherId()))
	}
	pw.w.Close()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
