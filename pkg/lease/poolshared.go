package lease

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Warm pools shared by the replicas of a fleet (Config.Store is a
// SharedStore; docs/pools.md "Several replicas, one fleet").
//
// Every replica sees the pools' members in the runtime (List: on
// Kubernetes the Pod informer, no API call) once the elected replica that
// created them marked them ready (runtime.LabelPoolReady: their agent
// answered), and may hand out any of them;
// membership is still not persisted: the sandboxes are the record. A
// claim is a compare-and-swap on the member in the runtime
// (MemberClaimer.ClaimMember: on Kubernetes a patch of the Pod with its
// resourceVersion as precondition) that marks it claimed
// (runtime.LabelPoolClaim) and makes it the claiming replica's
// (runtime.LabelInstance): of two replicas claiming one member, one wins
// and the other takes the next member. The winner then locks the
// conversation with the member's pre-allocated lease id, so the lock names
// the lease the claim becomes; when another lease holds the conversation
// the claimed member is removed (it is never handed out again). The
// lease's env and secrets reach the agent by Configure, as on one replica.
//
// Refill, shrink and the removal of dead members run on the elected
// replica only (FleetConfig.Elect); the others keep their view of the
// members but create and remove none. A member claimed but without a
// lease record after PoolsConfig.ClaimGrace (its claimer died between the claim
// and the record: kill -9) is removed by the elected replica, never handed
// out again; a replica that restarts removes at once the members it had
// claimed without a record.

// MemberClaimer is optional for a Runtime, and required for warm pools
// with a SharedStore: ClaimMember claims pool member sandboxID for the
// orchestrator instance claimant atomically (of concurrent claims of one
// member exactly one succeeds; a member claimed already is refused with
// errdefs.ErrConflict), setting runtime.LabelPoolClaim and moving
// runtime.LabelInstance to claimant. MarkMemberReady marks a member the
// replica created ready to be handed out (runtime.LabelPoolReady) once its
// agent answered, with the same compare-and-swap. kubernetes.Runtime
// implements it.
type MemberClaimer interface {
	ClaimMember(ctx context.Context, sandboxID, claimant string) error
	MarkMemberReady(ctx context.Context, sandboxID string) error
}

// poolClaimGraceDefault is PoolsConfig.ClaimGrace's default. A claim's
// record is written within the agent's Configure, milliseconds after the
// claim.
const poolClaimGraceDefault = 30 * time.Second

// sharedClaimAttempts bounds the members one acquire tries to claim
// before it counts a miss (each lost one was claimed by another replica).
const sharedClaimAttempts = 8

// sharedLocked reports whether the pools are a fleet's (a SharedStore).
// Called with or without mu: fleet is set once by New.
func (ps *poolSet) sharedLocked() bool { return ps.fleet != nil && ps.fleet.shared != nil }

// leading reports whether this replica fills, shrinks and cleans the
// pools: always on one replica, the elected one in a fleet.
func (ps *poolSet) leading() bool { return !ps.sharedLocked() || ps.fleet.leading.Load() }

// claimShared claims a member of the pool req matches, for the acquire of
// a fleet replica: it takes the oldest member in this replica's view and
// claims it in the runtime (MemberClaimer); one another replica claimed
// first is skipped. It returns nil (a miss, counted, when a pool matched)
// when no member could be claimed. A claim returned is the caller's:
// fleet.acquireShared gives it to startCreateID or to releaseClaim.
func (ps *poolSet) claimShared(ctx context.Context, req AcquireRequest) *claim {
	if !ps.sharedLocked() || ps.claimer == nil {
		return nil
	}
	locked := false
	for range sharedClaimAttempts {
		ps.mu.Lock()
		locked = true
		p := ps.forLocked(req)
		if p == nil || req.App != nil || req.WorkDir != "" { // as startCreateID: pooled sandboxes run no app and keep the image's directory
			ps.mu.Unlock()
			return nil
		}
		if len(p.idle) == 0 || *ps.closed {
			break
		}
		mb := p.idle[0]
		p.idle = slices.Delete(p.idle, 0, 1)
		delete(ps.byID, mb.id)
		ps.held[mb.id] = true // syncShared leaves it out of the view while we claim it
		ps.mu.Unlock()
		err := ps.claimer.ClaimMember(ctx, mb.containerID, ps.instanceID)
		ps.mu.Lock()
		if err == nil {
			p.hits++
			ps.claiming++ // until answered
			ps.mu.Unlock()
			return &claim{pool: p.cfg.Name, m: mb}
		}
		delete(ps.held, mb.id)
		ps.mu.Unlock()
		locked = false
		if errors.Is(err, errdefs.ErrConflict) {
			ps.log.Debug("pool: member claimed by another replica; taking the next", "pool", p.cfg.Name, "lease_id", mb.id)
		} else {
			ps.log.Warn("pool: claiming a member failed; taking the next", "pool", p.cfg.Name, "lease_id", mb.id, "err", err)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	// A miss: a pool matched.
	if !locked {
		ps.mu.Lock()
	}
	defer ps.kick()
	p := ps.forLocked(req)
	p.misses++
	p.lastMiss = time.Now()
	if p.cfg.Min+p.boost < p.cfg.Max {
		p.boost++
	}
	ps.mu.Unlock()
	return nil
}

// releaseClaim gives up claim c (nil: nothing), which no lease will take
// (the conversation was another lease's, or the acquire failed before
// its record): the member is claimed and can never be handed out again,
// so it is removed, in the background.
func (ps *poolSet) releaseClaim(c *claim) {
	if c == nil {
		return
	}
	ps.answered()
	ps.host.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*ps.readyTimeout)
		defer cancel()
		if err := ps.dropMember(ctx, c.m); err != nil {
			ps.log.Warn("pool: removing a claimed member no lease took failed; the elected replica removes it", "lease_id", c.m.id, "err", err)
		}
		ps.mu.Lock()
		delete(ps.held, c.m.id)
		ps.mu.Unlock()
	})
}

