package watch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/fsnotify/fsnotify"
)

// start starts a watch of dir that the test closes.
func start(t *testing.T, dir string, opts Options) *Watcher {
	t.Helper()
	w, err := Start(context.Background(), dir, opts)
	if err != nil {
		t.Fatalf("Start(%s): %v", dir, err)
	}
	t.Cleanup(w.Close)
	ev := next(t, w, 5*time.Second)
	if ev.Kind != KindReady {
		t.Fatalf("first event %+v, want ready", ev)
	}
	return w
}

// next returns the next event, failing after d.
func next(t *testing.T, w *Watcher, d time.Duration) Event {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatalf("events closed (err %v)", w.Err())
		}
		return ev
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
	}
	panic("unreachable")
}

// collect reads events until none came for quiet (or the channel closed).
func collect(t *testing.T, w *Watcher, quiet time.Duration) []Event {
	t.Helper()
	var evs []Event
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return evs
			}
			evs = append(evs, ev)
		case <-time.After(quiet):
			return evs
		}
	}
}

// short renders events as "kind path[<-old][/]" for comparisons.
func short(evs []Event) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		s := ev.Kind.String() + " " + ev.Path
		if ev.OldPath != "" {
			s += "<-" + ev.OldPath
		}
		if ev.IsDir {
			s += "/"
		}
		out = append(out, s)
	}
	return out
}

func wantEvents(t *testing.T, got []Event, want ...string) {
	t.Helper()
	if g := short(got); !slices.Equal(g, want) {
		t.Fatalf("events:\n got  %q\n want %q", g, want)
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchRenamedFromParsesFsnotify(t *testing.T) {
	dir := t.TempDir()
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()
	if err := fw.Add(dir); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "a \"q\" ←"), "x")
	if err := os.Rename(filepath.Join(dir, "a \"q\" ←"), filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-fw.Events:
			if ev.Has(fsnotify.Create) && ev.Name == filepath.Join(dir, "b") {
				if got := renamedFrom(ev); got != filepath.Join(dir, "a \"q\" ←") {
					t.Fatalf("renamedFrom(%v) = %q", ev, got)
				}
				return
			}
		case <-deadline:
			t.Fatal("no move-to event")
		}
	}
}

