package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Warm pools (see docs/pools.md).
//
// A pool keeps sandboxes of one profile (image, user, resources) created,
// started and agent-ready before any lease wants them. A pooled sandbox is
// created under a lease id allocated up front (its container carries that
// id in runtime.LabelLease, its agent the agent token of that id, and the
// pool's name in runtime.LabelPool) but has no lease record. An acquire
// whose profile matches claims one: the new lease takes the pre-allocated
// id, so the container's labels name the lease from then on and every
// path that maps a container to its lease by label (reconcile, resync,
// events, removal by label) treats it as the lease's, although labels can
// never be changed after create. The lease's own token is derived from
// that id like any other: the caller never sees the agent token.
//
// Membership is not persisted: the containers are the record. A container
// with runtime.LabelPool and no lease record of its id is an unclaimed
// member; one with a lease record is that lease's. Reconcile adopts the
// unclaimed members of the pools still configured with the same profile
// digest (runtime.LabelPoolProfile), up to each pool's Max, and removes
// the rest. A claim configures the agent with the lease's env and secrets
// and writes the lease record once, READY (no PENDING record first: the
// container exists already): the agent accepts Configure once only, so a
// sandbox configured for a lease whose record never became durable (a
// crash in between), or was lost, is adopted back but can never be
// configured for a second lease: its next claim falls back to a cold
// creation and removes it.

// PoolsConfig configures the warm pools (pool.go, docs/pools.md). Zero
// fields take the defaults (DefaultPoolsConfig).
type PoolsConfig struct {
	// Pools are the warm pools: sandboxes of a profile kept ready for
	// acquires of that profile to claim. Default none.
	Pools []PoolConfig
	// MaxPooled bounds the unclaimed pooled sandboxes (ready or being
	// created) of all pools together; they do not count against MaxLive
	// or MaxLivePerOwner until a lease claims them. Default 0: the sum of
	// the pools' Max; negative: no bound.
	MaxPooled int
	// ShrinkAfter is how long after its last miss a pool that grew
	// beyond its Min shrinks back to it. Default 5m (poolShrinkDefault).
	ShrinkAfter time.Duration
	// ClaimGrace is, with a SharedStore, how long a member may stay
	// claimed without a lease record before the elected replica removes
	// it: its claimer died between the claim and the record
	// (poolshared.go). Default 30s (poolClaimGraceDefault).
	ClaimGrace time.Duration
	// AgentConfigurer configures the agent of a claimed pooled sandbox
	// with the lease's env and secrets. Default nil: only acquires with
	// no env and no secrets claim from a pool.
	AgentConfigurer AgentConfigurer
}

// DefaultPoolsConfig returns the pools' defaults: no pools, MaxPooled 0
// (the sum of the pools' Max, filled in by withDefaults), ShrinkAfter 5m,
// ClaimGrace 30s.
func DefaultPoolsConfig() PoolsConfig {
	return PoolsConfig{ShrinkAfter: poolShrinkDefault, ClaimGrace: poolClaimGraceDefault}
}

// withDefaults fills c's zero fields from DefaultPoolsConfig (MaxPooled 0
// becomes the sum of the pools' Max) and checks each pool's name, Min and
// Max; its profile is checked against the acquire rules by newPoolSet.
func (c PoolsConfig) withDefaults() (PoolsConfig, error) {
	d := DefaultPoolsConfig()
	if c.ShrinkAfter == 0 {
		c.ShrinkAfter = d.ShrinkAfter
	}
	if c.ClaimGrace == 0 {
		c.ClaimGrace = d.ClaimGrace
	}
	if c.ClaimGrace < 0 {
		return c, errdefs.InvalidArgument("pools.claim_grace", "%s is negative", c.ClaimGrace)
	}
	seen := map[string]bool{}
	total := 0
	for i, pc := range c.Pools {
		field := fmt.Sprintf("pools[%d]", i)
		switch {
		case !poolNameRE.MatchString(pc.Name):
			return c, errdefs.InvalidArgument(field+".name", "%q: want 1-63 of [a-z0-9-], starting with a letter or digit", pc.Name)
		case seen[pc.Name]:
			return c, errdefs.InvalidArgument(field+".name", "pool %q is configured twice", pc.Name)
		case pc.Min < 0 || pc.Max < 1 || pc.Min > pc.Max:
			return c, errdefs.InvalidArgument(field+".max", "pool %q: want 0 <= min (%d) <= max (%d) and max >= 1", pc.Name, pc.Min, pc.Max)
		}
		seen[pc.Name] = true
		total += pc.Max
	}
	if c.MaxPooled == 0 {
		c.MaxPooled = total
	}
	return c, nil
}

