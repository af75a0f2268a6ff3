package lease

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
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
	// Duration is how long taking it took (set by Snapshots.Take only).
	Duration time.Duration
}

// SnapshotConfig configures snapshots (snapshot.go): the limits on one
// owner's snapshots. Zero fields take the defaults (DefaultSnapshotConfig).
type SnapshotConfig struct {
	// MaxPerOwner bounds the number of one owner's snapshots (on this
	// instance): one more is errdefs.ErrResourceExhausted naming
	// max_snapshots_per_owner. Default 0 (or negative): no limit.
	MaxPerOwner int
	// MaxBytesPerOwner bounds the bytes one owner's snapshots add together
	// (Snapshot.Size): a snapshot beyond it is removed again and
	// errdefs.ErrResourceExhausted naming max_snapshot_bytes_per_owner.
	// Default 0 (or negative): no limit.
	MaxBytesPerOwner int64
}

// DefaultSnapshotConfig returns the defaults of SnapshotConfig: no limit
// on an owner's snapshots, neither on their number nor on their bytes.
func DefaultSnapshotConfig() SnapshotConfig {
	return SnapshotConfig{}
}

// withDefaults fills the zero fields of c from DefaultSnapshotConfig. Every
// value is valid: 0 or a negative limit is no limit.
func (c SnapshotConfig) withDefaults() (SnapshotConfig, error) {
	d := DefaultSnapshotConfig()
	if c.MaxPerOwner == 0 {
		c.MaxPerOwner = d.MaxPerOwner
	}
	if c.MaxBytesPerOwner == 0 {
		c.MaxBytesPerOwner = d.MaxBytesPerOwner
	}
	return c, nil
}

// Snapshots are the snapshots of a Manager's instance: taking, listing,
// finding and removing them (Manager.Snapshots). Forks are acquires
// (AcquireRequest.Snapshot).
type Snapshots interface {
	// Take stores READY or PAUSED lease id's sandbox files as snapshot
	// name ("" names it LEASEID-YYYYMMDD-HHMMSS) of the lease's owner.
	// Names are per owner: the image tag is runtime.SnapshotTag of the
	// instance, the owner and the name, so another owner's snapshot of the
	// same name neither collides nor shows. The lease's state does not
	// change: a running sandbox is frozen for the time its files are read,
	// a paused one stays paused; pause and resume calls wait meanwhile.
	// Errors: errdefs.ErrInvalidArgument naming "name"; ErrAlreadyExists
	// for a name the owner took; ErrResourceExhausted naming the limit
	// when the owner has SnapshotConfig.MaxPerOwner snapshots, or its
	// snapshots would add more than SnapshotConfig.MaxBytesPerOwner bytes;
	// ErrNotFound for an unknown lease; ErrFailedPrecondition for a lease
	// in another state or a runtime that cannot snapshot.
	Take(ctx context.Context, id, name string) (Snapshot, error)
	// List lists this instance's snapshots matching f, by name.
	List(ctx context.Context, f SnapshotFilter) ([]Snapshot, error)
	// Get returns snapshot name (a name, or a berth/snapshot:NAME
	// reference) of owner; with anyOwner (the operator) the one of that
	// name of any owner, or the one stored under that tag.
	// errdefs.ErrNotFound when there is none: another owner's snapshot is
	// not found, exactly like a missing one. With anyOwner a name several
	// owners use is ErrInvalidArgument listing their tags, unless one of
	// them is owner's.
	Get(ctx context.Context, name, owner string, anyOwner bool) (Snapshot, error)
	// Remove removes snapshot name of owner (any owner's with anyOwner, as
	// Get finds it): errdefs.ErrNotFound when there is no such snapshot
	// (or it is another owner's), ErrFailedPrecondition while a sandbox
	// forked from it exists (release those leases first).
	Remove(ctx context.Context, name, owner string, anyOwner bool) error
}

// Snapshots returns the snapshots of this instance.
func (m *Manager) Snapshots() Snapshots { return m.snaps }

