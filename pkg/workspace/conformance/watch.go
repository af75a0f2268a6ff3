package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/workspace"
)

// watchCases are the Watch subtests, part of Run.
var watchCases = []testCase{
	{"WatchEvents", testWatchEvents},
	{"WatchEditorSave", testWatchEditorSave},
	{"WatchRootRemoved", testWatchRootRemoved},
	{"WatchCancel", testWatchCancel},
	{"WatchErrors", testWatchErrors},
}

// RunWatch runs only the Watch subtests of the suite (Run includes them).
func RunWatch(t *testing.T, newWorkspace Factory) {
	runCases(t, newWorkspace, watchCases)
}

// watchTimeout bounds the wait for an expected watch event (through a
// proxy and a container, on a loaded machine).
const watchTimeout = 10 * time.Second

// watchStream ranges over a watch's events in a goroutine and hands them
// over a channel, so a test can wait with a timeout.
type watchStream struct {
	events chan workspace.WatchEvent
	done   chan error // the sequence's error (nil at a clean end), then closed
	cancel context.CancelFunc
}

// startWatch watches dir and returns the stream; the test's end cancels it.
func startWatch(t *testing.T, ws workspace.Workspace, dir string, opts workspace.WatchOptions) *watchStream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxFor(t))
	seq, err := ws.Watch(ctx, dir, opts)
	if err != nil {
		cancel()
		t.Fatalf("Watch(%s): %v", dir, err)
	}
	s := &watchStream{events: make(chan workspace.WatchEvent, 1024), done: make(chan error, 1), cancel: cancel}
	go func() {
		defer close(s.done)
		for ev, err := range seq {
			if err != nil {
				s.done <- err
				return
			}
			s.events <- ev
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// closedWith returns a closed channel that yields err first.
func closedWith(err error) chan error {
	ch := make(chan error, 1)
	ch <- err
	close(ch)
	return ch
}

// render writes an event as "kind path[<-old][/]".
func render(ev workspace.WatchEvent) string {
	s := string(ev.Kind) + " " + ev.Path
	if ev.OldPath != "" {
		s += "<-" + ev.OldPath
	}
	if ev.IsDir {
		s += "/"
	}
	return s
}

// expect reads events until every one of want has been seen (in that
// order among themselves; other events may come between) and returns all
// it read. Events on paths starting with one of skip are ignored.
func (s *watchStream) expect(t *testing.T, want ...string) []string {
	t.Helper()
	var got []string
	timeout := time.After(watchTimeout)
	for i := 0; i < len(want); {
		select {
		case ev := <-s.events:
			r := render(ev)
			got = append(got, r)
			if r == want[i] {
				i++
			}
		case err := <-s.done:
			// The goroutine queued every event before it ended.
			for len(s.events) > 0 {
				if r := render(<-s.events); r == want[i] {
					got = append(got, r)
					if i++; i == len(want) {
						s.done = closedWith(err)
						return got
					}
				}
			}
			t.Fatalf("the watch ended (%v) before %q; got %q", err, want[i:], got)
		case <-timeout:
			t.Fatalf("no %q within %v; got %q", want[i:], watchTimeout, got)
		}
	}
	return got
}

// quiet reads events for d and returns them.
func (s *watchStream) quiet(d time.Duration) []string {
	var got []string
	timeout := time.After(d)
	for {
		select {
		case ev := <-s.events:
			got = append(got, render(ev))
		case <-timeout:
			return got
		}
	}
}

// settle reads events until, after the first, none has come for quietFor,
// or until max has passed, and returns them.
func (s *watchStream) settle(quietFor, max time.Duration) []string {
	var got []string
	deadline := time.After(max)
	var silence <-chan time.Time // armed by each event
	for {
		select {
		case ev := <-s.events:
			got = append(got, render(ev))
			silence = time.After(quietFor)
		case <-silence:
			return got
		case <-deadline:
			return got
		}
	}
}

func testWatchEvents(t *testing.T, ws workspace.Workspace) {
	sh(t, ws, "mkdir -p w/keep && printf old > w/keep/old.txt")
	s := startWatch(t, ws, "w", workspace.WatchOptions{Recursive: true, Debounce: 20 * time.Millisecond})

	upload(t, ws, "w/a.txt", "a")
	s.expect(t, "created a.txt")
	sh(t, ws, "printf more >> w/a.txt")
	s.expect(t, "modified a.txt")
	sh(t, ws, "mv w/a.txt w/keep/b.txt")
	s.expect(t, "renamed keep/b.txt<-a.txt")
	sh(t, ws, "mkdir -p w/d/e && printf f > w/d/e/f.txt")
	s.expect(t, "created d/", "created d/e/", "created d/e/f.txt")
	sh(t, ws, "printf g > w/d/e/g.txt")
	s.expect(t, "created d/e/g.txt")
	sh(t, ws, "chmod 600 w/keep/old.txt")
	s.expect(t, "modified keep/old.txt")
	sh(t, ws, "rm -r w/d w/keep/b.txt")
	got := s.expect(t, "removed keep/b.txt")
	if !slices.Contains(append(got, s.quiet(300*time.Millisecond)...), "removed d/") {
		t.Fatalf("no removal of d/: %q", got)
	}
	// Times are recent.
	upload(t, ws, "w/t.txt", "t")
	select {
	case ev := <-s.events:
		if age := time.Since(ev.Time); ev.Time.IsZero() || age < -5*time.Second || age > time.Minute {
			t.Fatalf("event %+v: time %v is not recent", ev, ev.Time)
		}
	case <-time.After(watchTimeout):
		t.Fatal("no event for t.txt")
	}
}

// testWatchEditorSave saves a file as editors do, several times in one
// burst: write a temporary file, rename it over the target, chmod. The
// watch reports the target, once per burst that fits in the debounce. A
// temporary file that lived longer than the debounce (the shell paused
// between write and rename on a loaded machine) may be reported, but only
// with its end: renamed onto the target or removed. Nothing else shows.
func testWatchEditorSave(t *testing.T, ws workspace.Workspace) {
	sh(t, ws, "mkdir -p e && printf v0 > e/main.go")
	s := startWatch(t, ws, "e", workspace.WatchOptions{Debounce: 200 * time.Millisecond})
	var line strings.Builder
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&line, "printf v%d > e/.main.go.swp && mv e/.main.go.swp e/main.go && chmod 644 e/main.go && ", i)
	}
	line.WriteString("for i in 1 2 3 4 5 6 7 8 9 10; do printf x >> e/main.go; done")
	sh(t, ws, line.String())
	// Everything is written: read until the stream has been quiet a while.
	got := s.settle(700*time.Millisecond, watchTimeout)
	const target, temp = "main.go", ".main.go.swp"
	sawTarget, tempOpen := false, false
	for _, ev := range got {
		switch ev {
		case "created " + target, "modified " + target:
			sawTarget = true
		case "created " + temp, "modified " + temp:
			tempOpen = true
		case "renamed " + target + "<-" + temp:
			sawTarget, tempOpen = true, false
		case "removed " + temp:
			tempOpen = false
		default:
			t.Fatalf("an editor's saves gave %q: %q is neither the target nor the temporary file's life", got, ev)
		}
	}
	if !sawTarget || tempOpen {
		t.Fatalf("an editor's saves gave %q: want the target reported and no temporary file left open", got)
	}
	if len(got) > 1 {
		t.Logf("the saves came as %d events (bursts longer than the debounce on a loaded machine): %q", len(got), got)
	}
}

