package lease

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Runtime is the subset of runtime.Runtime the Manager uses; every
// runtime.Runtime satisfies it, and tests fake exactly this.
type Runtime interface {
	// Create creates, starts and waits for the readiness of a sandbox.
	Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error)
	// Get returns one sandbox (errdefs.ErrNotFound when there is none).
	Get(ctx context.Context, id string) (runtime.Sandbox, error)
	// List returns the berth-managed sandboxes matching sel.
	List(ctx context.Context, sel runtime.Selector) ([]runtime.Sandbox, error)
	// Remove force-removes a sandbox; a missing one is success.
	Remove(ctx context.Context, id string) error
	// Watch delivers sandbox events until ctx ends or the backend fails.
	Watch(ctx context.Context) (<-chan runtime.Event, error)
	// Restart starts an exited sandbox again in place (files kept) and
	// waits for its agent.
	Restart(ctx context.Context, id string) (runtime.Sandbox, error)
	// Stop stops a sandbox (SIGTERM, grace, SIGKILL), keeping its files.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Usage measures a sandbox's disk usage (the disk limit's enforcement).
	Usage(ctx context.Context, id string) (runtime.Usage, error)
}

var _ Runtime = runtime.Runtime(nil)

// Config configures a Manager. Zero fields take the documented defaults.
type Config struct {
	// Store persists leases. Required. The Manager does not close it.
	Store Store
	// Runtime creates and removes sandboxes. Required.
	Runtime Runtime
	// InstanceID names this orchestrator instance; it is put on every
	// container (runtime.LabelInstance) and reconcile only touches containers
	// that carry it. Default "default". Two orchestrators sharing a container
	// engine must use different ids.
	InstanceID string
	// Secret is the server secret lease and agent tokens and URL
	// signatures are derived from (Manager.Tokens; see LoadOrCreateSecret). Required, at least MinSecretLen bytes.
	Secret []byte
	// DefaultImage is used when an acquire names no image. Default "berth/base".
	DefaultImage string
	// DefaultTTL is the lifetime of a lease acquired without a TTL. Default 10m.
	DefaultTTL time.Duration
	// MaxTTL bounds the TTL of acquire and renew. Default 24h.
	MaxTTL time.Duration
	// DefaultIdleTimeout applies when an acquire gives none. Default 0: no
	// idle timeout.
	DefaultIdleTimeout time.Duration
	// Admission configures what an acquire may ask for (image, user,
	// resources, sizes) and how many live leases, and ended records, there
	// may be (limits.go). Zero fields take DefaultAdmissionConfig's.
	Admission AdmissionConfig
	// Snapshots configures snapshots (snapshot.go): the limits on one
	// owner's snapshots. Default no limit (DefaultSnapshotConfig).
	Snapshots SnapshotConfig
	// Retention is how long ended lease records are kept (for Get, List and
	// debugging) before they are purged. Default 1h; negative keeps them
	// forever.
	Retention time.Duration
	// Pause configures pausing: the default idle policy and how long a
	// lease may stay PAUSED (pause.go). Zero fields take
	// DefaultPauseConfig's.
	Pause PauseConfig
	// Fleet configures serving one fleet with other replicas: the
	// election of the replica that runs the reaper, and the writes of
	// activity (replicas.go). Zero fields take DefaultFleetConfig's.
	Fleet FleetConfig
	// ReapInterval is how often the reaper looks for expired and idle leases
	// and retries failed removals. Default 200ms.
	ReapInterval time.Duration
	// ReapConcurrency is the number of workers that remove containers and
	// look at leases again after runtime events (work.go), and bounds the
	// removals Reap runs at once. Default 4.
	ReapConcurrency int
	// ReadyTimeout bounds the creation of one sandbox (create, inject, start,
	// agent healthy); it is passed to the runtime as Spec.ReadyTimeout.
	// Default 30s.
	ReadyTimeout time.Duration
	// AppPort is the port the app of a lease with one (AcquireRequest.App)
	// listens on inside the sandbox. Default 8000 (the OpenHands
	// agent-server's).
	AppPort int
	// RemoveTimeout bounds the removal of one sandbox. Default 30s.
	RemoveTimeout time.Duration
	// ResyncInterval is how often the live leases are compared with the
	// runtime's container list even when the event watch is healthy (a
	// resync also follows every watch reconnect). Default 30s.
	ResyncInterval time.Duration
	// Disk configures the enforcement of the disk limit where the engine
	// cannot enforce it (disk.go); zero fields take DefaultDiskConfig's.
	Disk DiskConfig
	// Restart configures the in-place restart of a sandbox whose container
	// exited unexpectedly: its budget and delay (restart.go). Zero fields
	// take DefaultRestartConfig's.
	Restart RestartConfig
	// Pools configures the warm pools (pool.go, docs/pools.md): sandboxes
	// of a profile kept ready for acquires of that profile to claim.
	// Default none (DefaultPoolsConfig).
	Pools PoolsConfig
	// Volumes configures workspace volumes and host mounts (volumes.go).
	Volumes VolumeConfig
	// Network configures leases' network policies: their enforcement, the
	// default policy and the operator's ceiling (network.go). Zero fields
	// take DefaultNetworkConfig's.
	Network NetworkConfig
	// Logger receives the Manager's logs (keys lease_id, container_id,
	// conversation_id, state, reason). Default: discard.
	Logger *slog.Logger
	// Now is the clock for lease times. Default time.Now. Timers (reaper,
	// backoff) always run on the real clock.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if c.Store == nil {
		return errdefs.InvalidArgument("store", "required")
	}
	if c.Runtime == nil {
		return errdefs.InvalidArgument("runtime", "required")
	}
	if len(c.Secret) < MinSecretLen {
		return errdefs.InvalidArgument("secret", "must be at least %d bytes", MinSecretLen)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.InstanceID == "" {
		c.InstanceID = "default"
	}
	if c.DefaultImage == "" {
		c.DefaultImage = "berth/base"
	}
	def(&c.DefaultTTL, 10*time.Minute)
	def(&c.MaxTTL, 24*time.Hour)
	def(&c.Retention, time.Hour)
	var err error
	if c.Pause, err = c.Pause.withDefaults(); err != nil { // pause.go
		return err
	}
	if err := c.Pause.checkRuntime(c.Runtime); err != nil {
		return err
	}
	def(&c.ReapInterval, 200*time.Millisecond)
	if c.ReapConcurrency <= 0 {
		c.ReapConcurrency = 4
	}
	def(&c.ReadyTimeout, 30*time.Second)
	if c.AppPort == 0 {
		c.AppPort = DefaultAppPort
	}
	def(&c.RemoveTimeout, 30*time.Second)
	def(&c.ResyncInterval, 30*time.Second)
	if c.Fleet, err = c.Fleet.withDefaults(); err != nil { // replicas.go
		return err
	}
	if c.Restart, err = c.Restart.withDefaults(); err != nil { // restart.go
		return err
	}
	if c.Pools, err = c.Pools.withDefaults(); err != nil { // pool.go
		return err
	}
	if c.Volumes, err = c.Volumes.withDefaults(); err != nil { // volumes.go
		return err
	}
	if c.Snapshots, err = c.Snapshots.withDefaults(); err != nil { // snapshot.go
		return err
	}
	if c.Disk, err = c.Disk.withDefaults(); err != nil { // disk.go
		return err
	}
	if c.Admission, err = c.Admission.withDefaults(); err != nil { // limits.go
		return err
	}
	if c.Network, err = c.Network.withDefaults(); err != nil { // network.go
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case c.DefaultTTL < 0 || c.MaxTTL < 0 || c.DefaultIdleTimeout < 0:
		return errdefs.InvalidArgument("ttl", "durations must not be negative")
	case c.DefaultTTL > c.MaxTTL:
		return errdefs.InvalidArgument("default_ttl", "%s exceeds max ttl %s", c.DefaultTTL, c.MaxTTL)
	case c.ReapInterval < 0 || c.ReadyTimeout < 0 || c.RemoveTimeout < 0 || c.ResyncInterval < 0:
		return errdefs.InvalidArgument("interval", "durations must not be negative")
	}
	return nil
}

