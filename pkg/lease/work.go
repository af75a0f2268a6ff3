package lease

import (
	"context"
	"sync"
	"time"
)

// One operation per lease at a time.
//
// Whatever acts on a lease's sandbox — its creation or warm claim, an
// in-place restart, a pause, resume, snapshot or pause fix, a removal —
// holds the lease's one operation slot (entry.op) while it runs, taken and
// given back under the Manager's mu. Whoever finds the slot taken either
// waits for the operation (an acquire shares a creation's or restart's
// outcome, a resume another resume's, a removal another removal's; Use,
// Pause, Resume and snapshots wait for a pause-like operation and look
// again) or hands the lease to the work queue: the controller's passes
// (runtime events and resync) mark it dirty, and a removal asked for
// while another operation runs is left to that operation's end. When an
// operation ends (endOpLocked), a lease that is dirty or has a container
// to remove is queued.
//
// The queue (workQueue) has client-go's workqueue semantics over lease
// ids: an id is queued at most once however often it is added, it is
// never handed to two workers at once, and one added while a worker has
// it is handed out again once that worker is done. Config.ReapConcurrency
// workers take ids from it (Manager.work): a lease with a container to
// remove is removed (cleanup), any other is observed as it is now and
// plan's decision applied (check, reconcile.go). Runtime events, the
// reaper, releases and the end of every operation add to it.

// opKind is what an operation holding a lease does.
type opKind uint8

// The operations that hold a lease.
const (
	// opCreate creates the lease's sandbox or claims a pooled one
	// (acquire.go, pool.go); the lease is PENDING (or RELEASING when
	// released meanwhile).
	opCreate opKind = iota + 1
	// opRestart restarts the sandbox in place after its container exited
	// (restart.go); the lease is PENDING.
	opRestart
	// opPause pauses a READY lease, or pauses again the running sandbox
	// of a PAUSED one (pause.go).
	opPause
	// opResume resumes a PAUSED lease (pause.go).
	opResume
	// opSnapshot commits the sandbox to a snapshot image (snapshot.go).
	opSnapshot
	// opClean removes the sandbox of a RELEASING or ended lease (ops.go).
	opClean
)

var opNames = map[opKind]string{opCreate: "create", opRestart: "restart", opPause: "pause", opResume: "resume", opSnapshot: "snapshot", opClean: "clean"}

func (k opKind) String() string { return opNames[k] }

// pausing reports whether an operation of kind k keeps the lease READY or
// PAUSED while it runs: Use, Pause, Resume and snapshots wait for it and
// then look at the lease again. For the other kinds they answer at once
// from the lease's state (PENDING, RELEASING or ended).
func (k opKind) pausing() bool { return k == opPause || k == opResume || k == opSnapshot }

// op is the operation holding a lease (entry.op).
type op struct {
	kind opKind
	// done is closed once the operation ended and its outcome is set.
	done chan struct{}
	// lease and err are the outcome, for those who share it (acquires of
	// a creation or restart, resumes of a resume, removals of a removal).
	lease Lease
	err   error
	// claim is the pooled sandbox a creation claimed (pool.go); nil for a
	// cold creation and for every other kind.
	claim *claim
}

