package lease

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Page sizes of List.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Filter selects leases for List. Empty fields match everything.
type Filter struct {
	// States keeps leases in any of these states. Empty means live states
	// (PENDING, READY, RELEASING), or every state when IncludeEnded is set.
	States []State
	// Owner keeps one owner's leases. Empty matches every owner: edges must
	// set it for clients, who see only their own leases.
	Owner string
	// ConversationID keeps one conversation's leases.
	ConversationID string
	// Labels keeps leases carrying every one of these labels (see ParseSelector).
	Labels map[string]string
	// IncludeEnded adds ended leases when States is empty.
	IncludeEnded bool
	// PageSize defaults to DefaultPageSize; larger than MaxPageSize is
	// capped; negative is invalid.
	PageSize int
	// PageToken continues a previous List with the same filter (its
	// nextPageToken). Opaque.
	PageToken string
}

func (f *Filter) match(l *Lease) bool {
	switch {
	case len(f.States) > 0 && !slices.Contains(f.States, l.State):
		return false
	case len(f.States) == 0 && !f.IncludeEnded && !l.State.Live():
		return false
	case f.Owner != "" && l.Owner != f.Owner:
		return false
	case f.ConversationID != "" && l.ConversationID != f.ConversationID:
		return false
	}
	return labelsMatch(l.Labels, f.Labels)
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// newerFirst orders leases newest first; the id breaks ties, so the order
// is total and pagination stable.
func newerFirst(a, b *Lease) int {
	if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
		return c
	}
	return cmp.Compare(b.ID, a.ID)
}

// A page token is the position of the last lease returned.
func encodePageToken(l *Lease) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(l.CreatedAt.UnixNano(), 10) + "." + l.ID))
}

func decodePageToken(tok string) (Lease, error) {
	bad := errdefs.InvalidArgument("page_token", "not a token this server issued")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return Lease{}, bad
	}
	ns, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || !ValidID(id) {
		return Lease{}, bad
	}
	return Lease{ID: id, CreatedAt: time.Unix(0, n)}, nil
}