// snapshotLeases is what the snapshotKeeper needs of the leases: a
// lease held still while its sandbox is snapshotted. The pauser
// implements it (pause.go).
type snapshotLeases interface {
	// holdForSnapshot waits for a pause or resume of lease id in flight,
	// then holds the lease: pause and resume calls wait until release is
	// called, and so does the Manager's shutdown. It returns a copy of the
	// lease. Errors: errdefs.ErrNotFound for an unknown lease,
	// ErrFailedPrecondition for one neither READY nor PAUSED, ErrUnavailable
	// while the Manager is not started or shut down.
	holdForSnapshot(ctx context.Context, id string) (l Lease, release func(), err error)
}

var _ Snapshots = (*snapshotKeeper)(nil)

// snapshotKeeper owns the snapshots of the leases: it takes them within
// the owner's limits, lists, finds and removes them, and resolves the
// snapshot a fork starts from.
type snapshotKeeper struct {
	cfg        SnapshotConfig
	instanceID string
	rt         Runtime
	log        *slog.Logger
	now        func() time.Time // the lease clock (Manager.now)
	leases     snapshotLeases
	// mu makes one Take at a time: its owner's limits are checked, then
	// the snapshot is taken.
	mu sync.Mutex
}

// newSnapshotKeeper returns the keeper of cfg (with defaults applied)
// over rt; leases is the Manager.
func newSnapshotKeeper(cfg SnapshotConfig, instanceID string, rt Runtime, log *slog.Logger, now func() time.Time,
	leases snapshotLeases) *snapshotKeeper {
	return &snapshotKeeper{cfg: cfg, instanceID: instanceID, rt: rt, log: log, now: now, leases: leases}
}

// snapshotter returns the runtime's Snapshotter, or FailedPrecondition
// naming the backend.
func (k *snapshotKeeper) snapshotter() (runtime.Snapshotter, error) {
	if sn, ok := k.rt.(runtime.Snapshotter); ok {
		return sn, nil
	}
	return nil, errdefs.FailedPrecondition("the %s runtime cannot snapshot a sandbox", backendName(k.rt))
}

// snapshotTimeout bounds one snapshot's runtime work.
const snapshotTimeout = 5 * time.Minute

