package lease

import "context"

// SharedStore is a Store that several orchestrator replicas serve one fleet
// from (the Kubernetes cluster's, pkg/lease/kubestore). Each replica keeps
// every record in memory as with any Store; a SharedStore adds what keeps
// those memories in step and makes acquire idempotent across replicas:
//
//   - Subscribe feeds a replica the records other replicas write;
//   - the conversation lock gives one live lease per (owner, conversation)
//     fleet-wide: an object with a name derived from the owner and the
//     conversation id, whose creation fails with AlreadyExists when another
//     replica got there first (that replica's lease is then joined).
//
// A SharedStore is built for one replica (its instance id): it marks the
// records it writes with it, and Subscribe leaves those out.
//
// Concurrent writes of one record by two replicas are last-writer-wins
// (docs/kubernetes.md says which replica writes what).
type SharedStore interface {
	Store
	// Subscribe calls fn, from one goroutine, for every record another
	// replica creates or changes (deleted false) or deletes (deleted true;
	// only l.ID is set), until ctx ends. It first replays every record the
	// store holds that another replica wrote last. fn must not block for
	// long (it must not call the Store).
	Subscribe(ctx context.Context, fn func(l Lease, deleted bool)) error
	// LockConversation makes lease id the live lease of (owner,
	// conversation) unless another lease holds it, and returns the holder:
	// id when the lock is now id's, else the other lease's id.
	LockConversation(ctx context.Context, owner, conversation, id string) (holder string, err error)
	// TakeConversation replaces holder old by id, only if old still holds
	// the lock (a lock left by a lease that ended, or by a replica that
	// died before it wrote its lease). It reports whether id holds it now.
	TakeConversation(ctx context.Context, owner, conversation, old, id string) (bool, error)
	// UnlockConversation removes the lock if id holds it; a lock that is
	// missing or held by another lease is left alone (success).
	UnlockConversation(ctx context.Context, owner, conversation, id string) error
}