// PoolConfig configures one warm pool.
type PoolConfig struct {
	// Name names the pool: 1-63 of [a-z0-9-], starting with a letter or
	// digit. It is written on the pool's containers (runtime.LabelPool).
	Name string
	// Image, User and Resources are the profile, with the defaults of an
	// acquire applied (an empty Image is Config.DefaultImage, zero
	// resources take AdmissionConfig.DefaultResources, an empty User the default
	// user of the image). An acquire claims from the pool when its own
	// image, user and resources, after the same defaults, are equal.
	Image     string
	User      string
	Resources runtime.Resources
	// Min is how many ready sandboxes the pool keeps; Max bounds them
	// (a pool that missed grows towards Max, and shrinks back to Min
	// after PoolsConfig.ShrinkAfter without a miss). 0 ≤ Min ≤ Max, Max ≥ 1.
	Min, Max int
}

// AgentConfigurer configures the agent of a claimed pooled sandbox with
// the lease's environment and secrets. The orchestrator implements it by
// writing the agent's state file where it can (package statefile), else
// with the agent's ConfigService.Configure call, which the proxy refuses
// to every client.
type AgentConfigurer interface {
	// Configure sets env as the default environment of every command the
	// agent a starts and adds secrets to that environment and to the
	// values it masks; every command starting after it returns has them.
	// An agent configured once refuses another Configure
	// (errdefs.ErrFailedPrecondition).
	Configure(ctx context.Context, a AgentTarget, agentToken string, env, secrets map[string]string) error
}

// AgentTarget names the agent of a pooled sandbox.
type AgentTarget struct {
	// Endpoint is the agent's host:port (runtime.Sandbox.Endpoint).
	Endpoint string
	// StateDir is the host directory of its state (runtime.Sandbox.StateDir);
	// empty when there is none.
	StateDir string
}

// AgentPreparer is optional for an AgentConfigurer: Prepare opens, ahead
// of any claim, what a later Configure of agent a needs (a connection),
// so a claim pays one round trip at most; Forget drops it for a sandbox
// that left its pool without a claim.
type AgentPreparer interface {
	Prepare(ctx context.Context, a AgentTarget)
	Forget(endpoint string)
}

var poolNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// poolShrinkDefault is PoolsConfig.ShrinkAfter's default.
const poolShrinkDefault = 5 * time.Minute

// poolCreateConcurrency bounds the pooled sandboxes created at once.
const poolCreateConcurrency = 4

// RefillBuckets are the upper bounds, in seconds, of PoolStats.Refill.
var RefillBuckets = []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30}

// poolHost is what the warm pools need from the Manager, which implements
// it: now, Tokens and goBackground are called with or without the
// Manager's mu held. The Manager's state the pools read (its leases, seq,
// closed and draining) they share instead, and they remove containers
// with the controller's removeContainers (poolSet's fields).
type poolHost interface {
	// goBackground runs f on a goroutine Close waits for.
	goBackground(f func())
	now() time.Time
	Tokens() *Tokens // token.go
}

var _ poolHost = (*Manager)(nil)

// poolSet is the warm pools: their members, figures, the refill loop and
// the adoption of members at reconcile. Its state is guarded by the
// Manager's mu (poolSet.mu points at it; there is no lock of its own, so
// no lock order to keep): the methods named ...Locked are called with it
// held, kick with or without it, the others without it (they take it
// where they need it).
type poolSet struct {
	cfg  PoolsConfig
	host poolHost
	mu   *sync.Mutex // the Manager's mu
	rt   Runtime     // the Manager's (Config.Runtime)
	log  *slog.Logger
	// removeContainers removes a lease's containers (the controller's,
	// ops.go). New sets it.
	removeContainers func(ctx context.Context, leaseID, cid string) error
	// Of the Manager's Config: what a pooled sandbox is created with.
	instanceID   string
	readyTimeout time.Duration
	denyRoot     bool
	net          NetworkConfig  // enforcement and name servers (network.go)
	network      *networkKeeper // the network policies' enforcement (network.go)
	drain        *drainer       // a draining orchestrator keeps no warm sandboxes (drain.go); New sets it

	// Of the Manager's state, read (seq bumped) with mu held: its lease
	// records (a pooled sandbox whose id has one is claimed), seq (bumped
	// when a member joins: resync races), and whether Close was called.
	leases map[string]*entry
	seq    *uint64
	closed *bool

	// pools in configuration order; byID maps the lease id of each
	// unclaimed pooled sandbox (ready or being created) to its pool;
	// kickC wakes the refill loop. Guarded by mu.
	pools []*pool
	byID  map[string]*pool
	kickC chan struct{}
	// claiming counts the warm claims whose answer is not out yet;
	// heldSince is when fill first held the refill back for them.
	// Guarded by mu.
	claiming  int
	heldSince time.Time

	// A fleet's pools (poolshared.go): fleet is the Manager's (New sets
	// it), claimer its Runtime's MemberClaimer (nil when it has none).
	// held are the members this replica is claiming, left out of its
	// view; claimedSeen when each claimed member without a lease record
	// was first seen. Guarded by mu.
	fleet       *fleet
	claimer     MemberClaimer
	held        map[string]bool
	claimedSeen map[string]time.Time
}

