package watch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/fsnotify/fsnotify"
)

// Defaults and bounds of Options.
const (
	// DefaultDebounce is the default of Options.Debounce.
	DefaultDebounce = 50 * time.Millisecond
	// MaxDebounce is the longest Options.Debounce.
	MaxDebounce = 10 * time.Second
	// DefaultBuffer is the default of Options.Buffer.
	DefaultBuffer = 8192
	// maxWaitFactor and maxWait bound how long the changes of a path are
	// held while they keep coming: this many debounce periods, at most
	// maxWait (or the debounce, when that is longer).
	maxWaitFactor = 20
	maxWait       = time.Second
)

// Budget bounds the directories that watches may watch together.
type Budget interface {
	// Acquire takes n directories, or fails with an
	// errdefs.ErrResourceExhausted error.
	Acquire(n int) error
	// Release gives n directories back.
	Release(n int)
}

// Options configures Start.
type Options struct {
	// Recursive watches every directory below the root too. Default
	// false: only the root's own entries.
	Recursive bool
	// Debounce is the quiet time after which held changes are reported;
	// default 50 ms, at most 10 s (longer is cut to 10 s).
	Debounce time.Duration
	// Buffer bounds the events held or waiting for the reader; beyond it
	// they are replaced by one KindOverflow event. Default 8192.
	Buffer int
	// Dirs, when set, is charged one unit per watched directory.
	Dirs Budget
	// As runs fn, which touches the file system (stat, read a directory,
	// add an inotify watch), with the identity the watch acts as.
	// Default: fn is called as is.
	As func(fn func() error) error
	// MapErr turns a file-system error into one with an errdefs category
	// (op is what failed, path the absolute path). Default: returned as
	// is.
	MapErr func(op, path string, err error) error
	// Logger receives the watch's debug logs; default slog.Default().
	Logger *slog.Logger
	// OnEnd, when set, is called once the watch has ended and released
	// its inotify instance and budget (not when Start fails).
	OnEnd func()
	// Hidden, when set, names the files a watch does not report (by base
	// name): the temporary files of the agent's own uploads. A file moved
	// from a hidden name onto a shown one is reported as that path's
	// creation (a modification when it was removed in the same burst), one
	// moved onto a hidden name as the removal of its old path.
	Hidden func(name string) bool
}

// Watcher is a running watch. Read its events from Events until the
// channel is closed, then Err says why it ended.
type Watcher struct {
	root string // absolute, symlinks resolved
	opts Options
	log  *slog.Logger
	fsw  *fsnotify.Watcher
	tree *dirTree
	b    *burst
	held *fsnotify.Event // a move-from waiting for its move-to
	// heldAt is when held came; it is taken as a move out of the tree
	// (a removal) moveToWait after that at the earliest.
	heldAt time.Time
	moved  map[string]bool // directories moved or removed in this burst
	// ending is set once the watch has reported its last event.
	ending bool

	out  chan Event
	done chan struct{}
	stop context.CancelFunc
	err  error
}

// Start watches the directory root (absolute and clean; a symlink to a
// directory is resolved) until ctx ends or Close is called. It returns
// once every directory is watched; the first event is then KindReady.
func Start(ctx context.Context, root string, opts Options) (*Watcher, error) {
	w, err := newWatcher(root, opts)
	if err != nil {
		return nil, err
	}
	ctx, w.stop = context.WithCancel(ctx)
	go w.run(ctx)
	return w, nil
}