func TestWatchBasicEvents(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "old.txt"), "old")
	w := start(t, dir, Options{Debounce: 20 * time.Millisecond})

	write(t, filepath.Join(dir, "a.txt"), "a")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created a.txt")
	write(t, filepath.Join(dir, "a.txt"), "aa")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "modified a.txt")
	if err := os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "renamed b.txt<-a.txt")
	if err := os.Chmod(filepath.Join(dir, "old.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "modified old.txt")
	if err := os.Remove(filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "removed b.txt", "created d/")
	// Not recursive: d's own entries are not reported, d's removal is.
	write(t, filepath.Join(dir, "d", "x"), "x")
	if evs := collect(t, w, 300*time.Millisecond); len(evs) != 0 {
		t.Fatalf("non-recursive watch reported %q", short(evs))
	}
	if err := os.RemoveAll(filepath.Join(dir, "d")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "removed d/")
}

// TestEditorBurst saves a file the way editors do, several times within
// one debounce window: each save writes a temporary file, renames it over
// the target and chmods it; the target is also written in place many
// times. One event per path comes out, and the temporary files none.
func TestWatchEditorBurst(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "main.go")
	write(t, target, "package main\n")
	const debounce = 150 * time.Millisecond
	w := start(t, dir, Options{Debounce: debounce})

	began := time.Now()
	for i := range 5 {
		tmp := filepath.Join(dir, fmt.Sprintf(".main.go.swp%d", i))
		write(t, tmp, fmt.Sprintf("package main // %d\n", i))
		if err := os.Rename(tmp, target); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(target, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(dir, "log.txt")
	f, err := os.Create(other)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		fmt.Fprintf(f, "line %d\n", i)
		time.Sleep(time.Millisecond)
	}
	f.Close()
	if took := time.Since(began); took > 100*time.Millisecond {
		t.Logf("the burst took %v (more than the 100 ms aimed at; the machine is slow)", took)
	}
	wantEvents(t, collect(t, w, 500*time.Millisecond), "created main.go", "created log.txt")

	// Writes in place, many in 100 ms, each within the debounce of the
	// one before: one modified. A loaded machine can hold one write back
	// past the debounce, which ends the burst early and rightly makes two
	// events: such a run says nothing, and is repeated (up to 5 times).
	for attempt := 1; ; attempt++ {
		var gap time.Duration // the longest time between two writes
		last := time.Now()
		for i := range 100 {
			write(t, target, fmt.Sprintf("v%d", i))
			now := time.Now()
			gap, last = max(gap, now.Sub(last)), now
			time.Sleep(time.Millisecond)
		}
		got := collect(t, w, 500*time.Millisecond)
		if gap < debounce*2/3 {
			wantEvents(t, got, "modified main.go")
			return
		}
		if attempt == 5 {
			t.Fatalf("5 bursts in a row had two writes %v or more apart (last %v): too loaded to test the debounce", debounce*2/3, gap)
		}
		t.Logf("burst %d: two writes %v apart (debounce %v): repeated", attempt, gap, debounce)
	}
}

// TestWatchBusyPathDelaysOnlyItself: a file written without pause is
// reported about once per second, and the other paths' events are not
// held back by it.
func TestWatchBusyPathDelaysOnlyItself(t *testing.T) {
	dir := t.TempDir()
	w := start(t, dir, Options{Debounce: 50 * time.Millisecond})
	stop := make(chan struct{})
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		f, err := os.Create(filepath.Join(dir, "busy.log"))
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				fmt.Fprintln(f, "line")
			}
		}
	}()
	defer func() { close(stop); <-busy }()
	time.Sleep(300 * time.Millisecond)
	wrote := time.Now()
	write(t, filepath.Join(dir, "other.txt"), "o")
	busyEvents := 0
	for {
		ev := next(t, w, 3*time.Second)
		if ev.Path == "busy.log" {
			busyEvents++
			continue
		}
		if ev.Path != "other.txt" {
			t.Fatalf("unexpected %+v", ev)
		}
		if d := time.Since(wrote); d > 500*time.Millisecond {
			t.Fatalf("other.txt came %v after it was written, held back by busy.log", d)
		}
		break
	}
	deadline := time.After(2500 * time.Millisecond)
	for {
		select {
		case ev := <-w.Events():
			if ev.Path == "busy.log" {
				busyEvents++
			}
			continue
		case <-deadline:
		}
		break
	}
	// About 3 s of writes: the first report after at most 1 s, then about
	// one per second.
	if busyEvents < 2 || busyEvents > 4 {
		t.Fatalf("busy.log reported %d times in about 3 s, want 2 to 4", busyEvents)
	}
}

func TestWatchRecursiveNewSubdirectories(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "src", "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	budget := newBudget(100)
	w := start(t, dir, Options{Recursive: true, Debounce: 30 * time.Millisecond, Dirs: budget})

	write(t, filepath.Join(dir, "src", "pkg", "a.go"), "a")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created src/pkg/a.go")

	// mkdir -p plus files at once: the new directories are watched and
	// what they held before the watch was added is reported too.
	deep := filepath.Join(dir, "new", "b", "c")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(deep, "f.txt"), "f")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created new/", "created new/b/", "created new/b/c/", "created new/b/c/f.txt")
	write(t, filepath.Join(deep, "g.txt"), "g")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created new/b/c/g.txt")

	// A renamed directory keeps being watched under its new name.
	if err := os.Rename(filepath.Join(dir, "new"), filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "renamed moved<-new/")
	write(t, filepath.Join(dir, "moved", "b", "c", "h.txt"), "h")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created moved/b/c/h.txt")

	// A tree moved in from outside is reported entry by entry; one moved
	// out is removed.
	outside := t.TempDir()
	if err := os.MkdirAll(filepath.Join(outside, "t", "u"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(outside, "t", "u", "v.txt"), "v")
	if err := os.Rename(filepath.Join(outside, "t"), filepath.Join(dir, "t")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created t/", "created t/u/", "created t/u/v.txt")
	if err := os.Rename(filepath.Join(dir, "moved"), filepath.Join(outside, "gone")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "removed moved/")
	// A directory moved over an empty one: the new one is watched.
	if err := os.MkdirAll(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created empty/")
	if err := syscall.Rename(filepath.Join(dir, "t"), filepath.Join(dir, "empty")); err != nil {
		t.Fatal(err)
	}
	// The replaced directory's own last change (its link count) may come
	// as a modification.
	if evs := short(collect(t, w, 300*time.Millisecond)); len(evs) == 0 || evs[0] != "renamed empty<-t/" ||
		len(evs) > 1 && (len(evs) > 2 || evs[1] != "modified empty/") {
		t.Fatalf("moving t over empty: %q", evs)
	}
	write(t, filepath.Join(dir, "empty", "u", "w.txt"), "w")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created empty/u/w.txt")
	if got, want := inUse(budget), 5; got != want { // root, src, src/pkg, empty, empty/u
		t.Fatalf("%d directories watched, want %d", got, want)
	}
	write(t, filepath.Join(outside, "gone", "b", "c", "z.txt"), "z")
	if evs := collect(t, w, 300*time.Millisecond); len(evs) != 0 {
		t.Fatalf("a directory moved out still reports: %q", short(evs))
	}
}

func TestWatchRootRemovedEndsWatch(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "w")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "sub", "f"), "f")
	w := start(t, dir, Options{Recursive: true, Debounce: 20 * time.Millisecond})
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	evs := collect(t, w, 5*time.Second)
	if len(evs) == 0 || evs[len(evs)-1].Kind != KindRemoved || evs[len(evs)-1].Path != "" {
		t.Fatalf("events %q, want the root's removal last", short(evs))
	}
	if _, ok := <-w.Events(); ok {
		t.Fatal("events still open after the root went")
	}
	if w.Err() != nil {
		t.Fatalf("Err() = %v, want nil", w.Err())
	}
}

