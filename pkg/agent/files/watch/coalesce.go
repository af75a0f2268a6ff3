package watch

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// entry is the held change of one path.
type entry struct {
	seq   uint64
	kind  Kind
	old   string
	isDir bool
	first time.Time // when the path's first held change was seen
	t     time.Time // when its last one was seen
}

// burst holds the changes of recent bursts, merged per path, and the
// events ready for the reader. A path's change is due Debounce after the
// last change of that path, and at most maxWait after its first. It is
// used by one goroutine.
type burst struct {
	debounce, maxWait time.Duration
	pending           map[string]*entry
	seq               uint64
	// next is no later than the earliest due time of a held change (a
	// change of a held path only delays that path), zero when none is.
	next  time.Time
	queue []Event // reported, waiting for the reader
	max   int     // bound of len(pending)+len(queue)
}

func newBurst(max int, debounce, maxWait time.Duration) *burst {
	return &burst{pending: map[string]*entry{}, max: max, debounce: debounce, maxWait: maxWait}
}

// due returns when the next held change may be due; ok is false when
// nothing is held.
func (b *burst) due() (t time.Time, ok bool) {
	return b.next, len(b.pending) > 0
}

// dueAt returns when e is due.
func (b *burst) dueAt(e *entry) time.Time {
	t := e.t.Add(b.debounce)
	if limit := e.first.Add(b.maxWait); limit.Before(t) {
		return limit
	}
	return t
}

// put holds a new change of p, replacing what was held for it.
func (b *burst) put(p string, e *entry, now time.Time) {
	if len(b.pending) == 0 {
		// Any later change is due no earlier than this one.
		b.next = now.Add(min(b.debounce, b.maxWait))
	}
	b.seq++
	e.seq, e.first, e.t = b.seq, now, now
	b.pending[p] = e
	b.checkOverflow(now)
}

// record merges a created, modified or removed change of p into the burst.
func (b *burst) record(p string, k Kind, isDir bool, now time.Time) {
	e := b.pending[p]
	if e == nil {
		b.put(p, &entry{kind: k, isDir: isDir}, now)
		return
	}
	switch e.kind {
	case KindCreated:
		if k == KindRemoved {
			// Appeared and went within the burst: nothing to report, for
			// it or for anything held below it.
			delete(b.pending, p)
			b.dropBelow(p)
			return
		}
	case KindModified:
		if k == KindRemoved {
			e.kind = KindRemoved
		}
	case KindRemoved:
		if k != KindRemoved {
			// Removed and there again: it changed.
			e.kind = KindModified
		}
	default: // KindRenamed: "moved here, then changed" has no one event.
		b.flush()
		b.put(p, &entry{kind: k, isDir: isDir}, now)
		return
	}
	if k != KindRemoved {
		e.isDir = isDir
	}
	e.t = now
}

// rename merges a move of old to p, both under the watched directory.
func (b *burst) rename(old, p string, isDir bool, now time.Time) {
	eo := b.pending[old]
	switch {
	case eo != nil && eo.kind == KindCreated:
		// Written under a temporary name and moved into place: p is
		// created, and so is what was created below old.
		delete(b.pending, old)
		b.moveBelow(old, p)
		b.record(p, KindCreated, isDir, now)
	case eo != nil && eo.kind == KindRenamed && b.pending[p] == nil:
		delete(b.pending, old)
		if eo.old == p {
			b.record(p, KindModified, isDir, now) // moved back
			return
		}
		b.put(p, &entry{kind: KindRenamed, old: eo.old, isDir: isDir}, now)
	default:
		// Whatever is held happened before the move: report it first, so
		// that a reader applying the events in order ends right.
		b.flush()
		b.put(p, &entry{kind: KindRenamed, old: old, isDir: isDir}, now)
	}
}

// dropBelow forgets the changes held under directory p.
func (b *burst) dropBelow(p string) {
	prefix := p + "/"
	for k := range b.pending {
		if strings.HasPrefix(k, prefix) {
			delete(b.pending, k)
		}
	}
}

// moveBelow re-keys the changes held under directory old to under p.
func (b *burst) moveBelow(old, p string) {
	prefix := old + "/"
	for k, e := range b.pending {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			delete(b.pending, k)
			b.pending[p+"/"+rest] = e
		}
	}
}

// flush reports everything held, in the order the paths first changed.
func (b *burst) flush() {
	if len(b.pending) == 0 {
		return
	}
	paths := make([]string, 0, len(b.pending))
	for p := range b.pending {
		paths = append(paths, p)
	}
	b.report(paths)
}

// flushDue reports the held changes due at now, with their held parent
// directories (so a directory's creation comes before its entries'), in
// the order the paths first changed.
func (b *burst) flushDue(now time.Time) {
	var paths []string
	b.next = time.Time{}
	for p, e := range b.pending {
		due := b.dueAt(e)
		if !due.After(now) {
			paths = append(paths, p)
		} else if b.next.IsZero() || due.Before(b.next) {
			b.next = due
		}
	}
	taken := map[string]bool{}
	for _, p := range paths {
		for d := parent(p); d != "" && b.pending[d] != nil && !taken[d] && b.dueAt(b.pending[d]).After(now); d = parent(d) {
			taken[d] = true
			paths = append(paths, d)
		}
	}
	b.report(paths)
}

// report queues the events of the held paths, in seq order, and forgets
// them.
func (b *burst) report(paths []string) {
	slices.SortFunc(paths, func(x, y string) int { return cmp.Compare(b.pending[x].seq, b.pending[y].seq) })
	for _, p := range paths {
		e := b.pending[p]
		b.queue = append(b.queue, Event{Kind: e.kind, Path: p, OldPath: e.old, IsDir: e.isDir, Time: e.t})
	}
	for _, p := range paths {
		delete(b.pending, p)
	}
}

// emit reports ev now, after what is held.
func (b *burst) emit(ev Event) {
	b.flush()
	b.queue = append(b.queue, ev)
}

// checkOverflow replaces everything held and queued by one overflow event
// when there is more than the bound.
func (b *burst) checkOverflow(now time.Time) {
	if len(b.pending)+len(b.queue) > b.max {
		b.overflow(now)
	}
}

// overflow drops what is held and queued (but a ready event the reader
// has not taken yet) and reports one overflow event.
func (b *burst) overflow(now time.Time) {
	clear(b.pending)
	keep := 0
	if len(b.queue) > 0 && b.queue[0].Kind == KindReady {
		keep = 1
	}
	b.queue = append(b.queue[:keep], Event{Kind: KindOverflow, Time: now})
}