// refillHold is how long the refill waits, at most, for the warm claims
// in flight to answer before it creates their replacements: a burst of
// claims (ten callers at once) is answered before container creations
// take the CPU from it. Beyond it (a claim stuck in its agent's
// Configure) the refill goes on; the loop looks again every second.
const refillHold = 200 * time.Millisecond

// profile is what an acquire must match to claim from a pool.
type profile struct {
	Image     string
	User      string
	Resources runtime.Resources
}

// member is one unclaimed, ready pooled sandbox.
type member struct {
	id, containerID, endpoint, diskEnforcement string
	stateDir                                   string // runtime.Sandbox.StateDir
	seq                                        uint64 // Manager.seq when it joined (resync races)
	// net is the network policy enforced on it when it joined (the
	// default's, defaultEgress); nil: none, the claim applies the lease's.
	net *egress.Policy
}

// target is the agent of m.
func (m member) target() AgentTarget { return AgentTarget{Endpoint: m.endpoint, StateDir: m.stateDir} }

// pool is one pool's state. Guarded by Manager.mu.
type pool struct {
	cfg      PoolConfig
	prof     profile
	digest   string
	idle     []member // oldest first
	creating int
	boost    int       // grown towards Max-Min by misses
	lastMiss time.Time // real clock
	retryAt  time.Time // real clock: no creation before (after a failure)
	fails    int

	hits, misses, createFails uint64
	refill                    histogram
}

// histogram counts observations in RefillBuckets.
type histogram struct {
	Count   uint64
	Sum     float64
	Buckets []uint64 // cumulative, one per RefillBuckets
}

func (h *histogram) observe(v float64) {
	if h.Buckets == nil {
		h.Buckets = make([]uint64, len(RefillBuckets))
	}
	h.Count++
	h.Sum += v
	for i, b := range RefillBuckets {
		if v <= b {
			h.Buckets[i]++
		}
	}
}

// claim is a pooled sandbox taken by a PENDING lease (the op of its
// creation holds it: op.claim, work.go).
type claim struct {
	pool string
	m    member
	// done is closed when the agent's Configure (started at the claim,
	// startConfigureLocked) returned err.
	done chan struct{}
	err  error
}

// startConfigureLocked starts configuring the agent of claimed sandbox c
// (when there is one) with req's env and secrets for lease id, at once.
// The lease's record is written only when it is READY: a crash before
// leaves a configured sandbox without a record, which reconcile adopts
// back into its pool, but its agent refuses any further Configure, so the
// next claim of it falls back to a cold creation and removes it
// (claimSandbox). Called with mu held.
func (ps *poolSet) startConfigureLocked(ctx context.Context, c *claim, id string, req AcquireRequest) {
	if c == nil {
		return
	}
	c.done = make(chan struct{})
	cf := ps.cfg.AgentConfigurer
	if cf == nil {
		close(c.done)
		return
	}
	token, env, secrets := ps.host.Tokens().AgentToken(id), maps.Clone(req.Env), maps.Clone(req.Secrets)
	ps.host.goBackground(func() {
		defer close(c.done)
		cctx, cancel := detached(ctx, ps.readyTimeout)
		defer cancel()
		c.err = cf.Configure(cctx, c.m.target(), token, env, secrets)
	})
}

// writeClaimRecord starts writing the READY record of e, the PENDING lease
// of claim c, while c's Configure runs (one store write on the warm path,
// in parallel with the agent's round trip). The record is READY in
// PhaseClaiming: a restart that finds it asks the agent whether Configure
// happened (unconfiguredClaims) and fails the lease when it did not, so a
// record written before the agent had the lease's env never becomes a
// READY lease whose commands lack it. In memory the lease stays PENDING
// (no Get, Watch or proxy sees it READY) until Configure has returned and
// this write is durable; the final READY record (PhaseNone) is then
// written off the request path, unless another write of the lease came
// in between (the revision returned is the record's: see create). The
// returned channel yields the write's error. Called without a.mu.
func (a *acquirer) writeClaimRecord(e *entry, c *claim) (<-chan error, uint64) {
	a.mu.Lock()
	l, rev := e.snapshot()
	now := a.host.now()
	l.ContainerID, l.Endpoint, l.DiskEnforcement, l.Pool = c.m.containerID, c.m.endpoint, c.m.diskEnforcement, c.pool
	l.ExpiresAt, l.LastActivityAt = now.Add(l.TTL), now
	_, err := l.TransitionPhase(StateReady, PhaseClaiming, "claimed from pool "+c.pool, now)
	a.mu.Unlock()
	done := make(chan error, 1)
	if err != nil {
		done <- err
		return done, rev
	}
	a.host.goBackground(func() { done <- a.host.persist(l, rev) })
	return done, rev
}