func TestWatchRootMovedAwayEndsWatch(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "w")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w := start(t, dir, Options{Debounce: 20 * time.Millisecond})
	if err := os.Rename(dir, filepath.Join(parent, "elsewhere")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 5*time.Second), "removed /")
}

func TestWatchSymlinksAreNotFollowed(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	// The root named through a symlink is resolved.
	alias := filepath.Join(t.TempDir(), "alias")
	if err := os.Symlink(dir, alias); err != nil {
		t.Fatal(err)
	}
	w := start(t, alias, Options{Recursive: true, Debounce: 20 * time.Millisecond})
	write(t, filepath.Join(outside, "secret"), "s")
	write(t, filepath.Join(dir, "inside"), "i")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created inside")
	if err := os.Symlink(outside, filepath.Join(dir, "link2")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created link2")
	write(t, filepath.Join(outside, "secret2"), "s")
	if evs := collect(t, w, 300*time.Millisecond); len(evs) != 0 {
		t.Fatalf("a symlinked directory was followed: %q", short(evs))
	}
}

// newBudget returns Limits used as the directory budget only.
func newBudget(maxDirs int) *Limits { return NewLimits(0, maxDirs) }

// inUse returns the directories taken from b.
func inUse(b *Limits) int {
	_, d := b.InUse()
	return d
}

func TestWatchDirectoryBudget(t *testing.T) {
	dir := t.TempDir()
	for i := range 3 {
		if err := os.Mkdir(filepath.Join(dir, fmt.Sprint(i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b := newBudget(3)
	if _, err := Start(context.Background(), dir, Options{Recursive: true, Dirs: b}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Start over budget: %v, want resource exhausted", err)
	}
	if inUse(b) != 0 {
		t.Fatalf("a failed start kept %d directories of the budget", inUse(b))
	}
	b = newBudget(5)
	w := start(t, dir, Options{Recursive: true, Dirs: b, Debounce: 10 * time.Millisecond})
	if inUse(b) != 4 {
		t.Fatalf("budget in use %d, want 4", inUse(b))
	}
	if err := os.Mkdir(filepath.Join(dir, "3"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "4"), 0o755); err != nil {
		t.Fatal(err)
	}
	collect(t, w, 5*time.Second)
	if !errdefs.IsResourceExhausted(w.Err()) {
		t.Fatalf("Err() = %v, want resource exhausted", w.Err())
	}
	waitFor(t, "the budget to be released", func() bool { return inUse(b) == 0 })
}

func TestWatchBufferOverflow(t *testing.T) {
	t.Parallel() // its own directories and watch; tolerates a split burst
	dir := t.TempDir()
	w, err := Start(context.Background(), dir, Options{Debounce: 10 * time.Millisecond, Buffer: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Nobody reads (not even the ready event) while 200 files appear.
	for i := range 200 {
		write(t, filepath.Join(dir, fmt.Sprintf("f%03d", i)), "x")
	}
	time.Sleep(300 * time.Millisecond)
	evs := collect(t, w, 300*time.Millisecond)
	if len(evs) < 2 || evs[0].Kind != KindReady || evs[1].Kind != KindOverflow {
		t.Fatalf("events %q, want ready then overflow", short(evs))
	}
	if len(evs) > 51 {
		t.Fatalf("%d events, more than the buffer of 50", len(evs))
	}
	// After the overflow, changes are reported again: the file's creation
	// (and, when its write came later than the debounce on a loaded
	// machine, a modification of it).
	write(t, filepath.Join(dir, "after"), "x")
	got := short(collect(t, w, 300*time.Millisecond))
	if len(got) == 0 || got[0] != "created after" || slices.ContainsFunc(got[1:], func(e string) bool { return e != "modified after" }) {
		t.Fatalf("events after the overflow %q, want \"created after\" (then only \"modified after\")", got)
	}
}

// inotifyState counts this process's inotify instances and watches.
func inotifyState(t *testing.T) (instances, watches int) {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		testenv.SkipOrFail(t, "no /proc/self/fd")
	}
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err != nil || target != "anon_inode:inotify" {
			continue
		}
		instances++
		info, err := os.ReadFile("/proc/self/fdinfo/" + fd.Name())
		if err == nil {
			watches += strings.Count(string(info), "inotify wd:")
		}
	}
	return instances, watches
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCancelCleansUp starts watches, cancels them (by context and by
// Close) and checks that no goroutine, inotify instance or watch is left.
func TestWatchCancelCleansUp(t *testing.T) {
	dir := t.TempDir()
	for i := range 20 {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprint(i), "x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	baseG := runtime.NumGoroutine()
	baseI, baseW := inotifyState(t)
	b := newBudget(1000)
	for range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		w1, err := Start(ctx, dir, Options{Recursive: true, Dirs: b})
		if err != nil {
			t.Fatal(err)
		}
		w2, err := Start(context.Background(), dir, Options{Recursive: true, Dirs: b})
		if err != nil {
			t.Fatal(err)
		}
		if i, n := inotifyState(t); i != baseI+2 || n != baseW+82 {
			t.Fatalf("inotify instances %d, watches %d; want %d and %d", i, n, baseI+2, baseW+82)
		}
		write(t, filepath.Join(dir, "0", "x", "f"), "f") // events pending, unread
		cancel()
		w2.Close()
		for range w1.Events() {
		}
		if _, ok := <-w2.Events(); ok {
			// Close waited: the channel is closed (maybe after buffered
			// events, but there are none: it is unbuffered).
			t.Fatal("events open after Close")
		}
	}
	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= baseG })
	if i, n := inotifyState(t); i != baseI || n != baseW {
		t.Fatalf("left behind: inotify instances %d (was %d), watches %d (was %d)", i, baseI, n, baseW)
	}
	if inUse(b) != 0 {
		t.Fatalf("budget in use after cancel: %d", inUse(b))
	}
}

// TestGitCheckout switches a work tree between two branches that differ in
// 600 files (300 changed, 150 only on one branch, 150 only on the other,
// some in new directories) and expects an event for every changed path
// within a bounded time, or an overflow event.
func TestWatchGitCheckout(t *testing.T) {
	t.Parallel() // its own directories and watch; tolerates a split burst
	if _, err := exec.LookPath("git"); err != nil {
		testenv.SkipOrFail(t, "git is not installed (make deps installs it)")
	}
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q", "-b", "one")
	for i := range 450 {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%15), fmt.Sprintf("f%03d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, p, fmt.Sprintf("one %d\n", i))
	}
	git("add", "-A")
	git("commit", "-q", "-m", "one")
	git("checkout", "-q", "-b", "two")
	var changed []string
	for i := range 450 {
		rel := fmt.Sprintf("d%02d/f%03d.txt", i%15, i)
		switch {
		case i < 300:
			write(t, filepath.Join(dir, rel), fmt.Sprintf("two %d\n", i))
		default:
			if err := os.Remove(filepath.Join(dir, rel)); err != nil {
				t.Fatal(err)
			}
		}
		changed = append(changed, rel)
	}
	for i := range 150 {
		rel := fmt.Sprintf("n%d/g%03d.txt", i%5, i)
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, rel), "new\n")
		changed = append(changed, rel)
	}
	git("add", "-A")
	git("commit", "-q", "-m", "two")
	git("checkout", "-q", "one")

	w := start(t, dir, Options{Recursive: true})
	began := time.Now()
	git("checkout", "-q", "two")
	seen := map[string]Kind{}
	waiting := map[string]bool{}
	for _, p := range changed {
		waiting[p] = true
	}
	overflow := false
	deadline := time.After(10 * time.Second)
	for len(waiting) > 0 && !overflow {
		select {
		case ev := <-w.Events():
			if ev.Kind == KindOverflow {
				overflow = true
			}
			seen[ev.Path] = ev.Kind
			delete(waiting, ev.Path)
		case <-deadline:
			var missing []string
			for _, p := range changed {
				if _, ok := seen[p]; !ok {
					missing = append(missing, p)
				}
			}
			t.Fatalf("after 10 s, %d of %d changed paths without an event, e.g. %q", len(missing), len(changed), missing[:min(5, len(missing))])
		}
	}
	took := time.Since(began)
	if overflow {
		t.Logf("overflow after %v (%d paths seen): the client lists again", took, len(seen))
		return
	}
	for i, p := range changed {
		want := KindModified
		switch {
		case i >= 450:
			want = KindCreated
		case i >= 300:
			want = KindRemoved
		}
		if got := seen[p]; got != want && !(want == KindModified && got == KindCreated) {
			t.Errorf("%s: %v, want %v", p, got, want)
		}
	}
	for _, d := range []string{"n0", "n4"} {
		if seen[d] != KindCreated {
			t.Errorf("new directory %s: %v, want created", d, seen[d])
		}
	}
	t.Logf("git checkout of %d changed paths: all reported within %v (%d paths with .git's)", len(changed), took, len(seen))
	// Back again, and the watch still works in the directories that went
	// and came.
	git("checkout", "-q", "one")
	collect(t, w, 500*time.Millisecond)
	if err := os.MkdirAll(filepath.Join(dir, "n1"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "n1", "late"), "l")
	evs := collect(t, w, 500*time.Millisecond)
	if !slices.ContainsFunc(evs, func(e Event) bool { return e.Path == "n1/late" && e.Kind == KindCreated }) {
		t.Fatalf("after switching back, events %q lack n1/late", short(evs))
	}
}

func TestWatchStartErrors(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "f"), "f")
	_, err := Start(context.Background(), filepath.Join(dir, "f"), Options{})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("watching a file: %v, want failed precondition", err)
	}
	_, err = Start(context.Background(), filepath.Join(dir, "missing"), Options{})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("watching a missing directory: %v, want not exist", err)
	}
}