// Manager owns the leases of one orchestrator instance: it creates their
// sandboxes, tracks their states, persists them, expires and reaps them, and
// reconciles them with the runtime. Create it with New, then call Start
// before anything else; all methods are safe for concurrent use.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	rt    Runtime
	store Store
	// tokens derives and checks lease and agent tokens and URL
	// signatures from Config.Secret (token.go, sign.go).
	tokens *Tokens
	// fleet is this replica's part in a fleet sharing the store, and the
	// election of the reaper (replicas.go).
	fleet *fleet

	mu     sync.Mutex
	leases map[string]*entry // every record, live and ended
	byConv map[string]*entry // convKey(owner, conversation id) → its PENDING or READY lease
	// hub holds the subscribers of lease events (events.go).
	hub     *hub
	counts  map[State]int    // current records by state
	entered map[State]uint64 // transitions into each state since New
	// restarter restarts sandboxes whose container exited in place
	// (restart.go); its counters and queue are guarded by mu.
	restarter *restarter
	seq       uint64 // bumped when a lease becomes READY (resync races)
	started   bool
	closed    bool
	runCtx    context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup // background loops and detached work
	// queue holds the leases for the workers: removals and second looks
	// (work.go).
	queue *workQueue
	// ctrl reconciles the records with the runtime and runs the workers
	// (reconcile.go, work.go).
	ctrl *controller

	// pools are the warm pools (pool.go), guarded by mu.
	pools *poolSet

	vols *volumeKeeper // workspace volumes and host mounts (volumes.go)

	snaps *snapshotKeeper // snapshots and forks (snapshot.go)

	disk *diskEnforcer // the disk limit (disk.go)

	pauser *pauser    // pause, resume and Use (pause.go, use.go)
	admit  *admission // acquire checks and live-lease limits (limits.go)
	// network enforces the leases' network policies (network.go).
	network *networkKeeper
	acq     *acquirer // the acquire path (acquire.go)

	drain  *drainer // Drain and the draining flag (drain.go)
	reaper *reaper  // expiry, idle pauses, removals' retries, purge (reaper.go)

	pmu       sync.Mutex        // serialises store writes
	persisted map[string]uint64 // lease id → revision last written
	commits   groupCommit       // batches concurrent persist calls (persist.go)
}