// unconfiguredClaims returns the ids of the READY leases loaded with
// PhaseClaiming (the orchestrator stopped while their claim was
// configuring the agent) whose agent was not configured, or could not be
// asked: reconcile fails them (their caller never got a READY answer, which
// waits for Configure). It asks with an empty Configure: an agent already
// configured refuses it (FAILED_PRECONDITION) and keeps the lease's env;
// one that was not is configured empty and removed with its lease.
// Called by reconcile before it takes mu.
func (ps *poolSet) unconfiguredClaims(ctx context.Context, byLease map[string][]runtime.Sandbox) map[string]bool {
	type probe struct{ id, endpoint string }
	var probes []probe
	ps.mu.Lock()
	for _, l := range ps.claimingLocked() {
		sb, ok := pick(l, byLease[l.ID]) // plan.go
		p := probe{id: l.ID}
		if ok && sb.State == runtime.StateRunning {
			p.endpoint = sb.Endpoint
		}
		probes = append(probes, p)
	}
	ps.mu.Unlock()
	bad := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error = errdefs.Unavailable("sandbox not running")
			if p.endpoint != "" && ps.cfg.AgentConfigurer != nil {
				pctx, cancel := detached(ctx, 10*time.Second)
				// Over gRPC (no StateDir): the agent answers for a
				// configuration given either way.
				err = ps.cfg.AgentConfigurer.Configure(pctx, AgentTarget{Endpoint: p.endpoint}, ps.host.Tokens().AgentToken(p.id), nil, nil)
				cancel()
			}
			if errors.Is(err, errdefs.ErrFailedPrecondition) {
				return // configured: the lease is whole
			}
			ps.log.Warn("reconcile: a warm claim was interrupted before its sandbox was configured; failing the lease",
				"lease_id", p.id, "err", err)
			mu.Lock()
			bad[p.id] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	return bad
}

// defaultEgress is the network policy an acquire that names none gets
// under c (the operator's default, under the ceiling), as
// networkKeeper.enforce computes it. Pooled sandboxes are given it when they join their pool, so
// a claim that keeps it programs no rules on the request path.
func (c NetworkConfig) defaultEgress() (egress.Policy, error) {
	np, err := c.admit(nil) // network.go
	if err != nil {
		return egress.Policy{}, err
	}
	pol, _ := c.Ceiling.Clamp(netOf(np).egress())
	return pol, nil
}

// claimNetwork enforces lease id's network policy on its claimed sandbox
// c, while the agent is configured (the lease is READY once both are
// done): nothing to do when the policy enforced on c when it joined its
// pool is the lease's. The returned channel yields the outcome.
func (a *acquirer) claimNetwork(ctx context.Context, c *claim, id string) <-chan error {
	done := make(chan error, 1)
	if a.net.Egress == nil {
		done <- nil
		return done
	}
	if c.m.net != nil {
		a.mu.Lock()
		var p NetworkPolicy
		if e := a.leases[id]; e != nil {
			p = e.l.Network.Clone()
		}
		a.mu.Unlock()
		pol, _ := a.net.Ceiling.Clamp(p.egress())
		if pol.Mode == c.m.net.Mode && slices.Equal(pol.Allow, c.m.net.Allow) && slices.Equal(pol.Deny, c.m.net.Deny) {
			done <- nil
			return done
		}
	}
	go func() { done <- a.network.enforce(ctx, id, c.m.endpoint) }() // network.go
	return done
}

// PoolStats are one pool's figures for metrics.
type PoolStats struct {
	// Name is the pool's name; Image its profile's image.
	Name, Image string
	// Ready counts the ready, unclaimed sandboxes; Creating those being
	// created; Target how many the pool is filling towards.
	Ready, Creating, Target int
	// Hits counts acquires that claimed a sandbox, Misses acquires of the
	// pool's profile that found it empty (they create one cold).
	Hits, Misses uint64
	// CreateFailures counts pooled sandboxes that failed to be created.
	CreateFailures uint64
	// Refill observes the creation time of each pooled sandbox, in
	// seconds (RefillBuckets).
	RefillCount   uint64
	RefillSum     float64
	RefillBuckets []uint64
}

