package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Snapshot is a snapshot of a lease's sandbox: its files stored as a local
// image (runtime.Snapshotter) that a later acquire may start from (a fork,
// AcquireRequest.Snapshot).
type Snapshot struct {
	// Name is the snapshot's name; Ref the image reference it is stored as
	// (berth/snapshot:NAME), which AcquireRequest.Image also accepts.
	Name string
	Ref  string
	// ID is the image id.
	ID string
	// LeaseID, ConversationID and Owner are the snapshotted lease's; a
	// snapshot belongs to Owner.
	LeaseID, ConversationID, Owner string
	// Image is the image the snapshotted lease ran (itself a snapshot for
	// a lease that was a fork).
	Image string
	// User is the user the snapshotted lease's commands ran as; a fork
	// runs as it unless it asks for another.
	User string
	// Size is the bytes the snapshot adds on top of Image.
	Size int64
	// CreatedAt is when it was taken.
	CreatedAt time.Time
	// Duration is how long taking it took (set by Manager.Snapshot only).
	Duration time.Duration
}

// snapshotter returns the runtime's Snapshotter, or FailedPrecondition
// naming the backend.
func (m *Manager) snapshotter() (runtime.Snapshotter, error) {
	if sn, ok := m.rt.(runtime.Snapshotter); ok {
		return sn, nil
	}
	return nil, errdefs.FailedPrecondition("the %s runtime cannot snapshot a sandbox", backendName(m.rt))
}

// snapshotTimeout bounds one snapshot's runtime work.
const snapshotTimeout = 5 * time.Minute

// Snapshot stores READY or PAUSED lease id's sandbox files as snapshot
// name ("" names it LEASEID-YYYYMMDD-HHMMSS). The lease's state does not
// change: a running sandbox is frozen for the time its files are read,
// a paused one stays paused; pause and resume calls wait meanwhile.
// Errors: errdefs.ErrInvalidArgument naming "name"; ErrAlreadyExists for a
// taken name; ErrNotFound for an unknown lease; ErrFailedPrecondition for a
// lease in another state or a runtime that cannot snapshot.
func (m *Manager) Snapshot(ctx context.Context, id, name string) (Snapshot, error) {
	sn, err := m.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	if name == "" {
		name = fmt.Sprintf("%s-%s", id, m.now().Format("20060102-150405"))
	}
	if err := runtime.ValidSnapshotName("name", name); err != nil {
		return Snapshot{}, err
	}
	m.mu.Lock()
	if err := m.enterLocked(); err != nil {
		m.mu.Unlock()
		return Snapshot{}, err
	}
	defer m.wg.Done()
	e, err := m.idleEntryLocked(ctx, id)
	if err != nil {
		return Snapshot{}, err
	}
	if e.l.State != StateReady && e.l.State != StatePaused {
		err := errNotUsable(&e.l)
		m.mu.Unlock()
		return Snapshot{}, err
	}
	// Pause and resume wait for the snapshot (a pauseOp that is no resume).
	op := &pauseOp{done: make(chan struct{})}
	e.pause = op
	l := e.l.Clone()
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		if e.pause == op {
			e.pause = nil
		}
		m.mu.Unlock()
		close(op.done)
	}()

	image := l.Image
	if _, ok := runtime.SnapshotName(image); ok {
		// A fork's snapshot names the image its source ran.
		if src, err := m.findSnapshot(ctx, sn, image); err == nil && src.Image != "" {
			image = src.Image
		}
	}
	labels := map[string]string{
		runtime.LabelSnapshotLease:        l.ID,
		runtime.LabelSnapshotConversation: l.ConversationID,
		runtime.LabelSnapshotOwner:        l.Owner,
		runtime.LabelSnapshotImage:        image,
		runtime.LabelSnapshotUser:         l.User,
		runtime.LabelInstance:             m.cfg.InstanceID,
	}
	rctx, cancel := detached(ctx, snapshotTimeout)
	defer cancel()
	began := time.Now()
	img, err := sn.Snapshot(rctx, l.ContainerID, runtime.SnapshotOptions{Name: name, Labels: labels})
	if err != nil {
		return Snapshot{}, wrapf(err, "snapshot lease %s", id)
	}
	s := fromImage(img)
	s.Duration = time.Since(began)
	m.log.Info("lease snapshotted", "lease_id", id, "container_id", l.ContainerID, "snapshot", name,
		"size_bytes", s.Size, "duration", s.Duration)
	return s, nil
}

// fromImage converts a runtime snapshot image.
func fromImage(img runtime.SnapshotImage) Snapshot {
	return Snapshot{
		Name: img.Name, Ref: img.Ref, ID: img.ID, Size: img.Size, CreatedAt: img.CreatedAt,
		LeaseID:        img.Labels[runtime.LabelSnapshotLease],
		ConversationID: img.Labels[runtime.LabelSnapshotConversation],
		Owner:          img.Labels[runtime.LabelSnapshotOwner],
		Image:          img.Labels[runtime.LabelSnapshotImage],
		User:           img.Labels[runtime.LabelSnapshotUser],
	}
}