// entry is the in-memory record of one lease plus bookkeeping that is not
// persisted. Guarded by Manager.mu.
type entry struct {
	l   Lease
	rev uint64 // bumped on every change; store writes are applied in rev order

	// op is the operation holding the lease, nil when none (work.go).
	op *op
	// dirty: a pass of the controller (event, resync) found the lease
	// held, or a removal was asked for meanwhile; the lease is queued
	// when op ends (work.go). event is the runtime event that made it
	// dirty, if any: the worker's check uses it.
	dirty    bool
	event    *runtime.Event
	retryAt  time.Time     // earliest next removal attempt after a failure (real clock)
	fails    int           // consecutive removal failures
	ended    chan struct{} // closed when the lease reaches an ended state
	readySeq uint64        // Manager.seq when it became READY

	activityDirty   bool      // LastActivityAt changed since the last write
	activityWritten time.Time // real-clock time of the last activity write

	// uses counts the requests Use admitted that have not ended,
	// unanswered those not yet answered; drained, when set, is closed
	// when unanswered drops to 0 (a Pause waits on it). use.go.
	uses, unanswered int
	drained          chan struct{}

	// secrets are the acquire's Secrets until the sandbox is created with
	// them; never persisted (the lease records only their names).
	secrets map[string]string
}

// New validates cfg, applies defaults and returns a Manager. It does no I/O;
// call Start.
func New(cfg Config) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	cfg.Secret = bytes.Clone(cfg.Secret)
	tokens, err := NewTokens(cfg.Secret) // token.go
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:       cfg,
		log:       cfg.Logger,
		rt:        cfg.Runtime,
		store:     cfg.Store,
		tokens:    tokens,
		leases:    map[string]*entry{},
		byConv:    map[string]*entry{},
		counts:    map[State]int{},
		entered:   map[State]uint64{},
		persisted: map[string]uint64{},
		queue:     newWorkQueue(),
	}
	m.hub = newHub(cfg.Logger, &m.mu)                                                          // events.go
	m.network = &networkKeeper{cfg: cfg.Network, log: cfg.Logger, mu: &m.mu, leases: m.leases} // network.go
	m.admit = newAdmission(cfg, m, m.leases, m.counts)                                         // limits.go
	m.disk = newDiskEnforcer(cfg, m, m.hub, &m.mu, m.leases)                                   // disk.go
	m.vols = newVolumeKeeper(cfg.Volumes, cfg.InstanceID, cfg.RemoveTimeout, cfg.Runtime, cfg.Store, cfg.Logger, m.now, m, m.leases, &m.mu)
	m.restarter = &restarter{cfg: cfg.Restart, host: m, log: cfg.Logger, readyTimeout: cfg.ReadyTimeout,
		goBackground: m.goBackground, mu: &m.mu, network: m.network, vols: m.vols}
	m.pauser = newPauser(cfg, m, m.wg.Done, m.disk.chargedLocked, m.vols, &m.mu, m.leases)               // pause.go
	m.snaps = newSnapshotKeeper(cfg.Snapshots, cfg.InstanceID, cfg.Runtime, cfg.Logger, m.now, m.pauser) // snapshot.go
	// The acquire path (acquire.go); its fleet and pools are set below.
	m.acq = newAcquirer(cfg, m, m.wg.Done, m.admit, m.vols, m.snaps, &m.mu, m.leases, m.byConv, m.counts)
	fl, err := newFleet(cfg, m, m.acq.startCreateID, &m.mu, m.leases, m.byConv) // replicas.go
	if err != nil {
		return nil, err
	}
	m.fleet = fl
	pools, err := newPoolSet(cfg, m, m.acq.validate, &m.mu, m.leases, &m.seq, &m.closed) // pool.go
	if err != nil {
		return nil, err
	}
	m.pools = pools
	m.acq.fleet, m.acq.pools = fl, pools
	pools.fleet, fl.releaseClaim = fl, pools.releaseClaim // poolshared.go
	m.acq.network, m.pools.network, m.pauser.network = m.network, m.network, m.network
	m.acq.queue, m.disk.queue, m.disk.fleet = m.queue, m.queue, fl
	m.acq.tokens = tokens
	m.drain = newDrainer(cfg, m, m.wg.Done, &m.mu, m.leases, fl, pools) // drain.go
	m.acq.drain, m.pauser.drain, m.pools.drain = m.drain, m.drain, m.drain
	m.reaper = newReaper(cfg, m, m.goBackground, &m.mu, m.leases, m.pauser, m.disk, m.admit) // reaper.go
	m.reaper.queue = m.queue
	m.ctrl = &controller{cfg: cfg, host: m, rt: cfg.Runtime, log: cfg.Logger, mu: &m.mu, leases: m.leases, seq: &m.seq, queue: m.queue,
		fleet: m.fleet, pools: m.pools, disk: m.disk, restarter: m.restarter, pauser: m.pauser, vols: m.vols, network: m.network} // reconcile.go
	m.pools.removeContainers = m.ctrl.removeContainers
	m.restarter.watchDown = &m.ctrl.watchDown
	return m, nil
}