// PoolStats returns every pool's figures, in configuration order.
func (m *Manager) PoolStats() []PoolStats { return m.pools.stats() }

// stats is PoolStats.
func (ps *poolSet) stats() []PoolStats {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]PoolStats, 0, len(ps.pools))
	for _, p := range ps.pools {
		out = append(out, PoolStats{Name: p.cfg.Name, Image: p.prof.Image, Ready: len(p.idle), Creating: p.creating,
			Target: p.targetLocked(), Hits: p.hits, Misses: p.misses, CreateFailures: p.createFails,
			RefillCount: p.refill.Count, RefillSum: p.refill.Sum, RefillBuckets: slices.Clone(p.refill.Buckets)})
	}
	return out
}

// targetLocked is how many ready sandboxes p fills towards.
func (p *pool) targetLocked() int { return min(p.cfg.Min+p.boost, p.cfg.Max) }

// newPoolSet validates cfg.Pools.Pools (checked by withDefaults already)
// against the acquire rules (validate: the acquirer's, acquire.go) and
// builds the pools of the Manager host, whose mu, leases, seq and closed
// are given. Called by New, which sets draining.
func newPoolSet(cfg Config, host poolHost, validate func(AcquireRequest) (AcquireRequest, error), mu *sync.Mutex,
	leases map[string]*entry, seq *uint64, closed *bool) (*poolSet, error) {
	ps := &poolSet{cfg: cfg.Pools, host: host, mu: mu, rt: cfg.Runtime, log: cfg.Logger,
		instanceID: cfg.InstanceID, readyTimeout: cfg.ReadyTimeout, denyRoot: cfg.Admission.DenyRootUser, net: cfg.Network,
		leases: leases, seq: seq, closed: closed,
		byID: map[string]*pool{}, kickC: make(chan struct{}, 1), held: map[string]bool{}, claimedSeen: map[string]time.Time{}}
	ps.claimer, _ = cfg.Runtime.(MemberClaimer)
	for _, pc := range ps.cfg.Pools {
		req, err := validate(AcquireRequest{ConversationID: "pool", Image: pc.Image, User: pc.User, Resources: pc.Resources})
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", pc.Name, err)
		}
		p := &pool{cfg: pc, prof: profile{Image: req.Image, User: req.User, Resources: req.Resources}}
		p.digest = p.prof.digest(ps.denyRoot, ps.net.dns())
		ps.pools = append(ps.pools, p)
	}
	return ps, nil
}

// digest names a profile (and the root policy and name servers its
// sandboxes were created with) on the containers: reconcile adopts only
// members whose digest is the pool's current one.
func (pr profile) digest(denyRoot bool, dns []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00%d\x00%d\x00%t\x00%q", pr.Image, pr.User, pr.Resources.NanoCPUs, pr.Resources.MemoryBytes,
		pr.Resources.PidsLimit, pr.Resources.DiskBytes, denyRoot, dns)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// forLocked returns the pool whose profile req (validated) matches, or nil.
// A request for anything a pooled container cannot be given afterwards
// never matches: env and secrets can (the agent's Configure), so can
// labels, times, public ports and policies (they live in the lease; the
// network policy is applied to the lease's endpoint after the claim as
// after a creation); a new
// AcquireRequest field that changes how the container is created must
// keep such requests out of the pools here. Called with mu held.
func (ps *poolSet) forLocked(req AcquireRequest) *pool {
	if len(ps.pools) == 0 {
		return nil
	}
	if (len(req.Env) > 0 || len(req.Secrets) > 0) && ps.cfg.AgentConfigurer == nil {
		return nil
	}
	if req.Snapshot != "" || req.fork != nil || req.Persist || len(req.Mounts) > 0 {
		return nil // a fork's files, a workspace volume, host mounts: made at create
	}
	want := profile{Image: req.Image, User: req.User, Resources: req.Resources}
	for _, p := range ps.pools {
		if p.prof == want {
			return p
		}
	}
	return nil
}

// takeLocked claims the oldest ready member of p for an acquire, counting
// a hit, or counts a miss (and grows the pool) when it has none. A miss
// wakes the refill loop at once; after a hit, create calls answered when
// the claim has answered, and the refill waits for the last claim in
// flight (at most refillHold), so that container creations do not
// compete with a burst of claims for the CPU. Called with mu held.
func (ps *poolSet) takeLocked(p *pool) (member, bool) {
	if len(p.idle) == 0 {
		defer ps.kick()
		p.misses++
		p.lastMiss = time.Now()
		if p.cfg.Min+p.boost < p.cfg.Max {
			p.boost++
		}
		return member{}, false
	}
	mb := p.idle[0]
	p.idle = slices.Delete(p.idle, 0, 1)
	delete(ps.byID, mb.id)
	p.hits++
	ps.claiming++ // until answered
	return mb, true
}