// List returns the leases matching f, newest first, one page at a time,
// with the token of the next page ("" after the last page). Pagination is
// stable: leases created after the first page do not shift later pages.
func (m *Manager) List(ctx context.Context, f Filter) ([]Lease, string, error) {
	for _, s := range f.States {
		if !s.Valid() {
			return nil, "", errdefs.InvalidArgument("state", "unknown lease state %q", string(s))
		}
	}
	switch {
	case f.PageSize < 0:
		return nil, "", errdefs.InvalidArgument("page_size", "must not be negative")
	case f.PageSize == 0:
		f.PageSize = DefaultPageSize
	case f.PageSize > MaxPageSize:
		f.PageSize = MaxPageSize
	}
	var after *Lease
	if f.PageToken != "" {
		c, err := decodePageToken(f.PageToken)
		if err != nil {
			return nil, "", err
		}
		after = &c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var hits []*Lease
	for _, e := range m.leases {
		if f.match(&e.l) && (after == nil || newerFirst(after, &e.l) < 0) {
			hits = append(hits, &e.l)
		}
	}
	slices.SortFunc(hits, newerFirst)
	next := ""
	if len(hits) > f.PageSize {
		hits = hits[:f.PageSize]
		next = encodePageToken(hits[len(hits)-1])
	}
	out := make([]Lease, len(hits))
	for i, l := range hits {
		out[i] = l.Clone()
	}
	return out, next, nil
}

// expiryReason says why l (READY) has expired at now, or "" if it has not.
func expiryReason(l *Lease, now time.Time) string {
	if !now.Before(l.ExpiresAt) {
		return fmt.Sprintf("ttl of %s passed", l.TTL)
	}
	if reason := idleReason(l, now); reason != "" && !pausesWhenIdle(l) {
		return reason
	}
	return ""
}

// idleReason says how long l (READY) has been idle past its idle timeout
// at now, or "" if it has not.
func idleReason(l *Lease, now time.Time) string {
	if l.IdleTimeout > 0 && now.Sub(l.LastActivityAt) >= l.IdleTimeout {
		return fmt.Sprintf("idle for %s", l.IdleTimeout)
	}
	return ""
}

// pausesWhenIdle reports whether l's idle timeout pauses it rather than
// expiring it.
func pausesWhenIdle(l *Lease) bool {
	return l.IdlePolicy == IdleFreeze || l.IdlePolicy == IdleHibernate
}

// expireIfDueLocked expires READY lease e if it is past its TTL or idle
// timeout at now (as the reaper would on its next pass) and returns the
// precondition error to answer; mu is then released. Otherwise it returns
// nil with mu still held.
func (m *Manager) expireIfDueLocked(e *entry, now time.Time) error {
	if e.l.State != StateReady {
		return nil
	}
	reason := expiryReason(&e.l, now)
	if reason == "" {
		return nil
	}
	_ = m.transitionLocked(e, StateExpired, reason)
	m.queue.addRemovalLocked(e)
	l, rev := e.snapshot()
	m.mu.Unlock()
	_ = m.persist(l, rev)
	return errNotUsable(&l)
}

// Renew extends a live lease: ExpiresAt becomes now + ttl, and ttl becomes
// the lease's TTL; ttl 0 reuses the lease's TTL. Only READY, PENDING and
// PAUSED leases can be renewed (a PAUSED lease stays paused: renewing is
// no activity, and its paused retention still counts from PausedAt, so a
// client that keeps renewing does not lose it to a pause); others (or a READY lease already past its expiry,
// which Renew expires) fail with errdefs.ErrFailedPrecondition ("lease X is
// EXPIRED: ..."). A negative ttl or one above Config.MaxTTL is
// errdefs.ErrInvalidArgument; an unknown id errdefs.ErrNotFound. Renew is
// not activity: it does not postpone the idle timeout.
func (m *Manager) Renew(ctx context.Context, id string, ttl time.Duration) (Lease, error) {
	switch {
	case ttl < 0:
		return Lease{}, errdefs.InvalidArgument("ttl", "%s is negative", ttl)
	case ttl > m.cfg.MaxTTL:
		return Lease{}, errdefs.InvalidArgument("ttl", "%s exceeds the maximum of %s", ttl, m.cfg.MaxTTL)
	}
	m.mu.Lock()
	if err := m.enterLocked(); err != nil {
		m.mu.Unlock()
		return Lease{}, err
	}
	defer m.wg.Done()
	e := m.leases[id]
	if e == nil {
		m.mu.Unlock()
		return Lease{}, errdefs.NotFound("lease %s", id)
	}
	now := m.now()
	if err := m.expireIfDueLocked(e, now); err != nil {
		return Lease{}, err
	}
	if e.l.State != StateReady && e.l.State != StatePending && e.l.State != StatePaused {
		err := errNotUsable(&e.l)
		m.mu.Unlock()
		return Lease{}, err
	}
	if ttl == 0 {
		ttl = e.l.TTL
	}
	e.l.TTL = ttl
	e.l.ExpiresAt = now.Add(ttl)
	e.l.UpdatedAt = now
	e.rev++
	m.hub.emitLocked(e, nil)
	l, rev := e.snapshot()
	m.mu.Unlock()
	if err := m.persist(l, rev); err != nil {
		return l, wrapf(err, "renew lease %s", id)
	}
	return l, nil
}

// Release ends a lease: READY, PAUSED or PENDING → RELEASING, its container is
// removed, → RELEASED (reason defaults to "released"). It waits, bounded by
// ctx, until the lease has ended; the reason is cleaned with SanitizeText
// (control characters dropped, at most MaxReasonLen bytes); a lease released while its sandbox is
// being created ends once the creation finishes. Releasing an ended lease
// succeeds and returns it unchanged; an unknown id is errdefs.ErrNotFound.
// If the removal fails the lease stays RELEASING, the error is returned,
// and the reaper keeps retrying the removal.
func (m *Manager) Release(ctx context.Context, id, reason string) (Lease, error) {
	reason = SanitizeText(reason, MaxReasonLen)
	if reason == "" {
		reason = "released"
	}
	m.mu.Lock()
	if err := m.enterLocked(); err != nil {
		m.mu.Unlock()
		return Lease{}, err
	}
	defer m.wg.Done()
	runCtx := m.runCtx
	e := m.leases[id]
	if e == nil {
		m.mu.Unlock()
		return Lease{}, errdefs.NotFound("lease %s", id)
	}
	if e.l.State.Ended() {
		l := e.l.Clone()
		m.mu.Unlock()
		return l, nil
	}
	if e.l.State == StateReady || e.l.State == StatePending || e.l.State == StatePaused {
		_ = m.transitionLocked(e, StateReleasing, reason)
	}
	l, rev := e.snapshot()
	m.mu.Unlock()
	// current is the lease as it is now.
	current := func() Lease {
		m.mu.Lock()
		defer m.mu.Unlock()
		return e.l.Clone()
	}
	_ = m.persist(l, rev) // a lost write is repaired by reconcile: RELEASING or not, the container goes
	if err := m.ctrl.cleanup(ctx, id); err != nil {
		return current(), err
	}
	wait := time.NewTimer(m.cfg.ReadyTimeout + m.cfg.RemoveTimeout + 5*time.Second)
	defer wait.Stop()
	select {
	case <-e.ended:
	case <-wait.C:
	case <-runCtx.Done(): // shutting down
	case <-ctx.Done():
		return current(), ctx.Err()
	}
	return current(), nil
}

// ReapFilter selects the live leases Reap releases. Set fields combine with
// AND; IDs matches any of the ids.
type ReapFilter struct {
	IDs            []string
	Owner          string
	ConversationID string
	Labels         map[string]string
	// All must be set to reap every live lease when no other field is set.
	All bool
	// Reason is recorded on the transitions; default "reaped by operator".
	Reason string
}

func (f *ReapFilter) empty() bool {
	return len(f.IDs) == 0 && f.Owner == "" && f.ConversationID == "" && len(f.Labels) == 0
}

// Reap releases every live lease matching f (an operator call) and returns
// their ids, sorted. READY and PENDING leases go to RELEASING; containers are
// removed with at most Config.ReapConcurrency removals at once, and Reap
// waits for them (bounded by ctx); a PENDING lease ends when its creation
// finishes, without Reap waiting. Leases already RELEASING are included. A
// removal that fails leaves its lease RELEASING for the reaper to retry; it
// is logged, not returned. An empty filter without All is
// errdefs.ErrInvalidArgument.
func (m *Manager) Reap(ctx context.Context, f ReapFilter) ([]string, error) {
	if f.empty() && !f.All {
		return nil, errdefs.InvalidArgument("all", "an empty selector reaps every lease; set all to mean it")
	}
	if f.Reason = SanitizeText(f.Reason, MaxReasonLen); f.Reason == "" {
		f.Reason = "reaped by operator"
	}
	m.mu.Lock()
	if err := m.enterLocked(); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	defer m.wg.Done()
	var ids []string
	var snaps []snap
	for _, e := range m.leases {
		l := &e.l
		if !l.State.Live() ||
			(len(f.IDs) > 0 && !slices.Contains(f.IDs, l.ID)) ||
			(f.Owner != "" && l.Owner != f.Owner) ||
			(f.ConversationID != "" && l.ConversationID != f.ConversationID) ||
			!labelsMatch(l.Labels, f.Labels) {
			continue
		}
		if l.State != StateReleasing {
			_ = m.transitionLocked(e, StateReleasing, f.Reason)
			s, rev := e.snapshot()
			snaps = append(snaps, snap{s, rev})
		}
		ids = append(ids, l.ID)
	}
	m.mu.Unlock()
	m.persistAll(snaps)
	slices.Sort(ids)

	sem := make(chan struct{}, m.cfg.ReapConcurrency)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			_ = m.ctrl.cleanup(ctx, id)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return ids, err
	}
	m.log.Info("reaped leases", "count", len(ids), "reason", f.Reason)
	return ids, nil
}