// newWatcher sets a watch up (every directory watched, the ready event
// queued) without starting its goroutine.
func newWatcher(root string, opts Options) (*Watcher, error) {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	opts.Debounce = min(opts.Debounce, MaxDebounce)
	if opts.Buffer <= 0 {
		opts.Buffer = DefaultBuffer
	}
	if opts.As == nil {
		opts.As = func(fn func() error) error { return fn() }
	}
	if opts.MapErr == nil {
		opts.MapErr = func(op, p string, err error) error { return fmt.Errorf("%s %s: %w", op, p, err) }
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &Watcher{
		opts: opts, log: opts.Logger, tree: newDirTree(),
		b:     newBurst(opts.Buffer, opts.Debounce, max(opts.Debounce, min(maxWaitFactor*opts.Debounce, maxWait))),
		moved: map[string]bool{},
		out:   make(chan Event), done: make(chan struct{}),
	}
	err := opts.As(func() error {
		real, err := filepath.EvalSymlinks(root)
		if err != nil {
			return opts.MapErr("watch", root, err)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return opts.MapErr("watch", root, err)
		}
		if !fi.IsDir() {
			return errdefs.FailedPrecondition("watch %s: not a directory", root)
		}
		w.root = real
		return nil
	})
	if err != nil {
		return nil, err
	}
	w.fsw, err = fsnotify.NewBufferedWatcher(1024)
	if err != nil {
		return nil, opts.MapErr("watch: inotify", root, err)
	}
	if err := w.addTree("", false, time.Now()); err != nil {
		w.release()
		return nil, err
	}
	w.b.queue = append(w.b.queue, Event{Kind: KindReady, IsDir: true, Time: time.Now()})
	return w, nil
}

// Events returns the events, closed when the watch ends: ctx ended, Close
// was called, the watched directory went away (after a KindRemoved event
// with an empty path), or a limit was reached (see Err).
func (w *Watcher) Events() <-chan Event { return w.out }

// Err returns why the watch ended, once Events is closed: nil when ctx
// ended, Close was called or the directory went away; an
// errdefs.ErrResourceExhausted error when the watch outgrew its limits.
func (w *Watcher) Err() error { return w.err }

// Close stops the watch and waits until its goroutine and inotify
// instance are gone.
func (w *Watcher) Close() {
	w.stop()
	<-w.done
}

// Root returns the watched directory, symlinks resolved.
func (w *Watcher) Root() string { return w.root }

// release closes the inotify instance and gives the budget back.
func (w *Watcher) release() {
	_ = w.fsw.Close()
	if w.opts.Dirs != nil && w.tree.watched > 0 {
		w.opts.Dirs.Release(w.tree.watched)
	}
	w.tree.watched = 0
}

// run is the watch's goroutine: it reads inotify's events into the burst,
// reports the burst when it is due and hands events to the reader.
func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	defer close(w.out)
	defer func() {
		w.release()
		if w.opts.OnEnd != nil {
			w.opts.OnEnd()
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, held := w.b.due()
		if w.held != nil {
			if hd := w.heldDue(); !held || hd.Before(due) {
				due, held = hd, true
			}
		}
		if held {
			timer.Reset(time.Until(due))
		} else {
			timer.Stop()
		}
		var (
			send   chan<- Event
			next   Event
			events <-chan fsnotify.Event
			errs   <-chan error
		)
		if len(w.b.queue) > 0 {
			send, next = w.out, w.b.queue[0]
		}
		if !w.ending {
			events, errs = w.fsw.Events, w.fsw.Errors
		} else if send == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			w.handle(ev, time.Now())
		case err, ok := <-errs:
			if !ok {
				return
			}
			w.handleErr(err, time.Now())
		case <-timer.C:
			w.tick(time.Now(), events)
		case send <- next:
			w.b.queue[0] = Event{}
			w.b.queue = w.b.queue[1:]
		}
	}
}

// rel returns name relative to the root, and whether it is under it.
func (w *Watcher) rel(name string) (string, bool) {
	if name == w.root {
		return "", true
	}
	r, ok := strings.CutPrefix(name, w.root+"/")
	return r, ok && r != ""
}

// abs returns the absolute path of rel.
func (w *Watcher) abs(rel string) string {
	if rel == "" {
		return w.root
	}
	return w.root + "/" + rel
}

// renamedFrom returns where fsnotify says ev's path was moved from, or "".
// fsnotify keeps it unexported and shows it only in Event.String
// ("CREATE  "new" ← "old""), so it is read back from there; a format
// change makes renames look like a removal and a creation, nothing worse.
func renamedFrom(ev fsnotify.Event) string {
	prefix := fmt.Sprintf("%-13s %q ← ", ev.Op.String(), ev.Name)
	old, ok := strings.CutPrefix(ev.String(), prefix)
	if !ok {
		return ""
	}
	s, err := strconv.Unquote(old)
	if err != nil {
		return ""
	}
	return s
}

