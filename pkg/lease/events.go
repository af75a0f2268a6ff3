package lease

import (
	"context"
	"log/slog"
	"sync"
)

// SubscriberBuffer is how many events a subscriber may fall behind before
// it is dropped.
const SubscriberBuffer = 256

// Event is a change to a lease, delivered by Subscribe.
type Event struct {
	// Lease is the lease after the change.
	Lease Lease
	// Transition is the state change, or nil for a change that is not one
	// (a renew, which moves ExpiresAt).
	Transition *Transition
}

// EventFilter selects the events of Subscribe. Empty fields match everything.
type EventFilter struct {
	// Owner keeps one owner's leases; edges must set it for clients.
	Owner string
	// LeaseID keeps one lease's events.
	LeaseID string
	// ConversationID keeps one conversation's events.
	ConversationID string
}

func (f *EventFilter) match(l *Lease) bool {
	return (f.Owner == "" || l.Owner == f.Owner) &&
		(f.LeaseID == "" || l.ID == f.LeaseID) &&
		(f.ConversationID == "" || l.ConversationID == f.ConversationID)
}

type subscriber struct {
	filter EventFilter
	ch     chan Event
	closed bool
}

// closeLocked closes the channel once. Called with Manager.mu held.
func (s *subscriber) closeLocked() {
	if !s.closed {
		s.closed = true
		close(s.ch)
	}
}

// hub is the subscribers of the Manager's lease events (Subscribe): it
// sends each change to those whose filter matches. It shares the
// Manager's mu, which guards its set: methods named ...Locked are called
// with it held, subscribe takes it.
type hub struct {
	log  *slog.Logger
	mu   *sync.Mutex // the Manager's
	subs map[*subscriber]struct{}
	// closed is set by closeLocked (Manager.Close): later subscribers
	// get a closed channel.
	closed bool
}

// newHub returns the hub of a Manager whose mu is mu.
func newHub(log *slog.Logger, mu *sync.Mutex) *hub {
	return &hub{log: log, mu: mu, subs: map[*subscriber]struct{}{}}
}

// Subscribe returns a channel of the events matching f from now on, in the
// order they happen (including each lease's creation, a transition from
// StateUnspecified to PENDING). The channel is closed when ctx ends, when
// the Manager closes, or when the subscriber falls more than
// SubscriberBuffer events behind — transitions never wait for a slow
// subscriber. A channel closed while ctx is still live means events were
// lost: List and subscribe again.
func (m *Manager) Subscribe(ctx context.Context, f EventFilter) <-chan Event {
	return m.hub.subscribe(ctx, f)
}

// subscribe implements Manager.Subscribe.
func (h *hub) subscribe(ctx context.Context, f EventFilter) <-chan Event {
	s := &subscriber{filter: f, ch: make(chan Event, SubscriberBuffer)}
	h.mu.Lock()
	if h.closed || ctx.Err() != nil {
		s.closeLocked()
		h.mu.Unlock()
		return s.ch
	}
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, s)
		s.closeLocked()
	})
	return s.ch
}

// closeLocked closes every subscriber's channel and those of later ones
// (Manager.Close). Called with mu held.
func (h *hub) closeLocked() {
	h.closed = true
	subs := h.subs
	h.subs = map[*subscriber]struct{}{}
	for s := range subs {
		s.closeLocked()
	}
}

// emitLocked sends an event about e to every matching subscriber, dropping
// those that are full. Called with mu held.
func (h *hub) emitLocked(e *entry, t *Transition) {
	if len(h.subs) == 0 {
		return
	}
	var ev *Event
	for s := range h.subs {
		if !s.filter.match(&e.l) {
			continue
		}
		if ev == nil {
			ev = &Event{Lease: e.l.Clone()}
			if t != nil {
				tc := *t
				ev.Transition = &tc
			}
		}
		select {
		case s.ch <- *ev:
		default:
			h.log.Warn("dropping slow lease event subscriber", "lease_id", e.l.ID)
			delete(h.subs, s)
			s.closeLocked()
		}
	}
}