// Config returns the Manager's configuration with defaults applied. It
// includes the Secret: do not log it whole.
func (m *Manager) Config() Config { return m.cfg }

// Start loads every lease from the store, reconciles them with the
// runtime's containers (see the package documentation) and starts the
// background loops — reaper, removal workers, runtime event watch with
// resync, purge — which run until ctx ends. It returns once reconcile is
// done; an error (store unreadable, runtime unreachable) leaves the Manager
// unusable. Call Close after ctx ends (or instead of cancelling it) to wait
// for the loops.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.started || m.closed {
		m.mu.Unlock()
		return errdefs.FailedPrecondition("lease manager already started")
	}
	m.started = true
	m.mu.Unlock()

	m.vols.hostMountPolicy() // volumes.go: resolve the prefixes now, before any sandbox runs
	if err := m.load(); err != nil {
		return err
	}
	if err := m.ctrl.reconcile(ctx); err != nil {
		return err
	}
	m.network.reapply(ctx) // network.go

	runCtx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	m.runCtx, m.cancel = runCtx, cancel
	m.reaper.runCtx = runCtx
	m.mu.Unlock()
	m.goBackground(func() { m.fleet.runReaper(runCtx, m.reaper.loop) }) // replicas.go: FleetConfig.Elect
	m.fleet.start(runCtx)                                               // replicas.go: a SharedStore's feed
	m.goBackground(func() { m.ctrl.watchLoop(runCtx) })
	m.restarter.startQueued(runCtx) // restart.go
	m.goBackground(func() { m.disk.loop(runCtx) })
	m.goBackground(func() { m.vols.volumeLoop(runCtx) })
	m.goBackground(func() { m.pools.loop(runCtx) })
	m.goBackground(func() {
		<-runCtx.Done()
		m.queue.shutDown()
	})
	for range m.cfg.ReapConcurrency {
		m.goBackground(func() { m.ctrl.work(runCtx) }) // work.go
	}
	m.mu.Lock()
	leases, live := len(m.leases), m.admit.liveCountLocked()
	m.mu.Unlock()
	m.log.Info("lease manager started", "instance", m.cfg.InstanceID, "leases", leases, "live", live)
	return nil
}