// needsClean reports whether e has a container to remove now.
func (e *entry) needsClean() bool {
	return e.l.State == StateReleasing || (e.l.State.Ended() && !e.l.Cleaned)
}

// cleanup removes the container of a RELEASING or ended-but-uncleaned lease,
// then marks it Cleaned (and RELEASING → RELEASED); it holds the lease
// (opClean) meanwhile. Concurrent calls for one lease share one removal. A
// lease another operation holds (its creation, a restart, a pause) is left
// to that operation's end, which queues the removal (work.go). ctx bounds
// only the waiting; the removal itself runs detached with RemoveTimeout.
func (c *controller) cleanup(ctx context.Context, id string) error {
	c.mu.Lock()
	e := c.leases[id]
	if e == nil || !e.needsClean() || c.disk.keptLocked(e, c.host.now()) {
		c.mu.Unlock()
		return nil
	}
	if o := e.op; o != nil {
		if o.kind != opClean {
			e.dirty = true // its end queues the removal
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
		if err := o.wait(ctx); err != nil {
			return err
		}
		return o.err
	}
	o := beginOpLocked(e, opClean)
	cid, home := e.l.ContainerID, e.l.Instance
	vol := Lease{ID: id, Volume: e.l.Volume, Owner: e.l.Owner, ConversationID: e.l.ConversationID}
	c.mu.Unlock()

	err := c.removeHomeContainers(ctx, id, home, cid)
	if err == nil {
		c.network.drop(ctx, id) // network.go: the sandbox is gone
		// The lease's end is its volume's last use, recorded before the
		// lease shows as cleaned (volumes.go).
		c.vols.noteVolumeUsed(vol)
	}

	c.mu.Lock()
	if err != nil {
		e.fails++
		e.retryAt = time.Now().Add(backoff(e.fails))
		attempts := e.fails
		c.host.endOpLocked(e, o, err) // the reaper retries once retryAt passed
		c.mu.Unlock()
		o.finish()
		c.log.Warn("removing sandbox failed; will retry", "lease_id", id, "container_id", cid, "attempts", attempts, "err", err)
		return err
	}
	e.fails = 0
	if e.l.State == StateReleasing {
		_ = c.host.transitionLocked(e, StateReleased, e.l.Reason)
	}
	e.l.Cleaned = true
	e.rev++
	c.host.endOpLocked(e, o, nil)
	l, rev := e.snapshot()
	c.mu.Unlock()
	_ = c.host.persist(l, rev)
	o.finish()
	return nil
}

// removeContainers removes the container of a lease this replica created,
// or, when its id is not known, every container labelled with the lease
// and this replica's instance.
func (c *controller) removeContainers(ctx context.Context, leaseID, cid string) error {
	return c.removeHomeContainers(ctx, leaseID, c.cfg.InstanceID, cid)
}

// removeHomeContainers removes the lease's container, or, when its id is
// not known, every container labelled with the lease and the instance
// home, the replica that created it (Lease.Instance; this one's when
// empty). Another replica's record may not name the container yet (a
// PENDING record), and its containers carry its instance label, not this
// one's.
func (c *controller) removeHomeContainers(ctx context.Context, leaseID, home, cid string) error {
	if home == "" {
		home = c.cfg.InstanceID
	}
	rctx, cancel := detached(ctx, c.cfg.RemoveTimeout)
	defer cancel()
	if cid != "" {
		if err := c.rt.Remove(rctx, cid); err != nil {
			return wrapf(err, "remove container %s of lease %s", cid, leaseID)
		}
		return nil
	}
	boxes, err := c.rt.List(rctx, runtime.Selector{runtime.LabelInstance: home, runtime.LabelLease: leaseID})
	if err != nil {
		return wrapf(err, "list containers of lease %s", leaseID)
	}
	for _, sb := range boxes {
		if err := c.rt.Remove(rctx, sb.ID); err != nil {
			return wrapf(err, "remove container %s of lease %s", sb.ID, leaseID)
		}
	}
	return nil
}

// backoff is the wait before removal attempt n+1: 200ms doubling to 30s.
func backoff(n int) time.Duration {
	d := 200 * time.Millisecond
	for i := 1; i < n && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}
