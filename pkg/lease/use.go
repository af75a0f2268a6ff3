package lease

import (
	"context"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Holds: how a request to a lease and a pause of it are ordered.
//
// A request to a PAUSED lease resumes it and is served: the caller sees
// latency, never an error. Checking the state, resuming and forwarding are
// separate steps, so a pause could land between them (the request then saw
// "is PAUSED" after its own resume, or was sent to a sandbox being stopped).
// Use closes both windows: it admits a request only to a READY lease and
// in the same critical section counts it on the lease until the sandbox
// answered it (Hold.Answered); an explicit Pause waits for the requests
// admitted before it and keeps new ones waiting (they resume the lease
// once it is paused); the idle policy never pauses a lease with a request
// in flight (until Hold.Done).

// pauseRequestGrace bounds how long an explicit Pause waits for the
// requests admitted before it (a long command, a stream that has not
// answered yet): after it the lease is paused anyway, and such a request
// waits for the resume (freeze) or fails (hibernate). It is the pauser's
// requestGrace, which tests lower.
const pauseRequestGrace = 10 * time.Second

// Hold is one request admitted to a READY lease by Use. Its methods may be
// called on a nil Hold (they do nothing) and more than once.
type Hold struct {
	p                *pauser
	e                *entry
	answered, ending bool // guarded by p.mu
}

// Use admits a request to lease id: it waits for a pause or resume in
// progress, resumes the lease when it is PAUSED (concurrent callers share
// one resume) and, once the lease is READY, records activity and returns
// its route with a Hold that keeps pauses off it until Hold.Answered (an
// explicit Pause waits, the idle policy skips it) and the idle policy off
// until Hold.Done. A pause that lands after a resume and before the
// request is admitted is resumed again: the caller waits, bounded by ctx.
// A lease in another state is returned with a nil Hold, for the caller to
// refuse; an unknown id is errdefs.ErrNotFound, and a resume that failed
// is returned as Resume returns it.
//
// With several replicas, a lease that is PENDING here only because another
// replica's READY record has not reached this one yet (the acquire was
// answered elsewhere) is waited for, up to remotePendingWait
// (replicas.go), before it is returned as PENDING.
func (m *Manager) Use(ctx context.Context, id string) (Route, *Hold, error) {
	rt, h, err := m.pauser.use(ctx, id)
	if err != nil || h != nil || rt.State != StatePending || !m.fleet.homedElsewhere(id) {
		return rt, h, err
	}
	// Also when the READY record arrived since use looked: the wait then
	// ends at once and use looks again.
	if m.fleet.awaitRemotePending(ctx, id, remotePendingWait) != nil {
		return rt, nil, nil // still PENDING: the caller refuses it
	}
	return m.pauser.use(ctx, id)
}

// use is Manager.Use.
func (p *pauser) use(ctx context.Context, id string) (Route, *Hold, error) {
	p.mu.Lock()
	for {
		e := p.leases[id]
		if e == nil {
			p.mu.Unlock()
			return Route{}, nil, errdefs.NotFound("lease %s", id)
		}
		if o := e.op; o != nil && o.kind.pausing() {
			p.mu.Unlock()
			if err := o.wait(ctx); err != nil {
				return Route{}, nil, err
			}
			p.mu.Lock()
			continue
		}
		switch e.l.State {
		case StateReady:
			e.uses++
			e.unanswered++
			e.l.LastActivityAt = p.host.now()
			e.activityDirty = true
			rt := routeLocked(e, p.chargedLocked(e))
			p.mu.Unlock()
			return rt, &Hold{p: p, e: e}, nil
		case StatePaused:
			p.mu.Unlock()
			if _, err := p.resumeLease(ctx, id); err != nil {
				return Route{}, nil, err
			}
			p.mu.Lock() // a pause may have landed since: look again
		default:
			rt := routeLocked(e, p.chargedLocked(e))
			p.mu.Unlock()
			return rt, nil, nil
		}
	}
}

// Answered says that the sandbox answered the request (its response
// headers arrived, or forwarding failed): a pause no longer waits for it.
func (h *Hold) Answered() {
	if h == nil {
		return
	}
	h.p.mu.Lock()
	h.answeredLocked()
	h.p.mu.Unlock()
}

// answeredLocked is Answered. Called with mu held.
func (h *Hold) answeredLocked() {
	if h.answered {
		return
	}
	h.answered = true
	e := h.e
	if e.unanswered--; e.unanswered == 0 && e.drained != nil {
		close(e.drained)
		e.drained = nil
	}
}

// Done says that the request ended (it implies Answered): the lease's
// idle clock starts again from now.
func (h *Hold) Done() {
	if h == nil {
		return
	}
	p, e := h.p, h.e
	p.mu.Lock()
	defer p.mu.Unlock()
	h.answeredLocked()
	if h.ending {
		return
	}
	h.ending = true
	e.uses--
	if e.l.State == StateReady {
		e.l.LastActivityAt = p.host.now()
		e.activityDirty = true
	}
}

// awaitAnsweredLocked waits until every request Use admitted to e before
// now was answered, while the pause holding e (entry.op) keeps new ones
// waiting.
// Called with mu held; it returns with mu held, and ctx's error if ctx
// ended first.
func (p *pauser) awaitAnsweredLocked(ctx context.Context, e *entry) error {
	if e.unanswered == 0 {
		return nil
	}
	drained := e.drained
	if drained == nil {
		drained = make(chan struct{})
		e.drained = drained
	}
	p.mu.Unlock()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.mu.Lock()
	return err
}

// routeLocked is e's Route; charged is what uploads added to its disk
// usage since the last measurement (diskEnforcer.chargedLocked). Called
// with mu held.
func routeLocked(e *entry, charged int64) Route {
	return Route{State: e.l.State, Reason: e.l.Reason, Owner: e.l.Owner, Endpoint: e.l.Endpoint, PublicPorts: e.l.PublicPorts,
		DiskLimit: e.l.Resources.DiskBytes, DiskUsed: e.l.Usage.DiskBytes + charged, App: e.l.App != nil}
}