// Close stops accepting acquires, stops the background loops and waits for
// them and for in-flight creations and removals (each bounded by
// ReadyTimeout or RemoveTimeout). It does not release leases — their
// sandboxes keep running and are adopted by the next Start — and does not
// close the Store.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	cancel := m.cancel
	m.hub.closeLocked() // events.go: closes the subscribers
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	m.queue.shutDown()
	m.wg.Wait()
	return nil
}

func (m *Manager) goBackground(f func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
}

// enterLocked admits a call that will write to the store or the runtime
// after releasing mu: Close waits for it (m.wg.Done when it returns).
// Called with mu held.
func (m *Manager) enterLocked() error {
	if err := m.usableLocked(); err != nil {
		return err
	}
	m.wg.Add(1)
	return nil
}

// usableLocked reports whether the Manager accepts calls. Called with mu held.
func (m *Manager) usableLocked() error {
	switch {
	case m.closed:
		return errdefs.Unavailable("lease manager is shut down")
	case m.runCtx == nil:
		return errdefs.Unavailable("lease manager is not started")
	}
	return nil
}

// now is the lease clock in UTC, without a monotonic reading, so in-memory
// times compare exactly like the persisted ones.
func (m *Manager) now() time.Time { return m.cfg.Now().UTC() }

// load reads every record into memory.
func (m *Manager) load() error {
	var all []Lease
	if err := m.store.ForEach(func(l Lease) error {
		all = append(all, l)
		return nil
	}); err != nil {
		return fmt.Errorf("lease manager: load leases: %w", err)
	}
	var rewrite []snap // ended records that still carry env
	defer func() { m.persistAll(rewrite) }()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range all {
		if !l.State.Valid() {
			m.log.Warn("skipping lease record with unknown state", "lease_id", l.ID, "state", string(l.State))
			continue
		}
		e := &entry{l: l, ended: make(chan struct{})}
		if !(place{l.State, l.Phase}).admitted() {
			// A phase this version does not know (or not with this state).
			m.log.Warn("lease record in an unknown phase; taken as none", "lease_id", l.ID, "state", string(l.State), "phase", string(l.Phase))
			e.l.Phase = PhaseNone
		}
		if l.State.Ended() {
			close(e.ended)
		}
		if l.State.Ended() && l.Env != nil {
			// Records written before env was dropped at the end of a lease.
			e.l.Env = nil
			e.rev++
			rewrite = append(rewrite, snap{e.l.Clone(), e.rev})
		}
		m.leases[l.ID] = e
		m.counts[l.State]++
		m.admit.trackLiveLocked(l.Owner, StateUnspecified, l.State)
		m.persisted[l.ID] = 0
		if holdsConversation(l.State) {
			key := convKey(l.Owner, l.ConversationID)
			if other := m.byConv[key]; other != nil {
				m.log.Warn("two live leases for one conversation in the store", "conversation_id", l.ConversationID, "lease_id", l.ID, "other_lease_id", other.l.ID)
				if other.l.CreatedAt.After(l.CreatedAt) {
					continue
				}
			}
			m.byConv[key] = e
		}
	}
	return nil
}