func TestWatchLimitsCountWatches(t *testing.T) {
	l := NewLimits(2, 10)
	for range 2 {
		if err := l.StartWatch(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.StartWatch(); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a third watch: %v, want resource exhausted", err)
	}
	l.EndWatch()
	if err := l.StartWatch(); err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	if w, d := l.InUse(); w != 2 || d != 0 {
		t.Fatalf("InUse() = %d, %d; want 2, 0", w, d)
	}
}

// TestWatchKernelOverflowRescans: after the kernel's queue overflowed (the
// error is injected: max_queued_events is machine-wide), the watch reports
// one overflow, watches the directories created meanwhile and forgets the
// ones that went.
func TestWatchKernelOverflowRescans(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "old", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	budget := newBudget(100)
	w, err := newWatcher(dir, Options{Recursive: true, Debounce: 10 * time.Millisecond, Dirs: budget})
	if err != nil {
		t.Fatal(err)
	}
	// Changes the watch would have lost, while its goroutine is not
	// running: a new tree, and a watched tree gone.
	if err := os.MkdirAll(filepath.Join(dir, "new", "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "old")); err != nil {
		t.Fatal(err)
	}
	// Once fsnotify has read the kernel's queue, what it held is dropped:
	// lost with the overflow.
	time.Sleep(200 * time.Millisecond)
	for len(w.fsw.Events) > 0 {
		<-w.fsw.Events
	}
	w.handleErr(fsnotify.ErrEventOverflow, time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	w.stop = cancel
	go w.run(ctx)
	defer w.Close()

	wantEvents(t, collect(t, w, 300*time.Millisecond), "ready /", "overflow ")
	if got := inUse(budget); got != 4 { // root, new, new/a, new/a/b
		t.Fatalf("%d directories watched after the rescan, want 4", got)
	}
	write(t, filepath.Join(dir, "new", "a", "b", "f"), "f")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created new/a/b/f")
}

// TestWatchHiddenTemporaryFiles writes files the way the agent's uploads
// do, a temporary file renamed into place, with the write and the rename
// in separate bursts (as on a loaded machine): the temporary file never
// shows, and the upload is its target's creation.
func TestWatchHiddenTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	hidden := func(name string) bool { return strings.HasPrefix(name, ".tmp-") }
	w := start(t, dir, Options{Debounce: 20 * time.Millisecond, Hidden: hidden})
	tmp := filepath.Join(dir, ".tmp-1")

	write(t, tmp, "a")
	if evs := collect(t, w, 200*time.Millisecond); len(evs) != 0 {
		t.Fatalf("a hidden file's writes were reported: %q", short(evs))
	}
	if err := os.Rename(tmp, filepath.Join(dir, "a.txt")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created a.txt")

	// A file moved onto a hidden name went; a hidden file removed never was.
	if err := os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, ".tmp-2")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "removed a.txt")
	if err := os.Remove(filepath.Join(dir, ".tmp-2")); err != nil {
		t.Fatal(err)
	}
	if evs := collect(t, w, 200*time.Millisecond); len(evs) != 0 {
		t.Fatalf("a hidden file's removal was reported: %q", short(evs))
	}
	// Other moves are reported as before.
	write(t, filepath.Join(dir, "b.txt"), "b")
	wantEvents(t, collect(t, w, 300*time.Millisecond), "created b.txt")
	if err := os.Rename(filepath.Join(dir, "b.txt"), filepath.Join(dir, "c.txt")); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, collect(t, w, 300*time.Millisecond), "renamed c.txt<-b.txt")
}

