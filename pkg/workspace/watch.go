package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/agent/files/watch"
	"github.com/berth-dev/berth/pkg/errdefs"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// WatchOptions configures Workspace.Watch.
type WatchOptions struct {
	// Recursive watches every directory below the path too, including
	// those created while the watch runs. Default false: the directory's
	// own entries only.
	Recursive bool
	// Debounce is the quiet time after which a burst of changes is
	// reported; default 50ms, at most 10s (negative or longer is
	// errdefs.ErrInvalidArgument). A Remote rounds it to milliseconds.
	Debounce time.Duration
}

// WatchKind is what happened to a watched path.
type WatchKind string

// Watch event kinds.
const (
	// WatchCreated: the path exists now. A file replaced by a rename (an
	// editor's save: written under a temporary name, moved over the
	// target) is created too: treat created and modified alike.
	WatchCreated WatchKind = "created"
	// WatchModified: the content or the attributes changed.
	WatchModified WatchKind = "modified"
	// WatchRemoved: the path is gone (deleted, or moved out of the
	// watched directory). An empty Path is the watched directory itself;
	// the watch then ends.
	WatchRemoved WatchKind = "removed"
	// WatchRenamed: OldPath moved to Path, both under the watched
	// directory.
	WatchRenamed WatchKind = "renamed"
	// WatchOverflow: changes were lost (the kernel's queue, or the
	// watch's buffer for a slow reader, overflowed); list the directory
	// again.
	WatchOverflow WatchKind = "overflow"
)

// watchKinds is indexed by the agent's watch kinds (watch.Kind and
// berth.agent.v1.WatchEventKind share one order; 1 is "ready", which
// Watch consumes).
var watchKinds = [...]WatchKind{"", "ready", WatchCreated, WatchModified, WatchRemoved, WatchRenamed, WatchOverflow}

func watchKindOf(k int) WatchKind { return kindOf(watchKinds[:], k) }

// WatchEvent is one change under a watched directory. The changes of one
// path are held until it has been quiet for WatchOptions.Debounce (at most
// 20 times that, and 1s unless Debounce is longer, while they keep coming)
// and merged into one event: created then written is created, written
// then removed is removed, created then removed is nothing.
type WatchEvent struct {
	// Kind says what happened.
	Kind WatchKind
	// Path is relative to the watched directory, slash-separated; empty
	// for the directory itself.
	Path string
	// OldPath is where a renamed path was (WatchRenamed).
	OldPath string
	// IsDir is true when the path is a directory (for a removed path:
	// when the watch knew it as one).
	IsDir bool
	// Time is when the last change merged into the event was seen.
	Time time.Time
}

// watchDebounce validates WatchOptions.Debounce.
func watchDebounce(d time.Duration) error {
	if d < 0 || d > watch.MaxDebounce {
		return errdefs.InvalidArgument("debounce", "must be between 0 and %v, got %v", watch.MaxDebounce, d)
	}
	return nil
}

// watchSeq makes the sequence of a watch from next, which blocks for the
// next event (ok false at a clean end), and stop, which releases the
// watch. The sequence may be ranged over once.
func watchSeq(next func() (ev WatchEvent, ok bool, err error), stop func()) iter.Seq2[WatchEvent, error] {
	var used sync.Once
	return func(yield func(WatchEvent, error) bool) {
		first := false
		used.Do(func() { first = true })
		if !first {
			yield(WatchEvent{}, errdefs.FailedPrecondition("workspace: the events of a watch can be ranged over once"))
			return
		}
		defer stop()
		for {
			ev, ok, err := next()
			if err != nil {
				yield(WatchEvent{}, err)
				return
			}
			if !ok || !yield(ev, nil) {
				return
			}
		}
	}
}