// transitionLocked moves e to state to in PhaseNone: see
// transitionPhaseLocked.
func (m *Manager) transitionLocked(e *entry, to State, reason string) error {
	return m.transitionPhaseLocked(e, to, PhaseNone, reason)
}

// transitionPhaseLocked moves e to state to in phase p (Lease.TransitionPhase)
// and does the bookkeeping: counters, the conversation index, the ended
// channel, subscribers. The caller holds mu and persists e afterwards
// (outside mu).
func (m *Manager) transitionPhaseLocked(e *entry, to State, p Phase, reason string) error {
	from, fromPhase := e.l.State, e.l.Phase
	t, err := e.l.TransitionPhase(to, p, reason, m.now())
	if err != nil {
		m.log.Error("illegal lease transition", "lease_id", e.l.ID, "from", from.String(), "from_phase", fromPhase.String(),
			"to", to.String(), "phase", p.String(), "reason", reason)
		return err
	}
	e.rev++
	m.counts[from]--
	m.counts[to]++
	m.entered[to]++
	m.admit.trackLiveLocked(e.l.Owner, from, to)
	if to == StateReady || to == StatePaused { // resync races (reconcile.go)
		m.seq++
		e.readySeq = m.seq
	}
	if key := convKey(e.l.Owner, e.l.ConversationID); !holdsConversation(to) && m.byConv[key] == e {
		delete(m.byConv, key)
	}
	if to.Ended() {
		close(e.ended)
		e.l.Env = nil // no longer needed, and it may be large or secret
	}
	if holdsConversation(from) && !holdsConversation(to) {
		m.fleet.unlockConversation(e.l.Owner, e.l.ConversationID, e.l.ID) // replicas.go
	}
	m.log.Info("lease transition", "lease_id", e.l.ID, "conversation_id", e.l.ConversationID, "container_id", e.l.ContainerID,
		"from", from.String(), "state", to.String(), "phase", p.String(), "reason", reason)
	m.hub.emitLocked(e, &t)
	return nil
}

// setPhaseLocked changes e's phase within its state (Lease.SetPhase: not
// a transition, so no counter, index or subscriber is concerned) and bumps
// e's revision when it changed. The caller holds mu and persists e
// afterwards (outside mu).
func (m *Manager) setPhaseLocked(e *entry, p Phase) error {
	from := e.l.Phase
	if err := e.l.SetPhase(p); err != nil {
		m.log.Error("illegal lease phase change", "lease_id", e.l.ID, "state", e.l.State.String(), "from", from.String(), "phase", p.String())
		return err
	}
	if from != p {
		e.rev++
		m.log.Info("lease phase change", "lease_id", e.l.ID, "state", e.l.State.String(), "from", from.String(), "phase", p.String())
	}
	return nil
}

// snapshot returns what persist needs. Called with mu held.
func (e *entry) snapshot() (Lease, uint64) { return e.l.Clone(), e.rev }

type snap struct {
	l   Lease
	rev uint64
}

// persistAll writes a batch of snapshots in one store transaction (one
// fsync), skipping those already superseded.
func (m *Manager) persistAll(snaps []snap) {
	if len(snaps) == 0 {
		return
	}
	m.pmu.Lock()
	defer m.pmu.Unlock()
	var ls []Lease
	for _, s := range snaps {
		if last, ok := m.persisted[s.l.ID]; !ok || last < s.rev {
			ls = append(ls, s.l)
		}
	}
	if len(ls) == 0 {
		return
	}
	if err := m.store.PutAll(ls); err != nil {
		m.log.Error("persist leases", "count", len(ls), "err", err)
		return
	}
	for _, s := range snaps {
		m.persisted[s.l.ID] = max(m.persisted[s.l.ID], s.rev)
	}
}