func testWatchRootRemoved(t *testing.T, ws workspace.Workspace) {
	sh(t, ws, "mkdir -p gone/sub && printf x > gone/sub/f")
	s := startWatch(t, ws, "gone", workspace.WatchOptions{Recursive: true, Debounce: 10 * time.Millisecond})
	sh(t, ws, "rm -r gone")
	s.expect(t, "removed /")
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatalf("the watch ended with %v, want a clean end", err)
		}
	case <-time.After(watchTimeout):
		t.Fatal("the watch did not end after its directory went")
	}
}

// testWatchCancel stops watches by leaving the loop and by cancelling the
// context, more often than a sandbox allows watches at once: each one
// must release what it held.
func testWatchCancel(t *testing.T, ws workspace.Workspace) {
	sh(t, ws, "mkdir -p c/x")
	for i := range 40 {
		ctx, cancel := context.WithCancel(ctxFor(t))
		seq, err := ws.Watch(ctx, "c", workspace.WatchOptions{Recursive: true, Debounce: 5 * time.Millisecond})
		// A remote agent ends a watch after the cancel reaches it, and
		// closing an inotify instance takes the kernel a few ms: a watch
		// may still count for a moment.
		for deadline := time.Now().Add(watchTimeout); errdefs.IsResourceExhausted(err) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			seq, err = ws.Watch(ctx, "c", workspace.WatchOptions{Recursive: true, Debounce: 5 * time.Millisecond})
		}
		if err != nil {
			cancel()
			t.Fatalf("watch %d: %v", i, err)
		}
		if i%2 == 0 {
			upload(t, ws, fmt.Sprintf("c/x/%d", i), "x")
			for ev, err := range seq {
				if err != nil {
					t.Fatalf("watch %d: %v", i, err)
				}
				if ev.Path == fmt.Sprintf("x/%d", i) {
					break // leaving the loop ends the watch
				}
			}
			cancel()
			continue
		}
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			for _, err := range seq {
				if err != nil {
					t.Errorf("watch %d after cancel: %v", i, err)
				}
			}
		}()
		cancel()
		select {
		case <-ended:
		case <-time.After(watchTimeout):
			t.Fatalf("watch %d: the sequence did not end after cancel", i)
		}
	}
}

func testWatchErrors(t *testing.T, ws workspace.Workspace) {
	ctx := ctxFor(t)
	upload(t, ws, "plain.txt", "x")
	_, err := ws.Watch(ctx, "missing-dir", workspace.WatchOptions{})
	wantCategory(t, "Watch(missing)", err, errdefs.ErrNotFound)
	_, err = ws.Watch(ctx, "plain.txt", workspace.WatchOptions{})
	wantCategory(t, "Watch(file)", err, errdefs.ErrFailedPrecondition)
	_, err = ws.Watch(ctx, "", workspace.WatchOptions{Debounce: -time.Second})
	wantCategory(t, "Watch(negative debounce)", err, errdefs.ErrInvalidArgument)
	_, err = ws.Watch(ctx, "", workspace.WatchOptions{Debounce: time.Minute})
	wantCategory(t, "Watch(long debounce)", err, errdefs.ErrInvalidArgument)
}