// handle merges one inotify event into the burst.
func (w *Watcher) handle(ev fsnotify.Event, now time.Time) {
	if h := w.held; h != nil {
		w.held = nil
		if ev.Has(fsnotify.Create) && renamedFrom(ev) == h.Name {
			w.onRename(h.Name, ev.Name, now)
			return
		}
		w.onGone(h.Name, now) // moved out of the watched tree
	}
	rel, ok := w.rel(ev.Name)
	if !ok || w.ending {
		return
	}
	if w.hidden(rel) && !ev.Has(fsnotify.Rename) {
		return // a move-from is held: its move-to may show a file
	}
	switch {
	case ev.Has(fsnotify.Create):
		w.onCreate(rel, now)
	case ev.Has(fsnotify.Remove):
		w.onGone(ev.Name, now)
	case ev.Has(fsnotify.Rename):
		if w.moved[rel] {
			return // a moved directory's own "moved" event: already handled
		}
		if rel == "" {
			w.onGone(ev.Name, now)
			return
		}
		// A move-from: the move-to that follows, if the target is watched
		// too, makes it a rename.
		held := ev
		w.held, w.heldAt = &held, now
	case ev.Has(fsnotify.Write), ev.Has(fsnotify.Chmod):
		w.b.record(rel, KindModified, w.tree.isDir(rel), now)
	}
}

// tick handles the timer at now: a held move-from past its wait is taken
// as a removal, unless an event is already queued on events (the next one
// may be its move-to); the held changes due are reported.
func (w *Watcher) tick(now time.Time, events <-chan fsnotify.Event) {
	if w.held != nil && !now.Before(w.heldDue()) {
		if len(events) > 0 {
			w.handle(<-events, now)
		} else {
			w.resolveHeld(now)
		}
	}
	if due, ok := w.b.due(); ok && !now.Before(due) {
		w.b.flushDue(now)
		clear(w.moved)
	}
}

// moveToWait is how long a move-from waits at least for its move-to
// before it is taken as a move out of the watched tree. inotify queues the
// two together, so a move-to is only as late as fsnotify's reader
// goroutine, which on a busy machine can be descheduled for tens of
// milliseconds; the debounce, when longer, is waited instead.
const moveToWait = 250 * time.Millisecond

// heldDue is when the held move-from is taken as a removal if no move-to
// came.
func (w *Watcher) heldDue() time.Time {
	return w.heldAt.Add(max(w.opts.Debounce, moveToWait))
}

// resolveHeld reports a held move-from whose move-to did not come as a
// removal.
func (w *Watcher) resolveHeld(now time.Time) {
	if h := w.held; h != nil {
		w.held = nil
		w.onGone(h.Name, now)
	}
}

// handleErr handles fsnotify's errors: a kernel queue overflow is reported
// and the tree walked again; the rest is logged.
func (w *Watcher) handleErr(err error, now time.Time) {
	if !errors.Is(err, fsnotify.ErrEventOverflow) {
		w.log.Warn("watch: inotify error", "path", w.root, "error", err)
		return
	}
	w.held = nil
	clear(w.moved)
	w.b.overflow(now)
	if err := w.rescan(now); err != nil {
		w.fail(err)
	}
}

func (w *Watcher) onCreate(rel string, now time.Time) {
	var isDir bool
	_ = w.opts.As(func() error {
		fi, err := os.Lstat(w.abs(rel))
		isDir = err == nil && fi.IsDir()
		return nil
	})
	w.b.record(rel, KindCreated, isDir, now)
	if w.tree.isDir(rel) {
		w.forget(rel) // replaced (moved over): the kernel dropped its watch
	}
	if !isDir {
		return
	}
	delete(w.moved, rel)
	if w.opts.Recursive {
		if err := w.addTree(rel, true, now); err != nil {
			w.fail(err)
		}
		return
	}
	w.tree.add(rel)
}

// onGone handles a path removed or moved out; the root's removal ends the
// watch.
func (w *Watcher) onGone(name string, now time.Time) {
	rel, ok := w.rel(name)
	if !ok {
		return
	}
	if rel == "" {
		w.b.emit(Event{Kind: KindRemoved, IsDir: true, Time: now})
		w.ending = true
		return
	}
	if w.hidden(rel) {
		return
	}
	isDir := w.tree.isDir(rel)
	if isDir {
		w.forget(rel)
	}
	w.b.record(rel, KindRemoved, isDir, now)
}

// hidden reports whether rel's events are not reported (Options.Hidden).
func (w *Watcher) hidden(rel string) bool {
	return w.opts.Hidden != nil && rel != "" && w.opts.Hidden(path.Base(rel))
}