// Take implements Snapshots.
func (k *snapshotKeeper) Take(ctx context.Context, id, name string) (Snapshot, error) {
	sn, err := k.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	if name == "" {
		name = fmt.Sprintf("%s-%s", id, k.now().Format("20060102-150405"))
	}
	if err := runtime.ValidSnapshotName("name", name); err != nil {
		return Snapshot{}, err
	}
	l, release, err := k.leases.holdForSnapshot(ctx, id)
	if err != nil {
		return Snapshot{}, err
	}
	defer release()

	// One snapshot at a time: the owner's limits hold for what it takes.
	k.mu.Lock()
	defer k.mu.Unlock()
	used, err := k.snapshotUsage(ctx, sn, l.Owner)
	if err != nil {
		return Snapshot{}, err
	}
	if err := k.checkSnapshotLimits(l.Owner, used, 0); err != nil {
		return Snapshot{}, err
	}
	// The owner's name is taken whatever tag holds it (a snapshot of an
	// older version is stored under its bare name).
	if _, err := k.findSnapshot(ctx, sn, "name", name, l.Owner, false); err == nil {
		return Snapshot{}, errdefs.AlreadyExists("name: snapshot %s exists", name)
	} else if !errdefs.IsNotFound(err) {
		return Snapshot{}, err
	}
	image := l.Image
	if _, ok := runtime.SnapshotTagOf(image); ok {
		// A fork's snapshot names the image its source ran.
		if src, err := k.snapshotByRef(ctx, sn, image); err == nil && src.Image != "" {
			image = src.Image
		}
	}
	labels := map[string]string{
		runtime.LabelSnapshotLease:        l.ID,
		runtime.LabelSnapshotConversation: l.ConversationID,
		runtime.LabelSnapshotOwner:        l.Owner,
		runtime.LabelSnapshotImage:        image,
		runtime.LabelSnapshotUser:         l.User,
		runtime.LabelInstance:             k.instanceID,
	}
	tag := runtime.SnapshotTag(k.instanceID, l.Owner, name)
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
	if err := k.checkSnapshotLimits(l.Owner, used, s.Size); err != nil {
		// Its size is known only once it is taken: one over the bytes
		// limit is removed again.
		if rerr := sn.RemoveSnapshot(rctx, s.Tag); rerr != nil {
			k.log.Warn("removing a snapshot over its owner's limit failed", "snapshot", name, "tag", s.Tag, "err", rerr)
		}
		return Snapshot{}, err
	}
	k.log.Info("lease snapshotted", "lease_id", id, "container_id", l.ContainerID, "snapshot", name, "tag", s.Tag,
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
func (k *snapshotKeeper) snapshotUsage(ctx context.Context, sn runtime.Snapshotter, owner string) (snapshotUse, error) {
	if k.cfg.MaxPerOwner <= 0 && k.cfg.MaxBytesPerOwner <= 0 {
		return snapshotUse{}, nil
	}
	imgs, err := sn.Snapshots(ctx, runtime.Selector{runtime.LabelInstance: k.instanceID, runtime.LabelSnapshotOwner: owner})
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
// SnapshotConfig.MaxPerOwner, or would add more than
// SnapshotConfig.MaxBytesPerOwner bytes with it (or are at it already):
// errdefs.ErrResourceExhausted naming the limit.
func (k *snapshotKeeper) checkSnapshotLimits(owner string, used snapshotUse, size int64) error {
	if mx := k.cfg.MaxPerOwner; mx > 0 && size == 0 && used.count >= mx {
		return errdefs.ResourceExhausted("snapshot limit max_snapshots_per_owner: owner %q has %d snapshots, the maximum per owner is %d; remove one first", owner, used.count, mx)
	}
	mx := k.cfg.MaxBytesPerOwner
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

// SnapshotFilter selects snapshots for Snapshots.List.
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

// List implements Snapshots.
func (k *snapshotKeeper) List(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	sn, err := k.snapshotter()
	if err != nil {
		return nil, err
	}
	sel := runtime.Selector{runtime.LabelInstance: k.instanceID}
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

// Get implements Snapshots.
func (k *snapshotKeeper) Get(ctx context.Context, name, owner string, anyOwner bool) (Snapshot, error) {
	sn, err := k.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	if name, err = snapshotNameOf("name", name); err != nil {
		return Snapshot{}, err
	}
	return k.findSnapshot(ctx, sn, "name", name, owner, anyOwner)
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
// see Snapshots.Get) up among this instance's; errors name field.
func (k *snapshotKeeper) findSnapshot(ctx context.Context, sn runtime.Snapshotter, field, name, owner string, anyOwner bool) (Snapshot, error) {
	if err := runtime.ValidSnapshotName(field, name); err != nil {
		return Snapshot{}, err
	}
	sel := runtime.Selector{runtime.LabelInstance: k.instanceID}
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
func (k *snapshotKeeper) snapshotByRef(ctx context.Context, sn runtime.Snapshotter, ref string) (Snapshot, error) {
	tag, ok := runtime.SnapshotTagOf(ref)
	if !ok {
		return Snapshot{}, errdefs.NotFound("snapshot %s", ref)
	}
	imgs, err := sn.Snapshots(ctx, runtime.Selector{runtime.LabelInstance: k.instanceID})
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

// Remove implements Snapshots.
func (k *snapshotKeeper) Remove(ctx context.Context, name, owner string, anyOwner bool) error {
	s, err := k.Get(ctx, name, owner, anyOwner)
	if err != nil {
		return err
	}
	sn, _ := k.snapshotter()
	if err := sn.RemoveSnapshot(ctx, s.Tag); err != nil {
		return wrapf(err, "remove snapshot %s", s.Name)
	}
	k.log.Info("snapshot removed", "snapshot", s.Name, "tag", s.Tag, "owner", s.Owner)
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
func (k *snapshotKeeper) resolveFork(ctx context.Context, req AcquireRequest) (AcquireRequest, error) {
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
	sn, err := k.snapshotter()
	if err != nil {
		return req, err
	}
	s, err := k.findSnapshot(ctx, sn, field, name, req.Owner, req.AnySnapshot)
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
