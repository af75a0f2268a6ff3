package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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

// HostMount asks for a host path in the sandbox (AcquireRequest.Mounts).
type HostMount struct {
	// HostPath is an absolute host path; its symlinks and ".." are
	// resolved before it is checked against Config.HostMounts.
	HostPath string
	// Target is the absolute path inside the sandbox.
	Target string
	// ReadOnly mounts it read-only; required under a read-only prefix.
	ReadOnly bool
	// pin is the identity of the resolved HostPath when validateMounts
	// checked it (runtime.HostMountPolicy.Pin).
	pin runtime.FileID
}

// validateMounts applies Config.PersistWorkspaces and checks req.Mounts
// against Config.HostMounts, replacing each host path by its resolved
// form. Called by validate.
func (m *Manager) validateMounts(req AcquireRequest) (AcquireRequest, error) {
	if m.cfg.PersistWorkspaces {
		req.Persist = true
	}
	if req.Persist {
		if _, ok := m.rt.(runtime.VolumeManager); !ok {
			return req, errdefs.FailedPrecondition("workspace.persist: the %s runtime has no volumes", backendName(m.rt))
		}
	}
	if _, ok := m.rt.(runtime.VolumeManager); !ok && len(req.Mounts) > 0 {
		// A backend without volumes (the in-process one) mounts nothing.
		return req, errdefs.FailedPrecondition("mounts: the %s runtime cannot mount host paths", backendName(m.rt))
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
		resolved, pin, err := m.hostMountPolicy().Pin(f+".host_path", hm.HostPath, hm.ReadOnly)
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
func (m *Manager) volumeFor(req AcquireRequest) string {
	if !req.Persist {
		return ""
	}
	return VolumeName(req.Owner, req.ConversationID)
}

// hostMounts converts a validated request's host mounts for the lease.
func (m *Manager) hostMounts(req AcquireRequest) []runtime.Mount {
	var out []runtime.Mount
	for _, hm := range req.Mounts {
		out = append(out, runtime.Mount{Type: runtime.MountBind, Source: hm.HostPath, Target: hm.Target, ReadOnly: hm.ReadOnly, Pin: hm.pin})
	}
	return out
}

// hostMountPolicy is Config.HostMounts with the prefixes' own symlinks
// resolved once (at Start, before any sandbox of this process runs): later
// checks take them literally, so a sandbox that can write to a prefix's
// parent (nested prefixes) cannot move the prefix.
func (m *Manager) hostMountPolicy() runtime.HostMountPolicy {
	m.hostPolicyOnce.Do(func() { m.hostPolicy = m.cfg.HostMounts.Resolved() })
	return m.hostPolicy
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
func (m *Manager) verifyHostMounts(id string, mounts []runtime.Mount) error {
	policy := m.hostMountPolicy()
	for i, hm := range mounts {
		if err := policy.Verify(fmt.Sprintf("mounts[%d].host_path", i), hm); err != nil {
			m.log.Warn("host mount changed since the acquire; not binding it again", "lease_id", id, "host_path", hm.Source, "target", hm.Target, "err", err)
			return err
		}
	}
	return nil
}

// restartSandbox starts lease id's stopped container cid again in place
// (Runtime.Restart) once its host mounts (Lease.Mounts) passed
// verifyHostMounts: every in-place restart and resume from hibernate goes
// through it.
func (m *Manager) restartSandbox(ctx context.Context, id, cid string, mounts []runtime.Mount) (runtime.Sandbox, error) {
	if err := m.verifyHostMounts(id, mounts); err != nil {
		return runtime.Sandbox{}, err
	}
	return m.rt.Restart(ctx, cid)
}

// specMounts is what the sandbox of l mounts: its workspace volume (with
// the labels it gets when created) and its host paths.
func (m *Manager) specMounts(l *Lease) []runtime.Mount {
	var out []runtime.Mount
	if l.Volume != "" {
		labels := runtime.VolumeLabels(l.Owner, l.ConversationID)
		labels[runtime.LabelInstance] = m.cfg.InstanceID
		out = append(out, runtime.Mount{Type: runtime.MountVolume, Source: l.Volume, Target: WorkspaceTarget, VolumeLabels: labels})
	}
	return append(out, slices.Clone(l.Mounts)...)
}

// volumeState is the Manager's bookkeeping of workspace volumes. Guarded
// by Manager.mu.
type volumeState struct {
	// busy are the volumes being removed: an acquire that would mount one
	// waits for the removal's outcome by retrying (Unavailable).
	busy map[string]bool
	// mem holds the records when the Store is not a VolumeStore.
	mem memVolumes
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
// removed. Called with m.mu held.
func (m *Manager) volumeFreeLocked(req AcquireRequest) error {
	if v := m.volumeFor(req); v != "" && m.vols.busy[v] {
		return errdefs.Unavailable("workspace volume %s of conversation %q is being removed; retry", v, req.ConversationID)
	}
	return nil
}

// listOwnerVolumes sets req.ownerVolumes for a persisting acquire the
// volume limit (Config.MaxVolumesPerOwner) applies to: the names of the
// owner's volumes the runtime has now. The runtime is asked before m.mu
// is taken; volumeLimitLocked adds the volumes of the leases in memory,
// so that concurrent acquires see each other's new volumes.
func (m *Manager) listOwnerVolumes(ctx context.Context, req AcquireRequest) (AcquireRequest, error) {
	if m.cfg.MaxVolumesPerOwner <= 0 || !req.Persist || req.NoOwnerLimit {
		return req, nil
	}
	vols, err := m.ListVolumes(ctx, VolumeFilter{Owner: req.Owner})
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
// volume past Config.MaxVolumesPerOwner: the owner's volumes are those
// the runtime listed (req.ownerVolumes) and those of its leases in memory
// (live, or ended with the container not yet removed: their volumes may
// be being created). Mounting an existing volume is never refused. Called
// with m.mu held.
func (m *Manager) volumeLimitLocked(req AcquireRequest) error {
	name := m.volumeFor(req)
	if req.ownerVolumes == nil || name == "" || req.ownerVolumes[name] {
		return nil
	}
	have := maps.Clone(req.ownerVolumes)
	for _, e := range m.leases {
		if e.l.Owner == req.Owner && e.l.Volume != "" && !(e.l.State.Ended() && e.l.Cleaned) {
			have[e.l.Volume] = true
		}
	}
	if have[name] || len(have) < m.cfg.MaxVolumesPerOwner {
		return nil
	}
	return errdefs.ResourceExhausted("volume limit: owner %q has %d workspace volumes, at most %d per owner; remove unused ones (DELETE /v1/volumes/NAME) or let the volume retention remove them",
		req.Owner, len(have), m.cfg.MaxVolumesPerOwner)
}

// volumeLeaseLocked returns a lease whose sandbox mounts (or may still
// mount) volume name: live, or ended with its container not yet removed.
// Called with m.mu held.
func (m *Manager) volumeLeaseLocked(name string) *Lease {
	for _, e := range m.leases {
		if e.l.Volume == name && !(e.l.State.Ended() && e.l.Cleaned) {
			return &e.l
		}
	}
	return nil
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

// volumes returns the runtime's volume manager, or FailedPrecondition.
func (m *Manager) volumes() (runtime.VolumeManager, error) {
	vm, ok := m.rt.(runtime.VolumeManager)
	if !ok {
		return nil, errdefs.FailedPrecondition("the %s runtime has no volumes", backendName(m.rt))
	}
	return vm, nil
}

// ListVolumes returns this instance's workspace volumes matching f, by
// name, without sizes (SizeBytes -1).
func (m *Manager) ListVolumes(ctx context.Context, f VolumeFilter) ([]VolumeInfo, error) {
	vm, err := m.volumes()
	if err != nil {
		return nil, err
	}
	sel := runtime.Selector{runtime.LabelInstance: m.cfg.InstanceID}
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
	recs := m.volumeRecords()
	out := make([]VolumeInfo, 0, len(vols))
	for _, v := range vols {
		out = append(out, m.volumeInfo(v, recs[v.Name]))
	}
	slices.SortFunc(out, func(a, b VolumeInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// InspectVolume returns one volume of this instance with its size
// measured; errdefs.ErrNotFound when there is none.
func (m *Manager) InspectVolume(ctx context.Context, name string) (VolumeInfo, error) {
	vm, err := m.volumes()
	if err != nil {
		return VolumeInfo{}, err
	}
	v, err := vm.InspectVolume(ctx, name)
	if err != nil {
		return VolumeInfo{}, err
	}
	if v.Labels[runtime.LabelInstance] != m.cfg.InstanceID {
		return VolumeInfo{}, errdefs.NotFound("volume %s not found", name)
	}
	return m.volumeInfo(v, m.volumeRecords()[name]), nil
}

// volumeInfo merges a runtime volume with its record and the live leases.
func (m *Manager) volumeInfo(v runtime.Volume, rec VolumeRecord) VolumeInfo {
	info := VolumeInfo{Name: v.Name, Owner: v.Owner, ConversationID: v.ConversationID, SizeBytes: v.SizeBytes,
		CreatedAt: v.CreatedAt, LastUsedAt: rec.LastUsedAt}
	if info.LastUsedAt.IsZero() {
		info.LastUsedAt = v.CreatedAt
	}
	m.mu.Lock()
	if l := m.volumeLeaseLocked(v.Name); l != nil {
		info.LeaseID = l.ID
		info.LastUsedAt = m.now()
	}
	m.mu.Unlock()
	return info
}

// RemoveVolume removes a workspace volume of this instance and its record.
// A volume a lease uses (live, or ended with its container not removed
// yet) is errdefs.ErrFailedPrecondition naming the lease; a missing one
// is NotFound. While it runs, an acquire that would mount the volume is
// refused (Unavailable, retry).
func (m *Manager) RemoveVolume(ctx context.Context, name string) error {
	if _, err := m.InspectVolume(ctx, name); err != nil {
		return err
	}
	return m.removeVolume(ctx, name, nil)
}

// removeVolume removes name unless a lease uses it or keep (called under
// m.mu) says no.
func (m *Manager) removeVolume(ctx context.Context, name string, keep func() bool) error {
	vm, err := m.volumes()
	if err != nil {
		return err
	}
	m.mu.Lock()
	if err := m.usableLocked(); err != nil {
		m.mu.Unlock()
		return err
	}
	if l := m.volumeLeaseLocked(name); l != nil {
		m.mu.Unlock()
		return errdefs.FailedPrecondition("volume %s is in use by lease %s (%s); release the lease first", name, l.ID, l.State)
	}
	if m.vols.busy[name] {
		m.mu.Unlock()
		return errdefs.Unavailable("volume %s is being removed", name)
	}
	if keep != nil && keep() {
		m.mu.Unlock()
		return nil
	}
	if m.vols.busy == nil {
		m.vols.busy = map[string]bool{}
	}
	m.vols.busy[name] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.vols.busy, name)
		m.mu.Unlock()
	}()
	rctx, cancel := detached(ctx, m.cfg.RemoveTimeout)
	defer cancel()
	if err := vm.RemoveVolume(rctx, name); err != nil {
		return wrapf(err, "remove volume %s", name)
	}
	if err := m.deleteVolumeRecord(name); err != nil {
		m.log.Warn("deleting the volume's record failed", "volume", name, "err", err)
	}
	m.log.Info("removed workspace volume", "volume", name)
	return nil
}

// noteVolumeUsed records that l's workspace volume was used now (its
// sandbox became ready, or was removed at the lease's end).
func (m *Manager) noteVolumeUsed(l Lease) {
	if l.Volume == "" {
		return
	}
	rec := VolumeRecord{Name: l.Volume, Owner: l.Owner, ConversationID: l.ConversationID, LastUsedAt: m.now(), LastLeaseID: l.ID}
	if err := m.putVolumeRecord(rec); err != nil {
		m.log.Warn("recording the volume's last use failed", "volume", l.Volume, "lease_id", l.ID, "err", err)
	}
}

// volumeLoop reaps volumes unused for longer than Config.VolumeRetention.
func (m *Manager) volumeLoop(ctx context.Context) {
	if m.cfg.VolumeRetention <= 0 {
		return
	}
	if _, ok := m.rt.(runtime.VolumeManager); !ok {
		return
	}
	periodic.Run(ctx, m.cfg.VolumeReapInterval, func(ctx context.Context) { m.reapVolumes(ctx) })
}

// reapVolumes removes the volumes of this instance unused for longer than
// Config.VolumeRetention, and returns their names.
func (m *Manager) reapVolumes(ctx context.Context) []string {
	vols, err := m.ListVolumes(ctx, VolumeFilter{})
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("listing volumes for retention failed", "err", err)
		}
		return nil
	}
	var reaped []string
	for _, v := range vols {
		if v.InUse() || m.now().Sub(v.LastUsedAt) <= m.cfg.VolumeRetention {
			continue
		}
		// Checked again under m.mu: an acquire may have started since.
		stillFresh := func() bool {
			rec := m.volumeRecords()[v.Name]
			return !rec.LastUsedAt.IsZero() && m.now().Sub(rec.LastUsedAt) <= m.cfg.VolumeRetention
		}
		if err := m.removeVolume(ctx, v.Name, stillFresh); err != nil {
			if ctx.Err() == nil && !errdefs.IsFailedPrecondition(err) {
				m.log.Warn("reaping an unused volume failed", "volume", v.Name, "err", err)
			}
			continue
		}
		m.log.Info("reaped unused workspace volume", "volume", v.Name, "conversation_id", v.ConversationID, "last_used_at", v.LastUsedAt, "retention", m.cfg.VolumeRetention)
		reaped = append(reaped, v.Name)
	}
	return reaped
}

// volumeStore is where the volume records are kept: the Store when it is
// a VolumeStore, else memory.
func (m *Manager) volumeStore() VolumeStore {
	if vs, ok := m.store.(VolumeStore); ok {
		return vs
	}
	return &m.vols.mem
}

// volumeRecords returns every volume record by name.
func (m *Manager) volumeRecords() map[string]VolumeRecord {
	out := map[string]VolumeRecord{}
	if err := m.volumeStore().ForEachVolume(func(r VolumeRecord) error {
		out[r.Name] = r
		return nil
	}); err != nil {
		m.log.Warn("reading volume records failed", "err", err)
	}
	return out
}

func (m *Manager) putVolumeRecord(r VolumeRecord) error { return m.volumeStore().PutVolume(r) }

func (m *Manager) deleteVolumeRecord(name string) error { return m.volumeStore().DeleteVolume(name) }