// TestWatchLateMoveToIsStillARename: a file written then moved within
// the tree is MODIFIED then RENAMED even when the timer fires between the
// move-from and the move-to, as it does on a busy machine when fsnotify's
// reader goroutine is descheduled between the two (inotify queues them
// together). Before, the move-from was then taken as a removal: REMOVED
// and CREATED, the write lost. The watch's goroutine is not started: the
// test hands the real inotify events to it one by one and fires the timer
// itself.
func TestWatchLateMoveToIsStillARename(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := newWatcher(dir, Options{Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.release)
	w.b.queue = nil // KindReady
	f, err := os.OpenFile(filepath.Join(dir, "a.txt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("more\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")); err != nil {
		t.Fatal(err)
	}
	next := func() fsnotify.Event {
		t.Helper()
		select {
		case ev := <-w.fsw.Events:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no inotify event within 10 s")
			return fsnotify.Event{}
		}
	}
	t0 := time.Now()
	for {
		ev := next()
		w.handle(ev, t0)
		if ev.Has(fsnotify.Rename) {
			break
		}
	}
	// The timer fires past the debounce, the move-to not yet delivered.
	w.tick(t0.Add(50*time.Millisecond), nil)
	if w.held == nil {
		t.Fatalf("the move-from was resolved before its wait; queued %v", w.b.queue)
	}
	w.handle(next(), t0.Add(60*time.Millisecond)) // the move-to
	w.tick(t0.Add(time.Minute), nil)
	var got []string
	for _, ev := range w.b.queue {
		got = append(got, fmt.Sprintf("%s %s", ev.Kind, ev.Path))
	}
	want := []string{fmt.Sprintf("%s a.txt", KindModified), fmt.Sprintf("%s b.txt", KindRenamed)}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	// With no move-to at all (moved out of the tree), the move-from is a
	// removal once its wait is over.
	w.b.queue = nil
	w.handle(fsnotify.Event{Name: filepath.Join(dir, "b.txt"), Op: fsnotify.Rename}, t0)
	w.tick(t0.Add(moveToWait-time.Millisecond), nil)
	if w.held == nil {
		t.Fatal("the move-from was resolved before moveToWait")
	}
	w.tick(t0.Add(moveToWait), nil)
	w.tick(t0.Add(time.Minute), nil)
	if len(w.b.queue) != 1 || w.b.queue[0].Kind != KindRemoved || w.b.queue[0].Path != "b.txt" {
		t.Fatalf("after the wait: %v, want b.txt removed", w.b.queue)
	}
}
