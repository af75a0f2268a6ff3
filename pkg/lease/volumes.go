package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/periodic"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// WorkspaceTarget is where a persistent workspace volume is mounted.
const WorkspaceTarget = runtime.DefaultWorkDir

// VolumeNamePrefix starts the name of every workspace volume.
const VolumeNamePrefix = "berth-ws-"

// VolumeName is the workspace volume of owner's conversation: the prefix
// and 32 hex digits of the SHA-256 of owner and conversation id (ids are
// free text; volume names are not). Two owners' identical conversation
// ids get different volumes.
func VolumeName(owner, conversationID string) string {
	sum := sha256.Sum256([]byte(owner + "\x00" + conversationID))
	return VolumeNamePrefix + hex.EncodeToString(sum[:16])
}

// VolumeConfig configures workspace volumes and host mounts (volumes.go).
// Zero fields take the defaults (DefaultVolumeConfig).
type VolumeConfig struct {
	// PersistWorkspaces makes every acquire persist its workspace, as if
	// it set AcquireRequest.Persist. Default false.
	PersistWorkspaces bool
	// HostMounts are the host directories acquires may mount
	// (AcquireRequest.Mounts), read-only or read-write per prefix. Default
	// none: every host mount is refused. The symlinks of the prefixes
	// themselves are resolved once, when the Manager starts; every host
	// mount is checked again before each in-place restart and resume from
	// hibernate.
	HostMounts runtime.HostMountPolicy
	// Retention removes a workspace volume once it has been unused (no
	// live lease; last used = its last lease's end) for longer than this.
	// Default 0: volumes are kept until an operator removes them.
	Retention time.Duration
	// ReapInterval is how often volumes are checked against Retention.
	// Default 1m (at most Retention/2).
	ReapInterval time.Duration
	// MaxPerOwner bounds one owner's workspace volumes (on this instance):
	// a persisting acquire that would create one more gets
	// errdefs.ErrResourceExhausted naming the limit; acquires that mount an
	// existing volume, and NoOwnerLimit acquires, are not refused. Default
	// 0: no limit.
	MaxPerOwner int
}

// DefaultVolumeConfig returns the defaults of VolumeConfig: volumes kept
// until removed, checked every minute once a retention is set, no limit
// per owner, no host mounts, persistence per acquire.
func DefaultVolumeConfig() VolumeConfig {
	return VolumeConfig{ReapInterval: time.Minute}
}

// withDefaults fills the zero fields of c from DefaultVolumeConfig, bounds
// ReapInterval by Retention/2, and validates c: negative durations or
// limits are errdefs.ErrInvalidArgument.
func (c VolumeConfig) withDefaults() (VolumeConfig, error) {
	switch {
	case c.Retention < 0:
		return c, errdefs.InvalidArgument("volume_retention", "volume retention must not be negative (0 keeps volumes), got %s", c.Retention)
	case c.ReapInterval < 0:
		return c, errdefs.InvalidArgument("volume_retention", "volume reap interval must not be negative, got %s", c.ReapInterval)
	case c.MaxPerOwner < 0:
		return c, errdefs.InvalidArgument("max_volumes_per_owner", "max volumes per owner must not be negative (0: no limit), got %d", c.MaxPerOwner)
	}
	d := DefaultVolumeConfig()
	if c.ReapInterval == 0 {
		c.ReapInterval = d.ReapInterval
	}
	if c.Retention > 0 {
		c.ReapInterval = min(c.ReapInterval, max(c.Retention/2, 10*time.Millisecond))
	}
	return c, nil
}