// syncShared makes this replica's view of the members the runtime's: the
// running, unclaimed sandboxes of each pool's current profile marked
// ready, with no lease record, oldest first (members this replica created
// after the list was taken are kept). On the elected replica it also
// removes the members that exited, those claimed without a lease record
// for longer than PoolsConfig.ClaimGrace, and those never marked ready
// within the ready timeout and that grace (their creator died while
// creating them). Called by the pool loop without mu.
func (ps *poolSet) syncShared(ctx context.Context) {
	ps.mu.Lock()
	seq := *ps.seq
	ps.mu.Unlock()
	listed := make([][]runtime.Sandbox, len(ps.pools))
	for i, p := range ps.pools { // pools and their cfg and digest never change after New
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		boxes, err := ps.rt.List(lctx, runtime.Selector{runtime.LabelPool: p.cfg.Name, runtime.LabelPoolProfile: p.digest})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				ps.log.Warn("pool: listing the members failed; the next pass looks again", "pool", p.cfg.Name, "err", err)
			}
			return
		}
		slices.SortFunc(boxes, func(a, b runtime.Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
		listed[i] = boxes
	}
	leading := ps.leading()
	now := time.Now()
	var stale, dead []runtime.Sandbox
	var unready []member
	var forget []string // endpoints of members that left the view
	seen := map[string]bool{}
	ps.mu.Lock()
	for i, p := range ps.pools {
		old := map[string]member{}
		for _, mb := range p.idle {
			old[mb.id] = mb
		}
		var idle []member
		for _, sb := range listed[i] {
			id := sb.LeaseID
			seen[id] = true
			switch {
			case id == "" || ps.leasedLocked(id) || ps.held[id]:
				// A lease's, or being claimed here.
			case sb.Labels[runtime.LabelPoolClaim] != "":
				// Claimed, its record not (yet) here: its claimer died,
				// or the record is on its way.
				first, ok := ps.claimedSeen[id]
				if !ok {
					ps.claimedSeen[id] = now
				} else if leading && now.Sub(first) > ps.cfg.ClaimGrace {
					stale = append(stale, sb)
				}
			case ps.byID[id] == p && !inView(old, id):
				// Being created here: createPooled adds it once ready.
			case sb.Labels[runtime.LabelPoolReady] != "true" && !inView(old, id) && sb.State != runtime.StateExited:
				// Not marked ready: being created by another replica, or
				// its creator died before it marked it. Past the ready
				// timeout and the claim grace it is the latter.
				first, ok := ps.claimedSeen[id]
				if !ok {
					ps.claimedSeen[id] = now
				} else if leading && now.Sub(first) > ps.readyTimeout+ps.cfg.ClaimGrace {
					unready = append(unready, member{id: id, containerID: sb.ID, endpoint: sb.Endpoint, stateDir: sb.StateDir})
				}
			case sb.State == runtime.StateRunning && (sb.Labels[runtime.LabelPoolReady] == "true" || inView(old, id)):
				mb, ok := old[id]
				if !ok {
					mb = member{id: id, containerID: sb.ID, endpoint: sb.Endpoint, stateDir: sb.StateDir, diskEnforcement: sb.DiskEnforcement}
				}
				delete(old, id)
				idle = append(idle, mb)
			case sb.State == runtime.StateExited && leading:
				dead = append(dead, sb)
			}
		}
		// Members that joined after the list was taken (createPooled here).
		for _, mb := range p.idle {
			if _, ok := old[mb.id]; ok && mb.seq > seq {
				idle = append(idle, mb)
				delete(old, mb.id)
			}
		}
		for id, mb := range old { // gone, claimed elsewhere, or a lease's
			delete(ps.byID, id)
			forget = append(forget, mb.endpoint)
		}
		for _, mb := range idle {
			ps.byID[mb.id] = p
		}
		p.idle = idle
	}
	for id := range ps.claimedSeen {
		if !seen[id] || ps.leasedLocked(id) {
			delete(ps.claimedSeen, id)
		}
	}
	for id := range ps.held {
		if ps.leasedLocked(id) {
			delete(ps.held, id)
		}
	}
	ps.mu.Unlock()
	if pr, ok := ps.cfg.AgentConfigurer.(AgentPreparer); ok {
		for _, ep := range forget {
			pr.Forget(ep) // what this replica prepared for a member another one took
		}
	}
	for _, sb := range dead {
		ps.log.Info("pool: removing a member that exited", "pool", sb.Labels[runtime.LabelPool], "lease_id", sb.LeaseID, "container_id", sb.ID)
		_ = ps.removeContainers(ctx, sb.LeaseID, sb.ID)
	}
	for _, sb := range stale {
		ps.removeStaleClaim(ctx, sb)
	}
	for _, mb := range unready {
		ps.log.Warn("pool: removing a member never marked ready (its creator died while creating it)", "lease_id", mb.id, "container_id", mb.containerID)
		if err := ps.trimShared(ctx, mb); err != nil {
			ps.log.Warn("pool: removing an unready member failed; looking again later", "lease_id", mb.id, "err", err)
		}
	}
}

