package lease

import "context"

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

// Subscribe returns a channel of the events matching f from now on, in the
// order they happen (including each lease's creation, a transition from
// StateUnspecified to PENDING). The channel is closed when ctx ends, when
// the Manager closes, or when the subscriber falls more than
// SubscriberBuffer events behind — transitions never wait for a slow
// subscriber. A channel closed while ctx is still live means events were
// lost: List and subscribe again.
func (m *Manager) Subscribe(ctx context.Context, f EventFilter) <-chan Event {
	s := &subscriber{filter: f, ch: make(chan Event, SubscriberBuffer)}
	m.mu.Lock()
	if m.closed || ctx.Err() != nil {
		s.closeLocked()
		m.mu.Unlock()
		return s.ch
	}
	m.subs[s] = struct{}{}
	m.mu.Unlock()
	context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.subs, s)
		s.closeLocked()
	})
	return s.ch
}

// emitLocked sends an event about e to every matching subscriber, dropping
// those that are full. Called with mu held.
func (m *Manager) emitLocked(e *entry, t *Transition) {
	if len(m.subs) == 0 {
		return
	}
	var ev *Event
	for s := range m.subs {
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
			m.log.Warn("dropping slow lease event subscriber", "lease_id", e.l.ID)
			delete(m.subs, s)
			s.closeLocked()
		}
	}
}