// wait waits for o to end, or for ctx.
func (o *op) wait(ctx context.Context) error {
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// outcome waits for o to end and returns what it left: the lease, or its
// error; ctx's error when the caller gives up first (the operation goes
// on).
func (o *op) outcome(ctx context.Context) (Lease, error) {
	if err := o.wait(ctx); err != nil {
		return Lease{}, err
	}
	if o.err != nil {
		return Lease{}, o.err
	}
	return o.lease.Clone(), nil
}

// beginOpLocked gives e's operation slot, which must be free, to a new
// operation of kind k. Called with mu held.
func beginOpLocked(e *entry, k opKind) *op {
	if e.op != nil {
		panic("lease " + e.l.ID + ": " + k.String() + " begun while " + e.op.kind.String() + " runs")
	}
	o := &op{kind: k, done: make(chan struct{})}
	e.op = o
	return o
}

// endOpLocked gives e's slot back from o with its outcome (the lease as it
// is now, or err) and queues e when a pass found it busy meanwhile or it
// has a container to remove whose retry is due. The caller closes o.done
// (finish) once it has persisted e. Called with mu held.
func (m *Manager) endOpLocked(e *entry, o *op, err error) {
	if e.op == o {
		e.op = nil
	}
	o.err = err
	if err == nil {
		o.lease = e.l.Clone()
	}
	if e.op == nil && (e.dirty || e.needsClean() && !time.Now().Before(e.retryAt)) {
		m.queue.add(e.l.ID)
	}
}

// finish closes o.done: its outcome is ready.
func (o *op) finish() { close(o.done) }

// markDirtyLocked asks for e to be looked at again: now, by a worker, when
// no operation holds it, else when its operation ends. Called with mu
// held.
func (c *controller) markDirtyLocked(e *entry) {
	e.dirty = true
	if e.op == nil {
		c.queue.add(e.l.ID)
	}
}

// work is one of the Config.ReapConcurrency workers: it handles the ids
// of the work queue until the queue shuts down.
func (c *controller) work(ctx context.Context) {
	for {
		id, ok := c.queue.get()
		if !ok {
			return
		}
		c.handle(ctx, id)
		c.queue.done(id)
	}
}

// handle is one worker's turn at lease id: a lease an operation holds is
// left dirty for that operation's end; one with a container to remove is
// removed (cleanup) unless a failed removal's retry is not due yet (the
// reaper queues it when it is); a dirty one is observed and plan's decision applied
// (check), with the runtime event that made it dirty, if any.
func (c *controller) handle(ctx context.Context, id string) {
	c.mu.Lock()
	e := c.leases[id]
	switch {
	case e == nil:
		c.mu.Unlock()
		return
	case e.op != nil:
		e.dirty = true
		c.mu.Unlock()
		return
	case e.needsClean():
		e.dirty, e.event = false, nil
		due := !time.Now().Before(e.retryAt) // else the reaper queues it when it is
		c.mu.Unlock()
		if due {
			_ = c.cleanup(ctx, id)
		}
		return
	}
	dirty, ev := e.dirty, e.event
	e.dirty, e.event = false, nil
	c.mu.Unlock()
	if dirty {
		c.check(ctx, id, ev)
	}
}

// workQueue is a queue of lease ids with client-go's workqueue semantics:
// an id is queued at most once (dirty), never handed out twice at once
// (processing), and one added while handed out is queued again when done
// is called for it. Safe for concurrent use; it takes only its own lock,
// so it may be called with the Manager's mu held.
type workQueue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	ids        []string
	dirty      map[string]bool // queued, or to be queued again when done
	processing map[string]bool // handed out, not done
	shutdown   bool
}

func newWorkQueue() *workQueue {
	q := &workQueue{dirty: map[string]bool{}, processing: map[string]bool{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// add queues id unless it is queued already; an id handed out is queued
// again once done is called for it. After shutDown it does nothing.
func (q *workQueue) add(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown || q.dirty[id] {
		return
	}
	q.dirty[id] = true
	if q.processing[id] {
		return // done queues it
	}
	q.ids = append(q.ids, id)
	q.cond.Signal()
}

// addRemovalLocked queues lease e for the workers, which remove its
// container; while an operation holds e, its end queues it (endOpLocked).
// Called with the Manager's mu held (it reads e.op); never blocks.
func (q *workQueue) addRemovalLocked(e *entry) {
	if e.op == nil {
		q.add(e.l.ID)
	}
}

// get waits for an id and hands it out; false once the queue is shut down.
func (q *workQueue) get() (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.ids) == 0 && !q.shutdown {
		q.cond.Wait()
	}
	if q.shutdown {
		return "", false
	}
	id := q.ids[0]
	q.ids[0] = ""
	q.ids = q.ids[1:]
	q.processing[id] = true
	delete(q.dirty, id)
	return id, true
}

// done ends the handling of id that get handed out, queueing it again if
// it was added meanwhile.
func (q *workQueue) done(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, id)
	if q.dirty[id] && !q.shutdown {
		q.ids = append(q.ids, id)
		q.cond.Signal()
	}
}

// has reports whether id is queued or handed out.
func (q *workQueue) has(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dirty[id] || q.processing[id]
}

// shutDown wakes every get, which then reports false; later adds are
// dropped. What was queued is left (Start's reconcile settles it).
func (q *workQueue) shutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shutdown = true
	q.cond.Broadcast()
}