// inView reports whether member id is in view (a pool's idle members by id).
func inView(view map[string]member, id string) bool {
	_, ok := view[id]
	return ok
}

// removeStaleClaim removes member sb, claimed for longer than
// PoolsConfig.ClaimGrace without a lease record in memory, once the shared store
// confirms it has none: its claimer died between the claim and the record.
func (ps *poolSet) removeStaleClaim(ctx context.Context, sb runtime.Sandbox) {
	_, err := ps.fleet.shared.Get(sb.LeaseID)
	switch {
	case err == nil:
		return // recorded: the feed brings it
	case !errors.Is(err, errdefs.ErrNotFound):
		ps.log.Warn("pool: reading the record of a claimed member failed; looking again later", "lease_id", sb.LeaseID, "err", err)
		return
	}
	ps.log.Warn("pool: removing a member claimed without a lease (its claimer died mid-claim)", "pool", sb.Labels[runtime.LabelPool],
		"lease_id", sb.LeaseID, "container_id", sb.ID, "claimed_by", sb.Labels[runtime.LabelPoolClaim])
	if err := ps.removeContainers(ctx, sb.LeaseID, sb.ID); err != nil {
		ps.log.Warn("pool: removing a stale claimed member failed; looking again later", "lease_id", sb.LeaseID, "err", err)
		return
	}
	ps.mu.Lock()
	delete(ps.claimedSeen, sb.LeaseID)
	ps.mu.Unlock()
}

// trimShared removes surplus member mb on the elected replica of a fleet:
// it claims it first (for this replica), so that a member another replica
// claimed meanwhile is left to that replica's lease.
func (ps *poolSet) trimShared(ctx context.Context, mb member) error {
	if err := ps.claimer.ClaimMember(ctx, mb.containerID, ps.instanceID); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return nil // claimed by a lease meanwhile
		}
		return err
	}
	return ps.dropMember(ctx, mb)
}

// adoptSharedLocked is adoptLocked for a fleet: the pool members among
// this replica's sandboxes at start (boxes) are left to the pools' view
// (syncShared: any replica may hand them out), except those this replica
// had claimed without recording a lease (it died mid-claim: removed now)
// and those of a pool no longer configured with their profile (removed).
// It returns the ids kept. Called with mu held.
func (ps *poolSet) adoptSharedLocked(boxes []runtime.Sandbox) map[string]bool {
	kept := map[string]bool{}
	for _, sb := range boxes {
		name := sb.Labels[runtime.LabelPool]
		if name == "" || ps.leasedLocked(sb.LeaseID) {
			continue
		}
		if c := sb.Labels[runtime.LabelPoolClaim]; c == ps.instanceID {
			ps.log.Info("reconcile: removing a pool member this replica claimed without recording its lease", "pool", name, "lease_id", sb.LeaseID)
			continue
		}
		if i := slices.IndexFunc(ps.pools, func(p *pool) bool { return p.cfg.Name == name }); i < 0 || ps.pools[i].digest != sb.Labels[runtime.LabelPoolProfile] {
			ps.log.Info("reconcile: pooled sandbox of a pool or profile no longer configured; removing it", "pool", name, "container_id", sb.ID)
			continue
		}
		kept[sb.ID] = true
	}
	return kept
}