// onRename handles a move within the watched tree.
func (w *Watcher) onRename(oldName, newName string, now time.Time) {
	oldRel, ok1 := w.rel(oldName)
	newRel, ok2 := w.rel(newName)
	if !ok1 || !ok2 || oldRel == "" {
		return
	}
	switch hideOld, hideNew := w.hidden(oldRel), w.hidden(newRel); {
	case hideOld && hideNew:
		return
	case hideOld:
		// An upload's temporary file moved into place.
		w.onCreate(newRel, now)
		return
	case hideNew:
		w.onGone(oldName, now)
		return
	}
	isDir := w.tree.isDir(oldRel)
	w.b.rename(oldRel, newRel, isDir, now)
	if !isDir {
		return
	}
	if w.tree.isDir(newRel) {
		w.forget(newRel) // an empty directory replaced by the move
	}
	w.forget(oldRel)
	delete(w.moved, newRel)
	if w.opts.Recursive {
		if err := w.addTree(newRel, false, now); err != nil {
			w.fail(err)
		}
		return
	}
	w.tree.add(newRel)
}

// forget drops the watches of directory rel and everything below it.
func (w *Watcher) forget(rel string) {
	for _, d := range w.tree.remove(rel) {
		w.moved[d.rel] = true
		if d.watched {
			_ = w.fsw.Remove(w.abs(d.rel)) // the kernel may have dropped it already
			if w.opts.Dirs != nil {
				w.opts.Dirs.Release(1)
			}
		}
	}
}

// fail ends the watch with err after what was reported so far.
func (w *Watcher) fail(err error) {
	if w.err == nil {
		w.err = err
	}
	w.b.flush()
	w.ending = true
}

// addTree watches directory rel (and, for a recursive watch, every
// directory below it). With report, every entry found below rel is
// recorded as created: it appeared with rel.
func (w *Watcher) addTree(rel string, report bool, now time.Time) error {
	return w.opts.As(func() error {
		stack := []string{rel}
		for len(stack) > 0 {
			d := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if err := w.addDir(d); err != nil {
				if d == "" || errdefs.IsResourceExhausted(err) {
					return err
				}
				w.log.Debug("watch: skipping directory", "path", w.abs(d), "error", err)
				continue
			}
			ents, err := os.ReadDir(w.abs(d))
			if err != nil {
				if d == "" {
					return w.opts.MapErr("watch", w.root, err)
				}
				w.log.Debug("watch: skipping unreadable directory", "path", w.abs(d), "error", err)
				continue
			}
			for i := len(ents) - 1; i >= 0; i-- { // pushed backwards, popped in order
				child := path.Join(d, ents[i].Name())
				isDir := ents[i].IsDir() // a symlink is not: never followed
				if isDir {
					w.tree.add(child)
					if w.opts.Recursive {
						stack = append(stack, child)
					}
				}
			}
			if report {
				for _, e := range ents {
					w.b.record(path.Join(d, e.Name()), KindCreated, e.IsDir(), now)
				}
			}
		}
		return nil
	})
}

// addDir adds the inotify watch of directory rel, once.
func (w *Watcher) addDir(rel string) error {
	n := w.tree.add(rel)
	if n.watched {
		return nil
	}
	if w.opts.Dirs != nil {
		if err := w.opts.Dirs.Acquire(1); err != nil {
			return fmt.Errorf("watch %s: %w", w.root, err)
		}
	}
	abs := w.abs(rel)
	err := w.fsw.Add(abs)
	if err == nil {
		// inotify follows symlinks: a directory swapped for one since it
		// was listed is dropped again, so the watch stays inside.
		if fi, lerr := os.Lstat(abs); lerr != nil || !fi.IsDir() {
			_ = w.fsw.Remove(abs)
			err = fs.ErrNotExist
		}
	}
	if err != nil {
		if w.opts.Dirs != nil {
			w.opts.Dirs.Release(1)
		}
		return w.opts.MapErr("watch", abs, err)
	}
	n.watched = true
	w.tree.watched++
	return nil
}

// rescan walks the tree again after an overflow: directories that
// appeared are watched, those that went are forgotten.
func (w *Watcher) rescan(now time.Time) error {
	var gone []string
	_ = w.opts.As(func() error {
		for rel := range w.tree.nodes {
			if fi, err := os.Lstat(w.abs(rel)); err != nil || !fi.IsDir() {
				gone = append(gone, rel)
			}
		}
		return nil
	})
	for _, rel := range gone {
		if rel == "" {
			w.onGone(w.root, now)
			return nil
		}
		if w.tree.nodes[rel] != nil {
			w.forget(rel)
		}
	}
	return w.addTree("", false, now)
}
