// Package watch reports the changes under a directory, on top of
// github.com/fsnotify/fsnotify (inotify on Linux): one event per changed
// path per burst, paths relative to the watched directory, recursion by
// watching every directory as it appears. The sandbox agent's
// FileService.Watch and the host workspace (workspace.Local) both use it,
// through files.FS.Watch, so a change means the same event on both.
//
// # Events
//
// The first event is KindReady: every directory is watched, and every
// later change is reported. Then come KindCreated, KindModified,
// KindRemoved and KindRenamed (OldPath to Path, both under the watched
// directory; a rename from or to outside it is a removal or a creation).
// Writes and attribute changes (chmod, touch) are KindModified. A
// directory created while a recursive watch runs is watched at once and
// what it already holds is reported as created too (mkdir -p a/b/c,
// or a tree moved in, reports every entry).
//
// # Debounce
//
// The changes of a path are held until the path has been quiet for
// Options.Debounce (default 50 ms), and for at most 20 times that (at most
// 1 s, or Debounce when that is longer) while they keep coming; then they
// are reported as one event. Each path has its own clock, so a file
// written without pause delays only its own events. Events come in the
// order their paths first changed, and a directory's creation before its
// entries'. Merging: created then written is created; written, removed
// and written again is modified; created then removed is nothing; a file
// written under a temporary name and renamed over its target (an editor's
// save) is the target created. A change the merge cannot express (a
// renamed path written again) first reports everything held.
//
// # Overflow
//
// When the kernel's queue overflows (fs.inotify.max_queued_events) or more
// than Options.Buffer events wait for a slow reader, the held events are
// dropped and one KindOverflow event is reported: the reader must list
// the directory again. After a kernel overflow the directories are walked
// again, so that the watch covers the directories created meanwhile.
//
// # Limits
//
// Each watched directory costs one inotify watch. Options.Dirs bounds them
// (the agent shares one budget among the watches of a sandbox); a watch
// whose directories no longer fit ends with errdefs.ErrResourceExhausted,
// as does one the kernel refuses (fs.inotify.max_user_watches and
// max_user_instances).
//
// # Symlinks
//
// A symlink naming the watched directory is resolved once at the start;
// symlinks below it are reported as entries and never followed, so a
// watch never reports what happens outside its directory. A directory
// that turns into a symlink while it is being added is dropped again.
package watch

import (
	"fmt"
	"time"
)

// Kind is what happened to a path. The values are those of the API's
// WatchEventKind enum.
type Kind int

// Event kinds.
const (
	// KindReady is the first event: the directory is watched.
	KindReady Kind = iota + 1
	// KindCreated says that the path exists now (a file replaced by a
	// rename is created too).
	KindCreated
	// KindModified says that the content or the attributes changed.
	KindModified
	// KindRemoved says that the path is gone (deleted or moved out). An
	// empty Path means the watched directory itself; the watch then ends.
	KindRemoved
	// KindRenamed says that OldPath moved to Path.
	KindRenamed
	// KindOverflow says that changes were lost: list again.
	KindOverflow
)

// String returns "ready", "created", "modified", "removed", "renamed" or
// "overflow".
func (k Kind) String() string {
	if k >= KindReady && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

var kindNames = [...]string{
	KindReady: "ready", KindCreated: "created", KindModified: "modified",
	KindRemoved: "removed", KindRenamed: "renamed", KindOverflow: "overflow",
}

// Event is one change under the watched directory.
type Event struct {
	// Kind says what happened.
	Kind Kind
	// Path is relative to the watched directory, slash-separated; empty
	// for the directory itself (KindReady, KindOverflow, or the directory
	// removed).
	Path string
	// OldPath is where a renamed path was (KindRenamed).
	OldPath string
	// IsDir is true when the path is a directory. For a removed path it
	// is known in recursive watches, and for the watched directory's own
	// entries in the others.
	IsDir bool
	// Time is when the last change merged into the event was seen.
	Time time.Time
}