// Validate reports whether New would accept c (errdefs.ErrInvalidArgument
// naming the setting when not).
func (c VolumeConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// HostMount asks for a host path in the sandbox (AcquireRequest.Mounts).
type HostMount struct {
	// HostPath is an absolute host path; its symlinks and ".." are
	// resolved before it is checked against VolumeConfig.HostMounts.
	HostPath string
	// Target is the absolute path inside the sandbox.
	Target string
	// ReadOnly mounts it read-only; required under a read-only prefix.
	ReadOnly bool
	// pin is the identity of the resolved HostPath when validateMounts
	// checked it (runtime.HostMountPolicy.Pin).
	pin runtime.FileID
}

// Volumes are the workspace volumes of a Manager's instance, as the
// operator and clients see them (Manager.Volumes).
type Volumes interface {
	// List returns this instance's workspace volumes matching f, by
	// name, without sizes (SizeBytes -1).
	List(ctx context.Context, f VolumeFilter) ([]VolumeInfo, error)
	// Inspect returns one volume of this instance with its size
	// measured; errdefs.ErrNotFound when there is none.
	Inspect(ctx context.Context, name string) (VolumeInfo, error)
	// Remove removes a workspace volume of this instance and its record.
	// A volume a lease uses (live, or ended with its container not
	// removed yet) is errdefs.ErrFailedPrecondition naming the lease; a
	// missing one is NotFound. While it runs, an acquire that would mount
	// the volume is refused (Unavailable, retry).
	Remove(ctx context.Context, name string) error
}

// Volumes returns the workspace volumes of this instance.
func (m *Manager) Volumes() Volumes { return m.vols }

// volumeHost is what the volumeKeeper needs from the Manager, whose
// lock (volumeKeeper.mu) guards both the leases and the keeper's busy
// set, so that an acquire and a removal of the same volume agree.
// *Manager implements it.
type volumeHost interface {
	// usableLocked is errdefs.ErrUnavailable while the Manager is not
	// started or shut down.
	usableLocked() error
}

// volumeUsersLocked calls fn for each lease whose sandbox mounts (or may
// still mount) its workspace volume: live, or ended with its container not
// yet removed; it stops when fn returns false. Called with k.mu held.
func (k *volumeKeeper) volumeUsersLocked(fn func(l *Lease) bool) {
	for _, e := range k.leases {
		if e.l.Volume != "" && !(e.l.State.Ended() && e.l.Cleaned) {
			if !fn(&e.l) {
				return
			}
		}
	}
}

var _ Volumes = (*volumeKeeper)(nil)

// volumeKeeper owns the workspace volumes and host mounts of the leases:
// it validates an acquire's mounts, enforces the volume limit per owner,
// records each volume's last use, lists and removes volumes and reaps
// those unused past the retention.
type volumeKeeper struct {
	cfg        VolumeConfig
	instanceID string
	// removeTimeout bounds a volume's removal (Config.RemoveTimeout).
	removeTimeout time.Duration
	rt            Runtime
	// store keeps the volume records: the Manager's Store when it is a
	// VolumeStore, else mem.
	store VolumeStore
	mem   memVolumes
	log   *slog.Logger
	now   func() time.Time // the lease clock (Manager.now)
	// host, leases and mu are the Manager's (volumeHost, Manager.mu);
	// leases is read with mu held.
	host   volumeHost
	leases map[string]*entry
	mu     sync.Locker

	// policy is cfg.HostMounts with the prefixes resolved once
	// (hostMountPolicy).
	policyOnce sync.Once
	policy     runtime.HostMountPolicy

	// busy are the volumes being removed: an acquire that would mount one
	// waits for the removal's outcome by retrying (Unavailable). Guarded
	// by mu.
	busy map[string]bool
}

// newVolumeKeeper returns the keeper of cfg (with defaults applied) over
// rt and store; host is the Manager, leases and mu its own.
func newVolumeKeeper(cfg VolumeConfig, instanceID string, removeTimeout time.Duration, rt Runtime, store Store,
	log *slog.Logger, now func() time.Time, host volumeHost, leases map[string]*entry, mu sync.Locker) *volumeKeeper {
	k := &volumeKeeper{cfg: cfg, instanceID: instanceID, removeTimeout: removeTimeout, rt: rt, log: log, now: now,
		host: host, leases: leases, mu: mu, busy: map[string]bool{}}
	if vs, ok := store.(VolumeStore); ok {
		k.store = vs
	} else {
		k.store = &k.mem
	}
	return k
}

// validateMounts applies VolumeConfig.PersistWorkspaces and checks
// req.Mounts against VolumeConfig.HostMounts, replacing each host path by
// its resolved form. Called by validate.
func (k *volumeKeeper) validateMounts(req AcquireRequest) (AcquireRequest, error) {
	if k.cfg.PersistWorkspaces {
		req.Persist = true
	}
	if req.Persist {
		if _, ok := k.rt.(runtime.VolumeManager); !ok {
			return req, errdefs.FailedPrecondition("workspace.persist: the %s runtime has no volumes", backendName(k.rt))
		}
	}
	if _, ok := k.rt.(runtime.VolumeManager); !ok && len(req.Mounts) > 0 {
		// A backend without volumes (the in-process one) mounts nothing.
		return req, errdefs.FailedPrecondition("mounts: the %s runtime cannot mount host paths", backendName(k.rt))
	}
	if len(req.Mounts) > runtime.MaxMounts-1 {
		return req, errdefs.InvalidArgument("mounts", "%d mounts, at most %d", len(req.Mounts), runtime.MaxMounts-1)
	}
	out := make([]HostMount, 0, len(req.Mounts))
	var all []runtime.Mount // the host mounts, indexed like req.Mounts
	for i, hm := range req.Mounts {
		f := fmt.Sprintf("mounts[%d]", i)
		if err := runtime.ValidTarget(f+".target", hm.Target); err != nil {
			return req, err
		}
		resolved, pin, err := k.hostMountPolicy().Pin(f+".host_path", hm.HostPath, hm.ReadOnly)
		if err != nil {
			return req, err
		}
		hm.HostPath, hm.pin = resolved, pin
		out = append(out, hm)
		all = append(all, runtime.Mount{Type: runtime.MountBind, Source: resolved, Target: hm.Target, ReadOnly: hm.ReadOnly, Pin: pin})
	}
	if err := runtime.ValidateMounts("mounts", all); err != nil {
		return req, err
	}
	for i, hm := range out {
		if req.Persist && hm.Target == WorkspaceTarget {
			return req, errdefs.InvalidArgument(fmt.Sprintf("mounts[%d].target", i), "%s is the persistent workspace's target", WorkspaceTarget)
		}
	}
	if len(out) == 0 {
		out = nil
	}
	req.Mounts = out
	return req, nil
}

// volumeFor is the workspace volume of a validated request ("" when it
// does not persist).
func (k *volumeKeeper) volumeFor(req AcquireRequest) string {
	if !req.Persist {
		return ""
	}
	return VolumeName(req.Owner, req.ConversationID)
}

// hostMounts converts a validated request's host mounts for the lease.
func (k *volumeKeeper) hostMounts(req AcquireRequest) []runtime.Mount {
	var out []runtime.Mount
	for _, hm := range req.Mounts {
		out = append(out, runtime.Mount{Type: runtime.MountBind, Source: hm.HostPath, Target: hm.Target, ReadOnly: hm.ReadOnly, Pin: hm.pin})
	}
	return out
}

// hostMountPolicy is VolumeConfig.HostMounts with the prefixes' own
// symlinks resolved once (at Start, before any sandbox of this process
// runs): later checks take them literally, so a sandbox that can write to
// a prefix's parent (nested prefixes) cannot move the prefix.
func (k *volumeKeeper) hostMountPolicy() runtime.HostMountPolicy {
	k.policyOnce.Do(func() { k.policy = k.cfg.HostMounts.Resolved() })
	return k.policy
}

// verifyHostMounts checks, right before the runtime binds them again
// (Runtime.Create, or Runtime.Restart of an in-place restart or a resume
// from hibernate: the engine binds the host path string on every start),
// that the host mounts of lease id (its Lease.Mounts) are still what the acquire allowed
// (runtime.HostMountPolicy.Verify): under a prefix allowed now, no symlink
// in any component, the same directory or file. A sandbox that can write
// to the parent of one of its mounts' sources could otherwise replace it
// by a symlink to any host path, which the next start would bind. Errors
// are errdefs.ErrFailedPrecondition and runtime.ErrHostPathChanged naming
// the mount ("mounts[1].host_path"), indexed like the acquire's mounts.
func (k *volumeKeeper) verifyHostMounts(id string, mounts []runtime.Mount) error {
	policy := k.hostMountPolicy()
	for i, hm := range mounts {
		if err := policy.Verify(fmt.Sprintf("mounts[%d].host_path", i), hm); err != nil {
			k.log.Warn("host mount changed since the acquire; not binding it again", "lease_id", id, "host_path", hm.Source, "target", hm.Target, "err", err)
			return err
		}
	}
	return nil
}

// restartSandbox starts lease id's stopped container cid again in place
// (Runtime.Restart) once its host mounts (Lease.Mounts) passed
// verifyHostMounts: every in-place restart and resume from hibernate goes
// through it.
func (k *volumeKeeper) restartSandbox(ctx context.Context, id, cid string, mounts []runtime.Mount) (runtime.Sandbox, error) {
	if err := k.verifyHostMounts(id, mounts); err != nil {
		return runtime.Sandbox{}, err
	}
	return k.rt.Restart(ctx, cid)
}

// specMounts is what the sandbox of l mounts: its workspace volume (with
// the labels it gets when created) and its host paths.
func (k *volumeKeeper) specMounts(l *Lease) []runtime.Mount {
	var out []runtime.Mount
	if l.Volume != "" {
		labels := runtime.VolumeLabels(l.Owner, l.ConversationID)
		labels[runtime.LabelInstance] = k.instanceID
		out = append(out, runtime.Mount{Type: runtime.MountVolume, Source: l.Volume, Target: WorkspaceTarget, VolumeLabels: labels})
	}
	return append(out, slices.Clone(l.Mounts)...)
}

var _ VolumeStore = (*memVolumes)(nil)

// memVolumes is a VolumeStore in memory, for a Store that is not one.
type memVolumes struct {
	mu   sync.Mutex
	recs map[string]VolumeRecord
}

// PutVolume implements VolumeStore.
func (s *memVolumes) PutVolume(r VolumeRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recs == nil {
		s.recs = map[string]VolumeRecord{}
	}
	s.recs[r.Name] = r
	return nil
}

// DeleteVolume implements VolumeStore.
func (s *memVolumes) DeleteVolume(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, name)
	return nil
}