// answered notes that a warm claim (takeLocked's hit) has answered its
// caller, and wakes the refill loop when it was the last one in flight.
func (ps *poolSet) answered() {
	ps.mu.Lock()
	ps.claiming--
	last := ps.claiming == 0
	ps.mu.Unlock()
	if last {
		ps.kick()
	}
}

// kick wakes the refill loop.
func (ps *poolSet) kick() {
	select {
	case ps.kickC <- struct{}{}:
	default:
	}
}

// claimSandbox makes the claimed pooled sandbox c the lease's: it
// configures its agent with spec's env and secrets. When that fails (the
// agent died, or it was configured before) the sandbox is removed and
// one is created cold under the same lease id instead, so a bad member
// costs the caller time, not an error.
func (ps *poolSet) claimSandbox(ctx context.Context, c *claim, spec runtime.Spec) (sb runtime.Sandbox, warm bool, err error) {
	select {
	case <-c.done:
		err = c.err
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		return runtime.Sandbox{ID: c.m.containerID, Endpoint: c.m.endpoint, StateDir: c.m.stateDir, DiskEnforcement: c.m.diskEnforcement,
			LeaseID: spec.LeaseID, Image: spec.Image, State: runtime.StateRunning}, true, nil
	}
	ps.log.Warn("claimed pooled sandbox could not be configured; creating one cold", "pool", c.pool, "lease_id", spec.LeaseID,
		"container_id", c.m.containerID, "err", err)
	if err := ps.removeContainers(ctx, spec.LeaseID, c.m.containerID); err != nil {
		return runtime.Sandbox{}, false, err
	}
	sb, err = ps.rt.Create(ctx, spec)
	return sb, false, err
}

// loop keeps every pool filled until ctx ends: woken by claims and
// misses, and every second for shrinking and retries.
func (ps *poolSet) loop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	sem := make(chan struct{}, poolCreateConcurrency)
	for {
		if ps.sharedLocked() && len(ps.pools) > 0 {
			ps.syncShared(ctx) // poolshared.go: the fleet's members
		}
		if ps.leading() { // a fleet's pools are filled by its elected replica
			ps.fill(ctx, sem)
		}
		select {
		case <-ctx.Done():
			return
		case <-ps.kickC:
		case <-t.C:
		}
	}
}

// fill starts the creations the pools are short of (within
// PoolsConfig.MaxPooled and the creation concurrency) and removes members
// beyond a pool's target once it has shrunk.
func (ps *poolSet) fill(ctx context.Context, sem chan struct{}) {
	var trim []member
	ps.mu.Lock()
	if *ps.closed {
		ps.mu.Unlock()
		return
	}
	now := time.Now()
	total := 0
	for _, p := range ps.pools {
		total += len(p.idle) + p.creating
	}
	hold := false // claims in flight: no creation yet (refillHold)
	if ps.claiming > 0 {
		if ps.heldSince.IsZero() {
			ps.heldSince = now
		}
		hold = now.Sub(ps.heldSince) < refillHold
	} else {
		ps.heldSince = time.Time{}
	}
pools:
	for _, p := range ps.pools {
		if p.boost > 0 && now.Sub(p.lastMiss) > ps.cfg.ShrinkAfter {
			p.boost = 0
		}
		target := p.targetLocked()
		if ps.drain.drainingLocked() { // drain.go: a draining orchestrator keeps no warm sandboxes
			if ps.sharedLocked() {
				continue // a fleet's members are the other replicas' too: no creation, no trim
			}
			target = 0
		}
		for len(p.idle) > target {
			mb := p.idle[len(p.idle)-1] // the newest: the oldest are claimed first
			p.idle = p.idle[:len(p.idle)-1]
			delete(ps.byID, mb.id)
			trim = append(trim, mb)
			total--
		}
		if hold || now.Before(p.retryAt) {
			continue
		}
		for len(p.idle)+p.creating < target && (ps.cfg.MaxPooled < 0 || total < ps.cfg.MaxPooled) {
			select {
			case sem <- struct{}{}:
			default:
				break pools // at the concurrency bound; a finishing creation kicks again
			}
			id := newID(ps.host.now())
			ps.byID[id] = p
			p.creating++
			total++
			ps.host.goBackground(func() {
				defer func() { <-sem; ps.kick() }()
				ps.createPooled(ctx, p, id)
			})
		}
	}
	ps.mu.Unlock()
	for _, mb := range trim {
		drop := ps.dropMember
		if ps.sharedLocked() {
			drop = ps.trimShared // poolshared.go: claimed first
		}
		if err := drop(ctx, mb); err != nil {
			ps.log.Warn("pool: removing a surplus sandbox failed; resync retries", "container_id", mb.containerID, "err", err)
		}
	}
}