// Watch watches a directory on the host; see Workspace. Close ends the
// watches still running.
func (l *Local) Watch(ctx context.Context, path string, opts WatchOptions) (iter.Seq2[WatchEvent, error], error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	p, err := l.paths.dir("path", path)
	if err != nil {
		return nil, err
	}
	if err := watchDebounce(opts.Debounce); err != nil {
		return nil, err
	}
	w, err := l.fs.Watch(ctx, p, files.WatchOptions{Recursive: opts.Recursive, Debounce: opts.Debounce})
	if err != nil {
		return nil, err
	}
	<-w.Events() // ready: the watch is set up
	if !l.track(w) {
		w.Close()
		return nil, ErrClosed
	}
	next := func() (WatchEvent, bool, error) {
		ev, ok := <-w.Events()
		if !ok {
			return WatchEvent{}, false, w.Err()
		}
		return WatchEvent{Kind: watchKindOf(int(ev.Kind)), Path: ev.Path, OldPath: ev.OldPath, IsDir: ev.IsDir, Time: ev.Time}, true, nil
	}
	return watchSeq(next, func() { w.Close(); l.untrack(w) }), nil
}

// track records a running watch for Close; false when closed meanwhile.
func (l *Local) track(w *watch.Watcher) bool {
	l.watchMu.Lock()
	defer l.watchMu.Unlock()
	if l.closed.Load() {
		return false
	}
	if l.watches == nil {
		l.watches = map[*watch.Watcher]struct{}{}
	}
	l.watches[w] = struct{}{}
	return true
}

func (l *Local) untrack(w *watch.Watcher) {
	l.watchMu.Lock()
	defer l.watchMu.Unlock()
	delete(l.watches, w)
}

// closeWatches ends the running watches (their sequences end).
func (l *Local) closeWatches() {
	l.watchMu.Lock()
	ws := l.watches
	l.watches = nil
	l.watchMu.Unlock()
	for w := range ws {
		w.Close()
	}
}

// Watch watches a directory in the sandbox; see Workspace.
func (r *Remote) Watch(ctx context.Context, path string, opts WatchOptions) (iter.Seq2[WatchEvent, error], error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	p, err := r.paths.dir("path", path)
	if err != nil {
		return nil, err
	}
	if err := watchDebounce(opts.Debounce); err != nil {
		return nil, err
	}
	ms := uint32(opts.Debounce / time.Millisecond)
	if ms == 0 && opts.Debounce > 0 {
		ms = 1
	}
	recv, stop, err := r.be.watch(ctx, &agentv1.WatchRequest{Path: p, Recursive: opts.Recursive, DebounceMs: ms})
	if err != nil {
		return nil, r.closedErr(err)
	}
	first, err := recv()
	switch {
	case errors.Is(err, io.EOF):
		err = errdefs.Unavailable("the watch stream ended before the watch was ready")
	case err == nil && first.GetKind() != agentv1.WatchEventKind_WATCH_EVENT_KIND_READY:
		err = fmt.Errorf("%w: watch: first event %v, want ready", errdefs.ErrInternal, first.GetKind())
	}
	if err != nil {
		stop()
		return nil, r.closedErr(err)
	}
	next := func() (WatchEvent, bool, error) {
		ev, err := recv()
		switch {
		case errors.Is(err, io.EOF):
			return WatchEvent{}, false, nil
		case err != nil && ctx.Err() != nil:
			return WatchEvent{}, false, nil // the caller ended it
		case err != nil:
			return WatchEvent{}, false, r.closedErr(err)
		}
		out := WatchEvent{
			Kind: watchKindOf(int(ev.GetKind())), Path: ev.GetPath(), OldPath: ev.GetOldPath(), IsDir: ev.GetIsDir(),
		}
		if ev.GetTime() != nil {
			out.Time = ev.GetTime().AsTime()
		}
		return out, true, nil
	}
	return watchSeq(next, stop), nil
}

// Watch watches a directory in the sandbox; see Workspace.
func (l *Leased) Watch(ctx context.Context, path string, opts WatchOptions) (iter.Seq2[WatchEvent, error], error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	return l.remote.Watch(ctx, path, opts)
}
