package lease

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// PauseMode is how deep a lease is paused.
type PauseMode string

// Pause modes.
const (
	// PauseFreeze freezes the sandbox's processes in place (the cgroup
	// freezer, runtime.Freezer): memory, processes and files stay; resume
	// thaws them. Backends without a Freezer refuse it.
	PauseFreeze PauseMode = "freeze"
	// PauseHibernate stops the sandbox's container, keeping its files and
	// freeing its memory: resume starts it again and waits for its agent;
	// the processes that were running are gone.
	PauseHibernate PauseMode = "hibernate"
)

// IdlePolicy is what a lease's idle timeout does to it.
type IdlePolicy string

// Idle policies.
const (
	// IdleExpire ends an idle lease (EXPIRED) and removes its sandbox.
	IdleExpire IdlePolicy = "expire"
	// IdleFreeze pauses an idle lease with PauseFreeze.
	IdleFreeze IdlePolicy = "freeze"
	// IdleHibernate pauses an idle lease with PauseHibernate.
	IdleHibernate IdlePolicy = "hibernate"
)

func (p IdlePolicy) valid() bool { return p == IdleExpire || p == IdleFreeze || p == IdleHibernate }

// ParseIdlePolicy parses "expire", "freeze" or "hibernate"
// (case-insensitively); "" stays "" (the configured default). Anything else
// is errdefs.ErrInvalidArgument naming field.
func ParseIdlePolicy(field, s string) (IdlePolicy, error) {
	p := IdlePolicy(strings.ToLower(strings.TrimSpace(s)))
	if p != "" && !p.valid() {
		return "", errdefs.InvalidArgument(field, "unknown idle policy %q (want expire, freeze or hibernate)", s)
	}
	return p, nil
}

// DefaultPausedRetention is PauseConfig.PausedRetention's default: a
// paused lease expires after a week.
const DefaultPausedRetention = 7 * 24 * time.Hour

// PauseConfig configures pausing (pause.go): what the idle timeout does by
// default and how long a lease may stay PAUSED. Zero fields take the
// defaults (DefaultPauseConfig).
type PauseConfig struct {
	// DefaultIdlePolicy is what the idle timeout does to a lease whose
	// acquire names no policy: IdleExpire (the default) ends it,
	// IdleFreeze or IdleHibernate pause it. IdleFreeze needs a
	// runtime.Freezer.
	DefaultIdlePolicy IdlePolicy
	// PausedRetention is how long a lease may stay PAUSED before it
	// expires (a paused lease neither idle-expires nor runs out its TTL).
	// Default DefaultPausedRetention (7 days); negative keeps paused
	// leases until they are resumed or released.
	PausedRetention time.Duration
}

// DefaultPauseConfig returns the pause defaults: idle leases expire,
// paused ones are kept DefaultPausedRetention.
func DefaultPauseConfig() PauseConfig {
	return PauseConfig{DefaultIdlePolicy: IdleExpire, PausedRetention: DefaultPausedRetention}
}

// withDefaults fills c's zero fields from DefaultPauseConfig and validates
// c: DefaultIdlePolicy must be a known policy (errdefs.ErrInvalidArgument
// naming default_idle_policy). Whether the runtime can freeze is checked
// by checkRuntime.
func (c PauseConfig) withDefaults() (PauseConfig, error) {
	d := DefaultPauseConfig()
	if c.PausedRetention == 0 {
		c.PausedRetention = d.PausedRetention
	}
	if c.DefaultIdlePolicy == "" {
		c.DefaultIdlePolicy = d.DefaultIdlePolicy
	}
	if !c.DefaultIdlePolicy.valid() {
		return c, errdefs.InvalidArgument("default_idle_policy", "unknown idle policy %q (want expire, freeze or hibernate)", string(c.DefaultIdlePolicy))
	}
	return c, nil
}