// createPooled creates one sandbox of pool p under the pre-allocated lease
// id and adds it to the pool once its agent is ready.
func (ps *poolSet) createPooled(ctx context.Context, p *pool, id string) {
	spec := runtime.Spec{
		LeaseID: id, InstanceID: ps.instanceID, Image: p.prof.Image, AgentToken: ps.host.Tokens().AgentToken(id),
		Resources: p.prof.Resources, ReadyTimeout: ps.readyTimeout, User: p.prof.User, DenyRootUser: ps.denyRoot,
		Pool: p.cfg.Name, PoolProfile: p.digest,
		DNS: ps.net.dns(), // network.go: the policy itself is applied at the claim
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, ps.readyTimeout+5*time.Second)
	sb, err := ps.rt.Create(cctx, spec)
	cancel()
	took := time.Since(start)
	if pr, ok := ps.cfg.AgentConfigurer.(AgentPreparer); ok && err == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		pr.Prepare(pctx, AgentTarget{Endpoint: sb.Endpoint, StateDir: sb.StateDir})
		cancel()
	}
	// The default network policy, enforced ahead: a claim that keeps it
	// has no rules to program (claimNetwork). No command runs in a member.
	var applied *egress.Policy
	if ps.net.Egress != nil && err == nil {
		if pol, perr := ps.net.defaultEgress(); perr == nil {
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if aerr := ps.net.Egress.Apply(actx, id, sb.Endpoint, pol); aerr == nil {
				applied = &pol
			} else {
				ps.log.Warn("pool: enforcing the default network policy ahead failed; the claim will", "pool", p.cfg.Name, "lease_id", id, "err", aerr)
			}
			cancel()
		}
	}

	if err == nil && ps.sharedLocked() && ps.claimer != nil {
		// The fleet's other replicas hand it out once marked (poolshared.go).
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if merr := ps.claimer.MarkMemberReady(mctx, sb.ID); merr != nil {
			ps.log.Warn("pool: marking a member ready failed; only this replica hands it out", "pool", p.cfg.Name, "lease_id", id, "err", merr)
		}
		cancel()
	}

	ps.mu.Lock()
	p.creating--
	if err != nil {
		delete(ps.byID, id)
		p.createFails++
		p.fails++
		p.retryAt = time.Now().Add(backoff(p.fails + 2))
		ps.mu.Unlock()
		if ctx.Err() == nil {
			ps.log.Warn("pool: creating a sandbox failed", "pool", p.cfg.Name, "image", spec.Image, "err", err)
			_ = ps.removeContainers(ctx, id, "")
		}
		return
	}
	p.fails = 0
	p.refill.observe(took.Seconds())
	*ps.seq++
	seq := *ps.seq
	p.idle = append(p.idle, member{id: id, containerID: sb.ID, endpoint: sb.Endpoint, diskEnforcement: sb.DiskEnforcement, stateDir: sb.StateDir, seq: seq, net: applied})
	ps.mu.Unlock()
	ps.log.Debug("pool: sandbox ready", "pool", p.cfg.Name, "lease_id", id, "container_id", sb.ID, "took", took)
}

// dropMember removes a sandbox that leaves its pool unclaimed.
func (ps *poolSet) dropMember(ctx context.Context, mb member) error {
	if pr, ok := ps.cfg.AgentConfigurer.(AgentPreparer); ok {
		pr.Forget(mb.endpoint)
	}
	if mb.net != nil {
		ps.network.drop(ctx, mb.id) // network.go
	}
	return ps.removeContainers(ctx, mb.id, mb.containerID)
}

// pooledLocked reports whether container sb (listed by the runtime) is an
// unclaimed member of a pool, ready or being created: resync leaves it to
// the pool. Called with mu held.
func (ps *poolSet) pooledLocked(sb runtime.Sandbox) bool {
	if ps.sharedLocked() {
		// A fleet's: the pools' view and the elected replica decide
		// (poolshared.go), whichever replica created it.
		return sb.Labels[runtime.LabelPool] != "" && !ps.leasedLocked(sb.LeaseID)
	}
	return sb.Labels[runtime.LabelPool] != "" && !ps.leasedLocked(sb.LeaseID) && ps.byID[sb.LeaseID] != nil
}