// ForEachVolume implements VolumeStore (fn runs with the records locked).
func (s *memVolumes) ForEachVolume(fn func(VolumeRecord) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.recs {
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// volumeFreeLocked refuses an acquire whose workspace volume is being
// removed. Called with k.mu held.
func (k *volumeKeeper) volumeFreeLocked(req AcquireRequest) error {
	if v := k.volumeFor(req); v != "" && k.busy[v] {
		return errdefs.Unavailable("workspace volume %s of conversation %q is being removed; retry", v, req.ConversationID)
	}
	return nil
}

// listOwnerVolumes sets req.ownerVolumes for a persisting acquire the
// volume limit (VolumeConfig.MaxPerOwner) applies to: the names of the
// owner's volumes the runtime has now. The runtime is asked before k.mu
// is taken; volumeLimitLocked adds the volumes of the leases in memory,
// so that concurrent acquires see each other's new volumes.
func (k *volumeKeeper) listOwnerVolumes(ctx context.Context, req AcquireRequest) (AcquireRequest, error) {
	if k.cfg.MaxPerOwner <= 0 || !req.Persist || req.NoOwnerLimit {
		return req, nil
	}
	vols, err := k.List(ctx, VolumeFilter{Owner: req.Owner})
	if err != nil {
		return req, fmt.Errorf("volume limit: %w", err)
	}
	req.ownerVolumes = map[string]bool{}
	for _, v := range vols {
		if v.Owner == req.Owner {
			req.ownerVolumes[v.Name] = true
		}
	}
	return req, nil
}

// volumeLimitLocked refuses an acquire that would create a workspace
// volume past VolumeConfig.MaxPerOwner: the owner's volumes are those
// the runtime listed (req.ownerVolumes) and those of its leases in memory
// (live, or ended with the container not yet removed: their volumes may
// be being created). Mounting an existing volume is never refused. Called
// with k.mu held.
func (k *volumeKeeper) volumeLimitLocked(req AcquireRequest) error {
	name := k.volumeFor(req)
	if req.ownerVolumes == nil || name == "" || req.ownerVolumes[name] {
		return nil
	}
	have := maps.Clone(req.ownerVolumes)
	k.volumeUsersLocked(func(l *Lease) bool {
		if l.Owner == req.Owner {
			have[l.Volume] = true
		}
		return true
	})
	if have[name] || len(have) < k.cfg.MaxPerOwner {
		return nil
	}
	return errdefs.ResourceExhausted("volume limit: owner %q has %d workspace volumes, at most %d per owner; remove unused ones (DELETE /v1/volumes/NAME) or let the volume retention remove them",
		req.Owner, len(have), k.cfg.MaxPerOwner)
}

// volumeLeaseLocked returns a lease whose sandbox mounts (or may still
// mount) volume name: live, or ended with its container not yet removed.
// Called with k.mu held.
func (k *volumeKeeper) volumeLeaseLocked(name string) *Lease {
	var found *Lease
	k.volumeUsersLocked(func(l *Lease) bool {
		if l.Volume == name {
			found = l
			return false
		}
		return true
	})
	return found
}

// VolumeInfo is a workspace volume as the Manager reports it.
type VolumeInfo struct {
	// Name is the volume's name (VolumeName of owner and conversation).
	Name string
	// Owner and ConversationID are whose workspace it holds.
	Owner          string
	ConversationID string
	// SizeBytes is the size of its files; -1 when not measured (List).
	SizeBytes int64
	// CreatedAt is when the runtime created it.
	CreatedAt time.Time
	// LastUsedAt is when its last lease ended (when that lease's container
	// was removed); the creation time when no lease was recorded; now
	// while a lease uses it.
	LastUsedAt time.Time
	// LeaseID is the lease using it now, "" when none does.
	LeaseID string
}

// InUse reports whether a lease uses the volume.
func (v VolumeInfo) InUse() bool { return v.LeaseID != "" }

// VolumeFilter selects volumes; empty fields match all.
type VolumeFilter struct {
	// Owner and ConversationID, when set, are what a volume's must be.
	Owner          string
	ConversationID string
}

// runtimeVolumes returns the runtime's volume manager, or
// FailedPrecondition.
func (k *volumeKeeper) runtimeVolumes() (runtime.VolumeManager, error) {
	vm, ok := k.rt.(runtime.VolumeManager)
	if !ok {
		return nil, errdefs.FailedPrecondition("the %s runtime has no volumes", backendName(k.rt))
	}
	return vm, nil
}

// List implements Volumes.
func (k *volumeKeeper) List(ctx context.Context, f VolumeFilter) ([]VolumeInfo, error) {
	vm, err := k.runtimeVolumes()
	if err != nil {
		return nil, err
	}
	sel := runtime.Selector{runtime.LabelInstance: k.instanceID}
	if f.Owner != "" {
		sel[runtime.LabelOwner] = f.Owner
	}
	if f.ConversationID != "" {
		sel[runtime.LabelConversation] = f.ConversationID
	}
	vols, err := vm.ListVolumes(ctx, sel)
	if err != nil {
		return nil, wrapf(err, "list volumes")
	}
	recs := k.volumeRecords()
	out := make([]VolumeInfo, 0, len(vols))
	for _, v := range vols {
		out = append(out, k.volumeInfo(v, recs[v.Name]))
	}
	slices.SortFunc(out, func(a, b VolumeInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Inspect implements Volumes.
func (k *volumeKeeper) Inspect(ctx context.Context, name string) (VolumeInfo, error) {
	vm, err := k.runtimeVolumes()
	if err != nil {
		return VolumeInfo{}, err
	}
	v, err := vm.InspectVolume(ctx, name)
	if err != nil {
		return VolumeInfo{}, err
	}
	if v.Labels[runtime.LabelInstance] != k.instanceID {
		return VolumeInfo{}, errdefs.NotFound("volume %s not found", name)
	}
	return k.volumeInfo(v, k.volumeRecords()[name]), nil
}

// volumeInfo merges a runtime volume with its record and the live leases.
func (k *volumeKeeper) volumeInfo(v runtime.Volume, rec VolumeRecord) VolumeInfo {
	info := VolumeInfo{Name: v.Name, Owner: v.Owner, ConversationID: v.ConversationID, SizeBytes: v.SizeBytes,
		CreatedAt: v.CreatedAt, LastUsedAt: rec.LastUsedAt}
	if info.LastUsedAt.IsZero() {
		info.LastUsedAt = v.CreatedAt
	}
	k.mu.Lock()
	if l := k.volumeLeaseLocked(v.Name); l != nil {
		info.LeaseID = l.ID
		info.LastUsedAt = k.now()
	}
	k.mu.Unlock()
	return info
}

// Remove implements Volumes.
func (k *volumeKeeper) Remove(ctx context.Context, name string) error {
	if _, err := k.Inspect(ctx, name); err != nil {
		return err
	}
	return k.removeVolume(ctx, name, nil)
}

// removeVolume removes name unless a lease uses it or keep (called under
// k.mu) says no.
func (k *volumeKeeper) removeVolume(ctx context.Context, name string, keep func() bool) error {
	vm, err := k.runtimeVolumes()
	if err != nil {
		return err
	}
	k.mu.Lock()
	if err := k.host.usableLocked(); err != nil {
		k.mu.Unlock()
		return err
	}
	if l := k.volumeLeaseLocked(name); l != nil {
		k.mu.Unlock()
		return errdefs.FailedPrecondition("volume %s is in use by lease %s (%s); release the lease first", name, l.ID, l.State)
	}
	if k.busy[name] {
		k.mu.Unlock()
		return errdefs.Unavailable("volume %s is being removed", name)
	}
	if keep != nil && keep() {
		k.mu.Unlock()
		return nil
	}
	k.busy[name] = true
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.busy, name)
		k.mu.Unlock()
	}()
	rctx, cancel := detached(ctx, k.removeTimeout)
	defer cancel()
	if err := vm.RemoveVolume(rctx, name); err != nil {
		return wrapf(err, "remove volume %s", name)
	}
	if err := k.deleteVolumeRecord(name); err != nil {
		k.log.Warn("deleting the volume's record failed", "volume", name, "err", err)
	}
	k.log.Info("removed workspace volume", "volume", name)
	return nil
}

// noteVolumeUsed records that l's workspace volume was used now (its
// sandbox became ready, or was removed at the lease's end).
func (k *volumeKeeper) noteVolumeUsed(l Lease) {
	if l.Volume == "" {
		return
	}
	rec := VolumeRecord{Name: l.Volume, Owner: l.Owner, ConversationID: l.ConversationID, LastUsedAt: k.now(), LastLeaseID: l.ID}
	if err := k.putVolumeRecord(rec); err != nil {
		k.log.Warn("recording the volume's last use failed", "volume", l.Volume, "lease_id", l.ID, "err", err)
	}
}

// volumeLoop reaps volumes unused for longer than VolumeConfig.Retention.
func (k *volumeKeeper) volumeLoop(ctx context.Context) {
	if k.cfg.Retention <= 0 {
		return
	}
	if _, ok := k.rt.(runtime.VolumeManager); !ok {
		return
	}
	periodic.Run(ctx, k.cfg.ReapInterval, func(ctx context.Context) { k.reapVolumes(ctx) })
}

// reapVolumes removes the volumes of this instance unused for longer than
// VolumeConfig.Retention, and returns their names.
func (k *volumeKeeper) reapVolumes(ctx context.Context) []string {
	vols, err := k.List(ctx, VolumeFilter{})
	if err != nil {
		if ctx.Err() == nil {
			k.log.Warn("listing volumes for retention failed", "err", err)
		}
		return nil
	}
	var reaped []string
	for _, v := range vols {
		if v.InUse() || k.now().Sub(v.LastUsedAt) <= k.cfg.Retention {
			continue
		}
		// Checked again under k.mu: an acquire may have started since.
		stillFresh := func() bool {
			rec := k.volumeRecords()[v.Name]
			return !rec.LastUsedAt.IsZero() && k.now().Sub(rec.LastUsedAt) <= k.cfg.Retention
		}
		if err := k.removeVolume(ctx, v.Name, stillFresh); err != nil {
			if ctx.Err() == nil && !errdefs.IsFailedPrecondition(err) {
				k.log.Warn("reaping an unused volume failed", "volume", v.Name, "err", err)
			}
			continue
		}
		k.log.Info("reaped unused workspace volume", "volume", v.Name, "conversation_id", v.ConversationID, "last_used_at", v.LastUsedAt, "retention", k.cfg.Retention)
		reaped = append(reaped, v.Name)
	}
	return reaped
}

// volumeRecords returns every volume record by name.
func (k *volumeKeeper) volumeRecords() map[string]VolumeRecord {
	out := map[string]VolumeRecord{}
	if err := k.store.ForEachVolume(func(r VolumeRecord) error {
		out[r.Name] = r
		return nil
	}); err != nil {
		k.log.Warn("reading volume records failed", "err", err)
	}
	return out
}

// putVolumeRecord creates or replaces a volume record.
func (k *volumeKeeper) putVolumeRecord(r VolumeRecord) error { return k.store.PutVolume(r) }

// deleteVolumeRecord removes a volume record.
func (k *volumeKeeper) deleteVolumeRecord(name string) error { return k.store.DeleteVolume(name) }