// SnapshotFilter selects snapshots for Manager.Snapshots.
type SnapshotFilter struct {
	// Owner keeps one owner's snapshots; edges set it for clients.
	Owner string
	// AnyOwner lists every owner's snapshots (Owner is then ignored); the
	// edge sets it for the operator when no owner is asked for.
	AnyOwner bool
	// LeaseID keeps the snapshots of one lease.
	LeaseID string
	// ConversationID keeps the snapshots of one conversation.
	ConversationID string
}

// Snapshots lists this orchestrator's snapshots matching f, by name.
func (m *Manager) Snapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	sn, err := m.snapshotter()
	if err != nil {
		return nil, err
	}
	sel := runtime.Selector{runtime.LabelInstance: m.cfg.InstanceID}
	if !f.AnyOwner {
		sel[runtime.LabelSnapshotOwner] = f.Owner
	}
	if f.LeaseID != "" {
		sel[runtime.LabelSnapshotLease] = f.LeaseID
	}
	if f.ConversationID != "" {
		sel[runtime.LabelSnapshotConversation] = f.ConversationID
	}
	imgs, err := sn.Snapshots(ctx, sel)
	if err != nil {
		return nil, wrapf(err, "list snapshots")
	}
	out := make([]Snapshot, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, fromImage(img))
	}
	return out, nil
}

// GetSnapshot returns snapshot name (a name or its berth/snapshot:NAME
// reference) when it belongs to owner, or to anyone with anyOwner;
// errdefs.ErrNotFound otherwise (another owner's snapshot is not
// revealed).
func (m *Manager) GetSnapshot(ctx context.Context, name, owner string, anyOwner bool) (Snapshot, error) {
	sn, err := m.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	s, err := m.findSnapshot(ctx, sn, name)
	if err != nil {
		return Snapshot{}, err
	}
	if !anyOwner && s.Owner != owner {
		return Snapshot{}, errdefs.NotFound("snapshot %s", s.Name)
	}
	return s, nil
}

// findSnapshot looks snapshot name (or reference) up among this
// orchestrator's.
func (m *Manager) findSnapshot(ctx context.Context, sn runtime.Snapshotter, name string) (Snapshot, error) {
	if n, ok := runtime.SnapshotName(name); ok {
		name = n
	}
	if err := runtime.ValidSnapshotName("snapshot", name); err != nil {
		return Snapshot{}, err
	}
	imgs, err := sn.Snapshots(ctx, runtime.Selector{runtime.LabelInstance: m.cfg.InstanceID, runtime.LabelSnapshot: name})
	if err != nil {
		return Snapshot{}, wrapf(err, "get snapshot %s", name)
	}
	if len(imgs) == 0 {
		return Snapshot{}, errdefs.NotFound("snapshot %s", name)
	}
	return fromImage(imgs[0]), nil
}

// RemoveSnapshot removes snapshot name when it belongs to owner (or to
// anyone with anyOwner): errdefs.ErrNotFound when there is no such
// snapshot (or it is another owner's), ErrFailedPrecondition while a
// sandbox forked from it exists (release those leases first).
func (m *Manager) RemoveSnapshot(ctx context.Context, name, owner string, anyOwner bool) error {
	s, err := m.GetSnapshot(ctx, name, owner, anyOwner)
	if err != nil {
		return err
	}
	sn, _ := m.snapshotter()
	if err := sn.RemoveSnapshot(ctx, s.Name); err != nil {
		return wrapf(err, "remove snapshot %s", s.Name)
	}
	m.log.Info("snapshot removed", "snapshot", s.Name)
	return nil
}

// resolveFork turns an acquire from a snapshot (req.Snapshot, or an Image
// naming berth/snapshot:NAME) into one of the snapshot's image, after
// checking that the snapshot exists and belongs to req.Owner (any owner's
// with req.AnySnapshot). The user defaults to the snapshotted lease's.
func (m *Manager) resolveFork(ctx context.Context, req AcquireRequest) (AcquireRequest, error) {
	name := req.Snapshot
	if n, ok := runtime.SnapshotName(req.Image); ok {
		if name != "" && name != n {
			return req, errdefs.InvalidArgument("snapshot", "names %s but image names snapshot %s; give one", name, n)
		}
		name = n
	} else if name != "" && req.Image != "" {
		return req, errdefs.InvalidArgument("snapshot", "a fork runs its snapshot's image; leave image empty")
	}
	if name == "" {
		return req, nil
	}
	field := "snapshot"
	if req.Snapshot == "" {
		field = "image"
	}
	if n, ok := runtime.SnapshotName(name); ok {
		name = n
	}
	if err := runtime.ValidSnapshotName(field, name); err != nil {
		return req, err
	}
	s, err := m.GetSnapshot(ctx, name, req.Owner, req.AnySnapshot)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return req, fmt.Errorf("%w: %s: snapshot %s not found", errdefs.ErrNotFound, field, name)
		}
		return req, err
	}
	req.Snapshot, req.Image = s.Name, s.Ref
	if req.User == "" {
		req.User = s.User
	}
	req.fork = &s
	return req, nil
}