// adoptLocked adopts the containers reconcile found with a pool label
// and no lease record: running ones of a configured pool with the same
// profile digest, up to the pool's Max and PoolsConfig.MaxPooled. It
// returns the ids adopted; reconcile removes the others. Called with mu
// held.
func (ps *poolSet) adoptLocked(boxes []runtime.Sandbox) map[string]bool {
	if ps.sharedLocked() {
		return ps.adoptSharedLocked(boxes) // poolshared.go
	}
	adopted := map[string]bool{}
	byName := map[string]*pool{}
	for _, p := range ps.pools {
		byName[p.cfg.Name] = p
	}
	total := 0
	// Oldest first, so the order of claims survives a restart.
	boxes = slices.Clone(boxes)
	slices.SortFunc(boxes, func(a, b runtime.Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	for _, sb := range boxes {
		name := sb.Labels[runtime.LabelPool]
		if name == "" || ps.leasedLocked(sb.LeaseID) {
			continue
		}
		p := byName[name]
		switch {
		case p == nil, sb.Labels[runtime.LabelPoolProfile] != p.digest, sb.State != runtime.StateRunning,
			len(p.idle) >= p.cfg.Max, ps.cfg.MaxPooled >= 0 && total >= ps.cfg.MaxPooled:
			ps.log.Info("reconcile: pooled sandbox not adopted", "pool", name, "container_id", sb.ID, "state", string(sb.State))
			continue
		}
		p.idle = append(p.idle, member{id: sb.LeaseID, containerID: sb.ID, endpoint: sb.Endpoint, stateDir: sb.StateDir})
		ps.byID[sb.LeaseID] = p
		adopted[sb.ID] = true
		total++
		ps.log.Info("reconcile: adopted pooled sandbox", "pool", name, "lease_id", sb.LeaseID, "container_id", sb.ID)
	}
	return adopted
}

// event handles a runtime event for an unclaimed pooled sandbox: one
// that died or was removed leaves its pool (and its container is removed);
// the pool refills. It reports whether ev was a pool member's. Called
// without mu.
func (ps *poolSet) event(ctx context.Context, ev runtime.Event) bool {
	if ev.Kind != runtime.EventDied && ev.Kind != runtime.EventRemoved {
		return false
	}
	ps.mu.Lock()
	p := ps.byID[ev.LeaseID]
	if p == nil || ps.leasedLocked(ev.LeaseID) {
		ps.mu.Unlock()
		return false
	}
	i := slices.IndexFunc(p.idle, func(mb member) bool { return mb.containerID == ev.ID })
	if i < 0 {
		ps.mu.Unlock()
		return true // being created: the creation reports its outcome
	}
	mb := p.idle[i]
	p.idle = slices.Delete(p.idle, i, i+1)
	delete(ps.byID, mb.id)
	ps.mu.Unlock()
	ps.log.Warn("pool: a ready sandbox "+string(ev.Kind)+"; replacing it", "pool", p.cfg.Name, "container_id", ev.ID, "exit_code", ev.ExitCode)
	if ps.leading() { // a fleet's elected replica removes it (poolshared.go)
		_ = ps.dropMember(ctx, mb)
	}
	ps.kick()
	return true
}

// resyncLocked drops the ready members that are missing from the
// runtime's list byID (taken at Manager.seq seq), or not running, and
// returns those to remove (dropMember, without mu). Called with mu held.
func (ps *poolSet) resyncLocked(byID map[string]runtime.Sandbox, seq uint64) []member {
	if ps.sharedLocked() {
		return nil // the fleet's members are not this instance's: syncShared (poolshared.go)
	}
	var gone []member
	for _, p := range ps.pools {
		p.idle = slices.DeleteFunc(p.idle, func(mb member) bool {
			sb, ok := byID[mb.containerID]
			if mb.seq > seq || ok && sb.State == runtime.StateRunning {
				return false
			}
			delete(ps.byID, mb.id)
			gone = append(gone, mb)
			return true
		})
	}
	if len(gone) > 0 {
		ps.kick()
	}
	return gone
}

// snapshot is a test helper's view: pool name → ready member ids.
func (ps *poolSet) snapshot() map[string][]string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := map[string][]string{}
	for _, p := range ps.pools {
		ids := make([]string, 0, len(p.idle))
		for _, mb := range p.idle {
			ids = append(ids, mb.id)
		}
		out[p.cfg.Name] = ids
	}
	return out
}

// leasedLocked reports whether lease id has a record. Called with mu held.
func (ps *poolSet) leasedLocked(id string) bool { return ps.leases[id] != nil }

// claimingLocked returns the READY leases loaded in PhaseClaiming.
// Called with mu held; the leases are read under it only.
func (ps *poolSet) claimingLocked() []*Lease {
	var out []*Lease
	for _, e := range ps.leases {
		if e.l.State == StateReady && e.l.Phase == PhaseClaiming {
			out = append(out, &e.l)
		}
	}
	return out
}
