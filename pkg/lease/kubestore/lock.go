package kubestore

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// lockAttempts bounds LockConversation's retries when the lock is deleted
// between its create and its read.
const lockAttempts = 5

// lockObject returns the conversation lock (owner, conversation) held by id.
func (s *Store) lockObject(owner, conversation, id string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      FleetLockName(s.cfg.Fleet, owner, conversation),
			Namespace: s.cfg.Namespace,
			Labels:    map[string]string{LabelManagedBy: ManagedBy, LabelKind: KindConversationLock, LabelFleet: s.cfg.Fleet},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &id},
	}
}

// holderOf returns a lock's holder ("" when it has none).
func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// LockConversation implements lease.SharedStore: it creates the
// coordination.k8s.io Lease FleetLockName(fleet, owner, conversation) held by id. When
// it exists (AlreadyExists: another lease, maybe of another replica, got
// there first) it returns the current holder, read from the API server.
func (s *Store) LockConversation(ctx context.Context, owner, conversation, id string) (string, error) {
	if id == "" {
		return "", errdefs.InvalidArgument("id", "lease id is empty")
	}
	leases := s.cs.CoordinationV1().Leases(s.cfg.Namespace)
	obj := s.lockObject(owner, conversation, id)
	for attempt := 1; ; attempt++ {
		_, err := leases.Create(ctx, obj, metav1.CreateOptions{FieldManager: fieldManager})
		if err == nil {
			return id, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return "", s.apiErr(err, "lock conversation", obj.Name)
		}
		cur, err := leases.Get(ctx, obj.Name, metav1.GetOptions{})
		switch {
		case err == nil:
			return holderOf(cur), nil
		case apierrors.IsNotFound(err) && attempt < lockAttempts:
			continue // released in between: try again
		default:
			return "", s.apiErr(err, "read conversation lock", obj.Name)
		}
	}
}

// TakeConversation implements lease.SharedStore: it reads the lock and,
// if old holds it, makes id its holder with an update carrying the
// resourceVersion read, so that of two replicas taking it over at once
// only one succeeds (Conflict: false, nil). A missing lock, or one held by
// another lease than old, is false, nil.
func (s *Store) TakeConversation(ctx context.Context, owner, conversation, old, id string) (bool, error) {
	if id == "" {
		return false, errdefs.InvalidArgument("id", "lease id is empty")
	}
	leases := s.cs.CoordinationV1().Leases(s.cfg.Namespace)
	name := FleetLockName(s.cfg.Fleet, owner, conversation)
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, s.apiErr(err, "read conversation lock", name)
	case holderOf(cur) != old:
		return false, nil
	}
	cur.Spec.HolderIdentity = &id
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	cur.Labels[LabelManagedBy], cur.Labels[LabelKind], cur.Labels[LabelFleet] = ManagedBy, KindConversationLock, s.cfg.Fleet
	_, err = leases.Update(ctx, cur, metav1.UpdateOptions{FieldManager: fieldManager})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return false, nil // changed or released in between
	default:
		return false, s.apiErr(err, "take conversation lock", name)
	}
}

// UnlockConversation implements lease.SharedStore: it reads the lock and,
// if id holds it, deletes it with preconditions on the UID and
// resourceVersion read, so that a lock taken over in between is left
// alone. A missing lock, or one held by another lease, is success.
func (s *Store) UnlockConversation(ctx context.Context, owner, conversation, id string) error {
	leases := s.cs.CoordinationV1().Leases(s.cfg.Namespace)
	name := FleetLockName(s.cfg.Fleet, owner, conversation)
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return s.apiErr(err, "read conversation lock", name)
	case holderOf(cur) != id:
		return nil
	}
	uid, rv := cur.UID, cur.ResourceVersion
	err = leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil // deleted, or gone or taken over in between
	default:
		return s.apiErr(err, "unlock conversation", name)
	}
}
