package lease

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Snapshot is a snapshot of a lease's sandbox: its files stored as a local
// image (runtime.Snapshotter) that a later acquire may start from (a fork,
// AcquireRequest.Snapshot).
type Snapshot struct {
	// Name is the snapshot's name (one owner's: two owners may each have
	// a snapshot of one name). Tag is the image tag it is stored under
	// (runtime.SnapshotTag of the instance, owner and name) and Ref its
	// image reference (berth/snapshot:TAG), what a fork runs.
	// AcquireRequest.Image accepts berth/snapshot:NAME for the caller's
	// snapshot NAME.
	Name, Tag string
	Ref       string
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
// name ("" names it LEASEID-YYYYMMDD-HHMMSS) of the lease's owner. Names
// are per owner: the image tag is runtime.SnapshotTag of the instance, the
// owner and the name, so another owner's snapshot of the same name neither
// collides nor shows. The lease's state does not change: a running sandbox
// is frozen for the time its files are read, a paused one stays paused;
// pause and resume calls wait meanwhile.
// Errors: errdefs.ErrInvalidArgument naming "name"; ErrAlreadyExists for a
// name the owner took; ErrResourceExhausted naming the limit when the
// owner has Config.MaxSnapshotsPerOwner snapshots, or its snapshots would
// add more than Config.MaxSnapshotBytesPerOwner bytes; ErrNotFound for an
// unknown lease; ErrFailedPrecondition for a lease in another state or a
// runtime that cannot snapshot.
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
	e, err := m.pauser.idleEntryLocked(ctx, id)
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

	// One snapshot at a time: the owner's limits hold for what it takes.
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	used, err := m.snapshotUsage(ctx, sn, l.Owner)
	if err != nil {
		return Snapshot{}, err
	}
	if err := m.checkSnapshotLimits(l.Owner, used, 0); err != nil {
		return Snapshot{}, err
	}
	// The owner's name is taken whatever tag holds it (a snapshot of an
	// older version is stored under its bare name).
	if _, err := m.findSnapshot(ctx, sn, "name", name, l.Owner, false); err == nil {
		return Snapshot{}, errdefs.AlreadyExists("name: snapshot %s exists", name)
	} else if !errdefs.IsNotFound(err) {
		return Snapshot{}, err
	}
	image := l.Image
	if _, ok := runtime.SnapshotTagOf(image); ok {
		// A fork's snapshot names the image its source ran.
		if src, err := m.snapshotByRef(ctx, sn, image); err == nil && src.Image != "" {
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
	tag := runtime.SnapshotTag(m.cfg.InstanceID, l.Owner, name)
	rctx, cancel := detached(ctx, snapshotTimeout)
	defer cancel()
	began := time.Now()
	img, err := sn.Snapshot(rctx, l.ContainerID, runtime.SnapshotOptions{Name: name, Tag: tag, Labels: labels})
	if err != nil {
		if errdefs.IsAlreadyExists(err) {
			return Snapshot{}, errdefs.AlreadyExists("name: snapshot %s exists", name)
		}
		return Snapshot{}, wrapf(err, "snapshot lease %s", id)
	}
	s := fromImage(img)
	s.Duration = time.Since(began)
	if err := m.checkSnapshotLimits(l.Owner, used, s.Size); err != nil {
		// Its size is known only once it is taken: one over the bytes
		// limit is removed again.
		if rerr := sn.RemoveSnapshot(rctx, s.Tag); rerr != nil {
			m.log.Warn("removing a snapshot over its owner's limit failed", "snapshot", name, "tag", s.Tag, "err", rerr)
		}
		return Snapshot{}, err
	}
	m.log.Info("lease snapshotted", "lease_id", id, "container_id", l.ContainerID, "snapshot", name, "tag", s.Tag,
		"owner", l.Owner, "size_bytes", s.Size, "duration", s.Duration)
	return s, nil
}

// snapshotUse is what an owner's snapshots take.
type snapshotUse struct {
	count int
	bytes int64
}

// snapshotUsage counts owner's snapshots on this instance and the bytes
// they add.
func (m *Manager) snapshotUsage(ctx context.Context, sn runtime.Snapshotter, owner string) (snapshotUse, error) {
	if m.cfg.MaxSnapshotsPerOwner <= 0 && m.cfg.MaxSnapshotBytesPerOwner <= 0 {
		return snapshotUse{}, nil
	}
	imgs, err := sn.Snapshots(ctx, runtime.Selector{runtime.LabelInstance: m.cfg.InstanceID, runtime.LabelSnapshotOwner: owner})
	if err != nil {
		return snapshotUse{}, wrapf(err, "list the snapshots of owner %q", owner)
	}
	u := snapshotUse{count: len(imgs)}
	for _, img := range imgs {
		u.bytes += img.Size
	}
	return u, nil
}

// checkSnapshotLimits refuses owner's next snapshot (of size bytes; 0
// before it is taken) when owner's snapshots (used) are at
// Config.MaxSnapshotsPerOwner, or would add more than
// Config.MaxSnapshotBytesPerOwner bytes with it (or are at it already):
// errdefs.ErrResourceExhausted naming the limit.
func (m *Manager) checkSnapshotLimits(owner string, used snapshotUse, size int64) error {
	if mx := m.cfg.MaxSnapshotsPerOwner; mx > 0 && size == 0 && used.count >= mx {
		return errdefs.ResourceExhausted("snapshot limit max_snapshots_per_owner: owner %q has %d snapshots, the maximum per owner is %d; remove one first", owner, used.count, mx)
	}
	mx := m.cfg.MaxSnapshotBytesPerOwner
	if mx <= 0 {
		return nil
	}
	if total := used.bytes + size; (size == 0 && total >= mx) || total > mx {
		return errdefs.ResourceExhausted("snapshot limit max_snapshot_bytes_per_owner: owner %q's snapshots would take %d bytes, the maximum per owner is %d; remove some first", owner, total, mx)
	}
	return nil
}

// fromImage converts a runtime snapshot image.
func fromImage(img runtime.SnapshotImage) Snapshot {
	return Snapshot{
		Name: img.Name, Tag: img.Tag, Ref: img.Ref, ID: img.ID, Size: img.Size, CreatedAt: img.CreatedAt,
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

// GetSnapshot returns snapshot name (a name, or a berth/snapshot:NAME
// reference) of owner; with anyOwner (the operator) the one of that name
// of any owner, or the one stored under that tag. errdefs.ErrNotFound when
// there is none: another owner's snapshot is not found, exactly like a
// missing one. With anyOwner a name several owners use is
// ErrInvalidArgument listing their tags, unless one of them is owner's.
func (m *Manager) GetSnapshot(ctx context.Context, name, owner string, anyOwner bool) (Snapshot, error) {
	sn, err := m.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	if name, err = snapshotNameOf("name", name); err != nil {
		return Snapshot{}, err
	}
	return m.findSnapshot(ctx, sn, "name", name, owner, anyOwner)
}

// snapshotNameOf returns the snapshot name s gives: s itself, or the tag
// of a reference into runtime.SnapshotRepository ("berth/snapshot:NAME",
// normalised like an acquire's image). The error names field.
func snapshotNameOf(field, s string) (string, error) {
	if !strings.ContainsAny(s, "/:@") {
		return s, nil
	}
	ir, err := runtime.ParseImageRef(field, s)
	if err != nil {
		return "", err
	}
	if !ir.Snapshot {
		return "", errdefs.InvalidArgument(field, "%q is neither a snapshot name nor a %s reference", s, runtime.SnapshotRepository)
	}
	return ir.SnapshotTag, nil
}

// findSnapshot looks snapshot name of owner (any owner's with anyOwner:
// see GetSnapshot) up among this instance's; errors name field.
func (m *Manager) findSnapshot(ctx context.Context, sn runtime.Snapshotter, field, name, owner string, anyOwner bool) (Snapshot, error) {
	if err := runtime.ValidSnapshotName(field, name); err != nil {
		return Snapshot{}, err
	}
	sel := runtime.Selector{runtime.LabelInstance: m.cfg.InstanceID}
	if !anyOwner {
		sel[runtime.LabelSnapshotOwner] = owner
		sel[runtime.LabelSnapshot] = name
	}
	imgs, err := sn.Snapshots(ctx, sel)
	if err != nil {
		return Snapshot{}, wrapf(err, "get snapshot %s", name)
	}
	var found, owners []Snapshot
	for _, img := range imgs {
		s := fromImage(img)
		switch {
		case !anyOwner && (s.Name != name || s.Owner != owner):
			continue
		case anyOwner && s.Name != name && s.Tag != name:
			continue
		}
		found = append(found, s)
		if s.Owner == owner {
			owners = append(owners, s)
		}
	}
	if anyOwner && len(found) > 1 && len(owners) > 0 {
		found = owners
	}
	switch len(found) {
	case 0:
		return Snapshot{}, errdefs.NotFound("snapshot %s", name)
	case 1:
		return found[0], nil
	}
	if !anyOwner {
		return found[0], nil
	}
	tags := make([]string, 0, len(found))
	for _, s := range found {
		tags = append(tags, s.Tag)
	}
	return Snapshot{}, errdefs.InvalidArgument(field, "%d owners have a snapshot named %s; name one by its tag (%s)", len(found), name, strings.Join(tags, ", "))
}

// snapshotByRef looks the snapshot stored as image ref up among this
// instance's.
func (m *Manager) snapshotByRef(ctx context.Context, sn runtime.Snapshotter, ref string) (Snapshot, error) {
	tag, ok := runtime.SnapshotTagOf(ref)
	if !ok {
		return Snapshot{}, errdefs.NotFound("snapshot %s", ref)
	}
	imgs, err := sn.Snapshots(ctx, runtime.Selector{runtime.LabelInstance: m.cfg.InstanceID})
	if err != nil {
		return Snapshot{}, wrapf(err, "get snapshot %s", ref)
	}
	for _, img := range imgs {
		if img.Tag == tag {
			return fromImage(img), nil
		}
	}
	return Snapshot{}, errdefs.NotFound("snapshot %s", ref)
}

// RemoveSnapshot removes snapshot name of owner (any owner's with
// anyOwner, as GetSnapshot finds it): errdefs.ErrNotFound when there is no
// such snapshot (or it is another owner's), ErrFailedPrecondition while a
// sandbox forked from it exists (release those leases first).
func (m *Manager) RemoveSnapshot(ctx context.Context, name, owner string, anyOwner bool) error {
	s, err := m.GetSnapshot(ctx, name, owner, anyOwner)
	if err != nil {
		return err
	}
	sn, _ := m.snapshotter()
	if err := sn.RemoveSnapshot(ctx, s.Tag); err != nil {
		return wrapf(err, "remove snapshot %s", s.Name)
	}
	m.log.Info("snapshot removed", "snapshot", s.Name, "tag", s.Tag, "owner", s.Owner)
	return nil
}

// resolveFork normalises req.Image once (runtime.ParseImageRef, the way the
// engines read it) and turns an acquire from a snapshot (req.Snapshot, or
// an Image into runtime.SnapshotRepository: "berth/snapshot:NAME" in any
// spelling, "berth/snapshot" being NAME "latest") into one of the
// snapshot's image, after looking the snapshot up by name among req.Owner's
// (any owner's with req.AnySnapshot): another owner's is NotFound like a
// missing one. Image ids, id prefixes and digest references into the
// snapshot repository are refused (ParseImageRef). The user defaults to
// the snapshotted lease's.
func (m *Manager) resolveFork(ctx context.Context, req AcquireRequest) (AcquireRequest, error) {
	name, field := req.Snapshot, "snapshot"
	if req.Image != "" {
		ir, err := runtime.ParseImageRef("image", req.Image)
		if err != nil {
			return req, err
		}
		req.Image = ir.Ref
		switch {
		case ir.Snapshot && name == "":
			name, field = ir.SnapshotTag, "image"
		case ir.Snapshot:
			if n, err := snapshotNameOf("snapshot", name); err != nil || n != ir.SnapshotTag {
				return req, errdefs.InvalidArgument("snapshot", "names %s but image names snapshot %s; give one", name, ir.SnapshotTag)
			}
		case name != "":
			return req, errdefs.InvalidArgument("snapshot", "a fork runs its snapshot's image; leave image empty")
		}
	}
	if name == "" {
		return req, nil
	}
	name, err := snapshotNameOf(field, name)
	if err != nil {
		return req, err
	}
	sn, err := m.snapshotter()
	if err != nil {
		return req, err
	}
	s, err := m.findSnapshot(ctx, sn, field, name, req.Owner, req.AnySnapshot)
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