// Stats are counts for metrics.
type Stats struct {
	// ByState counts the records held, live and ended (not yet purged).
	ByState map[State]int
	// Live is the number of live leases; MaxLive the limit (negative: none).
	Live    int
	MaxLive int
	// Transitions counts transitions into each state since the Manager was
	// created (a Prometheus counter).
	Transitions map[State]uint64
	// Created counts leases created since the Manager was created.
	Created uint64
	// Uncleaned counts ended leases whose container is not yet confirmed removed.
	Uncleaned int
	// OOMEvents counts the runtime's oom events since New: a process in a
	// sandbox was OOM-killed (the lease is not affected).
	OOMEvents uint64
	// Restarts counts in-place sandbox restarts started since New;
	// RestartFailures those that failed (the lease then failed).
	Restarts, RestartFailures uint64
}

// Stats returns current counts.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Stats{ByState: map[State]int{}, Transitions: map[State]uint64{}, Live: m.admit.liveCountLocked(), MaxLive: m.cfg.Admission.MaxLive, Created: m.acq.created,
		OOMEvents: m.ctrl.oomEvents, Restarts: m.restarter.started, RestartFailures: m.restarter.failed}
	for _, st := range States {
		s.ByState[st] = m.counts[st]
		s.Transitions[st] = m.entered[st]
	}
	for _, e := range m.leases {
		if e.l.State.Ended() && !e.l.Cleaned {
			s.Uncleaned++
		}
	}
	return s
}

// Get returns a copy of one lease; errdefs.ErrNotFound if there is none
// (never was, or purged after Config.Retention).
func (m *Manager) Get(ctx context.Context, id string) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.leases[id]
	if e == nil {
		return Lease{}, errdefs.NotFound("lease %s", id)
	}
	return e.l.Clone(), nil
}

// Route is what the proxy needs to forward a request to a lease's sandbox.
type Route struct {
	// State is the lease's state; only READY leases should be proxied to.
	State State
	// Reason is the reason of the last transition (for error messages).
	Reason string
	// Owner is the lease's owner.
	Owner string
	// Endpoint is the agent's host:port.
	Endpoint string
	// PublicPorts are preview ports served without a token (shared; do not
	// modify).
	PublicPorts []int
	// DiskLimit is the lease's disk limit in bytes (0: none); DiskUsed the
	// last measured usage plus what uploads added since (see ChargeDisk).
	// The proxy refuses uploads past DiskLimit-DiskUsed.
	DiskLimit, DiskUsed int64
	// App says the lease runs an app (Lease.App).
	App bool
}

// Route returns the routing facts of lease id without copying the whole
// lease (cheap enough for every proxied request); errdefs.ErrNotFound if
// there is no such lease. It does not record activity: call Touch.
func (m *Manager) Route(id string) (Route, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.leases[id]
	if e == nil {
		return Route{}, errdefs.NotFound("lease %s", id)
	}
	return routeLocked(e, m.disk.chargedLocked(e)), nil
}

// Touch records activity on a live lease (the proxy calls it per request):
// it sets LastActivityAt to now in memory, which postpones the idle timeout.
// The store is written lazily by the reaper, at most once per
// FleetConfig.ActivityFlushInterval per lease. Unknown or ended leases are
// ignored. Touch never blocks on I/O.
func (m *Manager) Touch(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.leases[id]; e != nil && e.l.State == StateReady {
		e.l.LastActivityAt = m.now()
		e.activityDirty = true
	}
}

// errNotUsable formats the precondition error for a lease in the wrong state.
func errNotUsable(l *Lease) error {
	return errdefs.FailedPrecondition("lease %s is %s: %s", l.ID, l.State, l.Reason)
}

// detached returns a context for runtime work that must finish even if the
// caller goes away: it keeps ctx's values, drops its cancellation, and has
// its own timeout.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