// Validate reports whether New would accept c with a runtime that can
// freeze (errdefs.ErrInvalidArgument naming the field otherwise).
func (c PauseConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// checkRuntime refuses a default idle policy runtime rt cannot carry out
// (freeze without a runtime.Freezer): errdefs.ErrInvalidArgument naming
// default_idle_policy.
func (c PauseConfig) checkRuntime(rt any) error {
	if _, canFreeze := rt.(runtime.Freezer); c.DefaultIdlePolicy == IdleFreeze && !canFreeze {
		return errdefs.InvalidArgument("default_idle_policy", "freeze: the %s runtime cannot freeze a sandbox; use hibernate", backendName(rt))
	}
	return nil
}

// idlePolicy resolves an acquire's idle policy p ("" takes
// DefaultIdlePolicy) and validates it against runtime rt: an unknown
// policy is errdefs.ErrInvalidArgument naming field, freeze without a
// runtime.Freezer errdefs.ErrFailedPrecondition.
func (c PauseConfig) idlePolicy(rt any, field string, p IdlePolicy) (IdlePolicy, error) {
	if p == "" {
		p = c.DefaultIdlePolicy
	}
	if !p.valid() {
		return p, errdefs.InvalidArgument(field, "unknown idle policy %q (want expire, freeze or hibernate)", string(p))
	}
	if p == IdleFreeze {
		if _, err := freezerOf(rt); err != nil {
			return p, errdefs.FailedPrecondition("%s freeze: %v", field, err)
		}
	}
	return p, nil
}

// pausedExpiryReason says why PAUSED l has expired at now (its
// PausedRetention passed), or "".
func (c PauseConfig) pausedExpiryReason(l *Lease, now time.Time) string {
	if c.PausedRetention < 0 || now.Sub(l.PausedAt) < c.PausedRetention {
		return ""
	}
	return fmt.Sprintf("paused for %s (paused retention)", c.PausedRetention)
}

// hibernateGrace is how long a hibernating sandbox's processes get between
// SIGTERM and SIGKILL.
const hibernateGrace = 2 * time.Second

// Reasons recorded on pause and resume transitions.
const (
	ReasonFrozen       = "paused (freeze): processes frozen, memory and files kept"
	ReasonHibernated   = "paused (hibernate): container stopped, files kept; running processes are gone"
	ReasonThawed       = "resumed (freeze): processes thawed"
	ReasonWoken        = "resumed from hibernate: container started again, files kept; processes that were running are gone"
	ReasonFreezeLost   = "frozen sandbox found stopped: now hibernated, files kept; running processes are gone"
	reasonPauseFailedF = "pause (%s) failed: %v"
)

// ParsePauseMode parses "freeze" or "hibernate" (case-insensitively); ""
// is PauseFreeze. Anything else is errdefs.ErrInvalidArgument naming field.
func ParsePauseMode(field, s string) (PauseMode, error) {
	switch PauseMode(strings.ToLower(strings.TrimSpace(s))) {
	case "", PauseFreeze:
		return PauseFreeze, nil
	case PauseHibernate:
		return PauseHibernate, nil
	}
	return "", errdefs.InvalidArgument(field, "unknown pause mode %q (want freeze or hibernate)", s)
}

// holdsConversation reports whether a lease in state s holds its
// conversation (a second acquire of it returns this lease).
func holdsConversation(s State) bool {
	return s == StatePending || s == StateReady || s == StatePaused
}

// freezerOf returns rt as a Freezer, or a FailedPrecondition naming the
// backend when it is none.
func freezerOf(rt any) (runtime.Freezer, error) {
	if fr, ok := rt.(runtime.Freezer); ok {
		return fr, nil
	}
	return nil, errdefs.FailedPrecondition("the %s runtime cannot freeze a sandbox; use mode hibernate", backendName(rt))
}

// backendName names rt's backend from its type ("*inproc.Runtime" → "inproc").
func backendName(rt any) string {
	n := strings.TrimPrefix(fmt.Sprintf("%T", rt), "*")
	n, _, _ = strings.Cut(n, ".")
	return n
}

// pauseHost is what the pauser needs from the Manager; *Manager implements
// it. Every method ending in Locked is called with the Manager's mu held.
type pauseHost interface {
	// now is the lease clock (manager.go).
	now() time.Time
	// enterLocked admits a call Close waits for; the pauser's done ends
	// it (manager.go).
	enterLocked() error
	// transitionLocked moves e to a state (manager.go).
	transitionLocked(e *entry, to State, reason string) error
	// persist writes a snapshot of a lease (manager.go).
	persist(l Lease, rev uint64) error
	// expireIfDueLocked expires READY e if it is past its TTL; on error
	// mu is released (ops.go).
	expireIfDueLocked(e *entry, now time.Time) error
	// endOpLocked gives e back from an operation with its outcome and
	// queues what is left to do, e.g. the removal of a lease released or
	// failed meanwhile (work.go).
	endOpLocked(e *entry, o *op, err error)
}

// pauseBackend is the part of the Runtime the pauser calls itself.
type pauseBackend interface {
	Stop(ctx context.Context, id string, grace time.Duration) error
}

// hibernator is a Runtime that hibernates a sandbox in one call: it stops
// it as Stop does and releases what the stopped sandbox still holds on the
// host besides its files (the containerd backend: its task and network),
// so that the wake-up (Restart) has less to do. A Runtime without it is
// stopped with Stop.
type hibernator interface {
	Hibernate(ctx context.Context, id string, grace time.Duration) error
}

// hibernate stops container cid for a hibernation: with the Runtime's
// Hibernate when it has one, else with Stop.
func (p *pauser) hibernate(ctx context.Context, cid string) error {
	if h, ok := p.rt.(hibernator); ok {
		return h.Hibernate(ctx, cid, hibernateGrace)
	}
	return p.rt.Stop(ctx, cid, hibernateGrace)
}

// pauser pauses and resumes leases (freeze or hibernate, explicitly or by
// the idle policy), orders requests (Use, use.go) against pauses, and
// pauses again the sandboxes of PAUSED leases found running (reconcile).
//
// Locking contract: the pauser shares the Manager's mu (its mu field) and
// reads the Manager's leases map with it held; methods ending in Locked
// are called with mu held (idleEntryLocked returns with mu released when
// it fails). A pause, resume, snapshot (snapshot.go) or pause fix holds
// the lease (entry.op, work.go: opPause, opResume, opSnapshot) while it
// runs: every other pause, resume or Use of that lease waits for it to
// end and then looks again; a resume waiting on another resume shares its
// outcome. The hold is given back, under mu, before the op's done is
// closed.
type pauser struct {
	cfg  PauseConfig
	host pauseHost
	// rt is the Manager's Runtime: it stops a hibernating sandbox, and
	// its type names the backend in errors.
	rt pauseBackend
	// fr is rt's Freezer, nil when it has none (freezer).
	fr  runtime.Freezer
	log *slog.Logger
	// removeTimeout (Config.RemoveTimeout) bounds a freeze, thaw or stop;
	// readyTimeout (Config.ReadyTimeout) a wake from hibernate.
	removeTimeout, readyTimeout time.Duration
	// requestGrace bounds how long an explicit Pause waits for the
	// requests admitted before it (pauseRequestGrace).
	requestGrace time.Duration
	// done ends a call enterLocked admitted (the Manager's wg.Done).
	done func()
	// chargedLocked is what uploads added to e's disk usage since its last
	// measurement (diskEnforcer.chargedLocked), for Use's Route.
	chargedLocked func(e *entry) int64

	mu     *sync.Mutex       // the Manager's
	leases map[string]*entry // the Manager's, read with mu held
	// network applies a woken sandbox's network policy, and forgets a
	// hibernated one's (network.go). New sets it.
	network *networkKeeper
	// drain refuses resumes while draining (drain.go). New sets it.
	drain *drainer
	// vols starts a hibernated sandbox's container again once its host
	// mounts are checked (volumes.go: restartSandbox).
	vols *volumeKeeper
}

// newPauser returns the pauser of a Manager configured by cfg (defaults
// applied): host is the Manager, done its wg.Done, charged its
// diskEnforcer's chargedLocked, vols its volumeKeeper, mu and leases its
// own.
func newPauser(cfg Config, host pauseHost, done func(), charged func(*entry) int64, vols *volumeKeeper, mu *sync.Mutex, leases map[string]*entry) *pauser {
	fr, _ := cfg.Runtime.(runtime.Freezer)
	return &pauser{cfg: cfg.Pause, host: host, rt: cfg.Runtime, fr: fr, log: cfg.Logger,
		removeTimeout: cfg.RemoveTimeout, readyTimeout: cfg.ReadyTimeout, requestGrace: pauseRequestGrace,
		done: done, chargedLocked: charged, vols: vols, mu: mu, leases: leases}
}

// freezer returns the runtime's Freezer, or a FailedPrecondition naming the
// backend when it has none.
func (p *pauser) freezer() (runtime.Freezer, error) {
	if p.fr != nil {
		return p.fr, nil
	}
	return freezerOf(p.rt)
}

// Pause pauses READY lease id: with PauseFreeze its processes are frozen
// (errdefs.ErrFailedPrecondition when the runtime has no Freezer), with
// PauseHibernate its container is stopped with its files kept. The PAUSED
// state is written to the store before the runtime acts, so a crash in
// between is repaired by reconcile. Pausing a lease already paused the
// same way returns it; another state (or another mode), or a READY lease
// already past its TTL (which Pause expires), is
// errdefs.ErrFailedPrecondition, an unknown id errdefs.ErrNotFound. If the
// runtime fails, the lease goes back to READY and the error is returned.
func (m *Manager) Pause(ctx context.Context, id string, mode PauseMode) (Lease, error) {
	return m.pauser.pause(ctx, id, mode)
}

// pause is Manager.Pause.
func (p *pauser) pause(ctx context.Context, id string, mode PauseMode) (Lease, error) {
	if mode != PauseFreeze && mode != PauseHibernate {
		return Lease{}, errdefs.InvalidArgument("mode", "unknown pause mode %q (want freeze or hibernate)", string(mode))
	}
	var fr runtime.Freezer
	if mode == PauseFreeze {
		var err error
		if fr, err = p.freezer(); err != nil {
			return Lease{}, err
		}
	}
	p.mu.Lock()
	if err := p.host.enterLocked(); err != nil {
		p.mu.Unlock()
		return Lease{}, err
	}
	defer p.done()
	e, err := p.idleEntryLocked(ctx, id)
	if err != nil {
		return Lease{}, err
	}
	switch {
	case e.l.State == StatePaused && e.l.Paused == mode:
		l := e.l.Clone()
		p.mu.Unlock()
		return l, nil
	case e.l.State == StatePaused:
		err := errdefs.FailedPrecondition("lease %s is already paused (%s); resume it first", id, e.l.Paused)
		p.mu.Unlock()
		return Lease{}, err
	case e.l.State != StateReady:
		err := errNotUsable(&e.l)
		p.mu.Unlock()
		return Lease{}, err
	}
	if err := p.host.expireIfDueLocked(e, p.host.now()); err != nil {
		return Lease{}, err // past its TTL: expired now rather than paused
	}
	// The pause holds the lease from here: new requests (Use) wait for it.
	o := beginOpLocked(e, opPause)
	if e.unanswered > 0 {
		// Requests admitted before this pause (Use, use.go) are answered
		// first; new ones wait meanwhile, and they resume the lease once
		// it is paused.
		wctx, cancel := context.WithTimeout(ctx, p.requestGrace)
		err := p.awaitAnsweredLocked(wctx, e)
		cancel()
		if err != nil && ctx.Err() == nil {
			// The grace is up, not the caller's patience: pause now. A
			// request still unanswered waits (freeze) or fails (hibernate).
			p.log.Info("pausing with requests still unanswered after the grace", "lease_id", id, "grace", p.requestGrace)
			err = nil
		}
		if err == nil && e.l.State != StateReady { // released or expired meanwhile
			err = errNotUsable(&e.l)
		} else if err != nil {
			err = wrapf(err, "pause lease %s: waiting for the requests in flight", id)
		}
		if err != nil {
			p.host.endOpLocked(e, o, err)
			p.mu.Unlock()
			o.finish()
			return Lease{}, err
		}
	}
	p.markPausedLocked(e, mode, "")
	cid := e.l.ContainerID
	l, rev := e.snapshot()
	p.mu.Unlock()
	if err := p.host.persist(l, rev); err != nil {
		err = wrapf(err, "pause lease %s: write state", id)
		p.endPause(e, o, err)
		return Lease{}, err
	}
	return p.endPause(e, o, p.pauseRuntime(ctx, fr, id, cid, mode))
}

// pauseRuntime freezes (fr) or stops container cid of lease id.
func (p *pauser) pauseRuntime(ctx context.Context, fr runtime.Freezer, id, cid string, mode PauseMode) error {
	began := time.Now()
	rctx, cancel := detached(ctx, p.removeTimeout)
	defer cancel()
	var err error
	if mode == PauseFreeze {
		err = fr.Pause(rctx, cid)
	} else {
		err = p.hibernate(rctx, cid)
	}
	if err != nil {
		return wrapf(err, "pause lease %s (%s)", id, mode)
	}
	if mode == PauseHibernate {
		p.network.drop(ctx, id) // network.go: its address is free; wake applies the policy again
	}
	p.log.Info("lease paused", "lease_id", id, "container_id", cid, "mode", string(mode), "duration", time.Since(began))
	return nil
}

// idlePauseLocked pauses idle READY lease e as its IdlePolicy says (why:
// "idle for 5m0s"): the transition is made now, the runtime call is
// returned to run after the caller persisted e. Called with mu held.
func (p *pauser) idlePauseLocked(e *entry, why string) func(ctx context.Context) {
	mode := PauseMode(e.l.IdlePolicy)
	var fr runtime.Freezer
	if mode == PauseFreeze {
		var err error
		if fr, err = p.freezer(); err != nil {
			mode = PauseHibernate // the runtime changed since the acquire
		}
	}
	o := beginOpLocked(e, opPause)
	p.markPausedLocked(e, mode, why)
	id, cid := e.l.ID, e.l.ContainerID
	return func(ctx context.Context) {
		_, _ = p.endPause(e, o, p.pauseRuntime(ctx, fr, id, cid, mode))
	}
}

// idleEntryLocked returns lease id's entry once no pause, resume or
// snapshot holds it (opKind.pausing); an entry another operation holds is
// returned as it is (it is not READY or PAUSED: its caller refuses it).
// Called with mu held; on error it returns with mu released.
func (p *pauser) idleEntryLocked(ctx context.Context, id string) (*entry, error) {
	for {
		e := p.leases[id]
		if e == nil {
			p.mu.Unlock()
			return nil, errdefs.NotFound("lease %s", id)
		}
		o := e.op
		if o == nil || !o.kind.pausing() {
			return e, nil
		}
		p.mu.Unlock()
		if err := o.wait(ctx); err != nil {
			return nil, err
		}
		p.mu.Lock()
	}
}

// markPausedLocked moves READY e, which a pause holds, to PAUSED (why, if
// set, prefixes the reason). Called with mu held.
func (p *pauser) markPausedLocked(e *entry, mode PauseMode, why string) {
	reason := ReasonFrozen
	if mode == PauseHibernate {
		reason = ReasonHibernated
	}
	if why != "" {
		reason = why + "; " + reason
	}
	e.l.Paused, e.l.PausedAt = mode, p.host.now()
	_ = p.host.transitionLocked(e, StatePaused, reason)
}

// endPause finishes pause o on e: on error a lease still PAUSED goes back
// to READY (its sandbox was not paused).
func (p *pauser) endPause(e *entry, o *op, err error) (Lease, error) {
	p.mu.Lock()
	if err != nil && e.l.State == StatePaused {
		mode := e.l.Paused
		e.l.Paused, e.l.PausedAt = "", time.Time{}
		_ = p.host.transitionLocked(e, StateReady, fmt.Sprintf(reasonPauseFailedF, mode, err))
	}
	p.host.endOpLocked(e, o, err)
	l, rev := e.snapshot()
	p.mu.Unlock()
	_ = p.host.persist(l, rev)
	o.finish()
	if err != nil {
		return Lease{}, err
	}
	return l, nil
}

// Resume makes PAUSED lease id READY again: a frozen sandbox is thawed, a
// hibernated one started again in place (Runtime.Restart: files kept, agent
// ready; its endpoint is re-read). Concurrent calls share one resume. A
// READY lease is returned as it is; another state is
// errdefs.ErrFailedPrecondition, an unknown id errdefs.ErrNotFound. The
// resume counts as activity, and the TTL runs again from now (ExpiresAt is
// at least now + TTL). If the container is gone the lease fails; another
// runtime error leaves it PAUSED and is returned, as does a host mount
// that changed since the acquire (errdefs.ErrFailedPrecondition and
// runtime.ErrHostPathChanged: the container is not started). The READY state is
// written after the runtime acted: a crash in between leaves the lease
// PAUSED, and reconcile pauses the sandbox again.
func (m *Manager) Resume(ctx context.Context, id string) (Lease, error) {
	return m.pauser.resumeLease(ctx, id)
}

// resumeLease is Manager.Resume.
func (p *pauser) resumeLease(ctx context.Context, id string) (Lease, error) {
	p.mu.Lock()
	if err := p.host.enterLocked(); err != nil {
		p.mu.Unlock()
		return Lease{}, err
	}
	defer p.done()
	for {
		e := p.leases[id]
		if e == nil {
			p.mu.Unlock()
			return Lease{}, errdefs.NotFound("lease %s", id)
		}
		if o := e.op; o != nil && o.kind.pausing() {
			p.mu.Unlock()
			if o.kind == opResume { // share its outcome
				return o.outcome(ctx)
			}
			if err := o.wait(ctx); err != nil {
				return Lease{}, err
			}
			p.mu.Lock()
			continue
		}
		switch e.l.State {
		case StateReady:
			l := e.l.Clone()
			p.mu.Unlock()
			return l, nil
		case StatePaused:
			if err := p.drain.refusalLocked("resume lease " + id); err != nil { // drain.go
				p.mu.Unlock()
				return Lease{}, err
			}
		default:
			err := errNotUsable(&e.l)
			p.mu.Unlock()
			return Lease{}, err
		}
		o := beginOpLocked(e, opResume)
		mode, cid, mounts := e.l.Paused, e.l.ContainerID, slices.Clone(e.l.Mounts)
		p.mu.Unlock()
		return p.resume(ctx, e, o, mode, cid, mounts)
	}
}

// resume runs the runtime side of a resume and records its outcome. A
// hibernated sandbox's host mounts are checked before its container starts
// again (restartSandbox); when one changed, the resume is refused
// (FailedPrecondition) and the lease stays PAUSED.
func (p *pauser) resume(ctx context.Context, e *entry, o *op, mode PauseMode, cid string, mounts []runtime.Mount) (Lease, error) {
	began := time.Now()
	var (
		sb  runtime.Sandbox
		err error
	)
	if mode == PauseFreeze {
		var fr runtime.Freezer
		if fr, err = p.freezer(); err == nil {
			rctx, cancel := detached(ctx, p.removeTimeout)
			err = fr.Resume(rctx, cid)
			cancel()
		}
	} else {
		rctx, cancel := detached(ctx, p.readyTimeout+5*time.Second)
		// volumes.go: the host mounts are checked first.
		sb, err = p.vols.restartSandbox(rctx, e.l.ID, cid, mounts)
		if err == nil { // its address may have changed
			err = p.network.enforce(rctx, e.l.ID, sb.Endpoint) // network.go
		}
		cancel()
	}
	took := time.Since(began)

	p.mu.Lock()
	id := e.l.ID
	switch {
	case e.l.State != StatePaused: // released or expired meanwhile
		err = errNotUsable(&e.l)
	case err == nil:
		reason := ReasonThawed
		if mode == PauseHibernate {
			reason = ReasonWoken
			e.l.ContainerID, e.l.Endpoint = sb.ID, sb.Endpoint
		}
		now := p.host.now()
		e.l.Paused, e.l.PausedAt = "", time.Time{}
		e.l.LastActivityAt = now
		if exp := now.Add(e.l.TTL); e.l.ExpiresAt.Before(exp) {
			e.l.ExpiresAt = exp
		}
		_ = p.host.transitionLocked(e, StateReady, reason)
	case errdefs.IsNotFound(err):
		err = wrapf(err, "resume lease %s (%s)", id, mode)
		_ = p.host.transitionLocked(e, StateFailed, fmt.Sprintf("resume (%s) failed: %v", mode, err))
	default:
		err = wrapf(err, "resume lease %s (%s)", id, mode)
	}
	p.host.endOpLocked(e, o, err) // a failed lease's removal is queued
	l, rev := e.snapshot()
	p.mu.Unlock()
	_ = p.host.persist(l, rev)
	o.finish()
	if err != nil {
		p.log.Warn("resuming lease failed", "lease_id", id, "container_id", cid, "mode", string(mode), "err", err)
		return Lease{}, err
	}
	p.log.Info("lease resumed", "lease_id", id, "container_id", cid, "mode", string(mode), "duration", took)
	return l, nil
}

// pauseFix is a paused sandbox found running (reconcile, resync): it is
// paused again while o holds e (resumes wait).
type pauseFix struct {
	e       *entry
	o       *op
	id, cid string
	mode    PauseMode
}

// pauseFixLocked marks PAUSED e's running container cid for pausing again.
// Called with mu held.
func (p *pauser) pauseFixLocked(e *entry, cid string) pauseFix {
	o := beginOpLocked(e, opPause)
	return pauseFix{e: e, o: o, id: e.l.ID, cid: cid, mode: e.l.Paused}
}

// applyPauseFixes pauses again the sandboxes of PAUSED leases found
// running, then lets their resumes go on.
func (p *pauser) applyPauseFixes(ctx context.Context, fixes []pauseFix) {
	for _, f := range fixes {
		p.applyPauseFix(ctx, f)
		p.mu.Lock()
		p.host.endOpLocked(f.e, f.o, nil)
		p.mu.Unlock()
		f.o.finish()
	}
}

// applyPauseFix freezes (or, without a Freezer or for a hibernated lease,
// stops) f's running container; a failure is logged.
func (p *pauser) applyPauseFix(ctx context.Context, f pauseFix) {
	rctx, cancel := detached(ctx, p.removeTimeout)
	defer cancel()
	var err error
	if p.fr != nil && f.mode == PauseFreeze {
		err = p.fr.Pause(rctx, f.cid)
	} else {
		err = p.hibernate(rctx, f.cid)
	}
	if err != nil {
		p.log.Warn("pausing a paused lease's running sandbox again failed", "lease_id", f.id, "container_id", f.cid, "err", err)
		return
	}
	p.log.Info("paused a paused lease's running sandbox again", "lease_id", f.id, "container_id", f.cid, "mode", string(f.mode))
}

// holdForSnapshot implements snapshotLeases (snapshot.go): the snapshot
// holds the lease (opSnapshot), so pauses and resumes wait for it.
func (p *pauser) holdForSnapshot(ctx context.Context, id string) (Lease, func(), error) {
	p.mu.Lock()
	if err := p.host.enterLocked(); err != nil {
		p.mu.Unlock()
		return Lease{}, nil, err
	}
	e, err := p.idleEntryLocked(ctx, id) // unlocks mu on error
	if err != nil {
		p.done()
		return Lease{}, nil, err
	}
	if e.l.State != StateReady && e.l.State != StatePaused {
		err := errNotUsable(&e.l)
		p.mu.Unlock()
		p.done()
		return Lease{}, nil, err
	}
	// Pause and resume wait for the snapshot (work.go: opSnapshot).
	o := beginOpLocked(e, opSnapshot)
	l := e.l.Clone()
	p.mu.Unlock()
	release := func() {
		p.mu.Lock()
		p.host.endOpLocked(e, o, nil) // a lease released meanwhile is removed now
		p.mu.Unlock()
		o.finish()
		p.done()
	}
	return l, release, nil
}
