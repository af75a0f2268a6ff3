// Package lease is berth's lease manager: one lease per agent conversation,
// each holding one sandbox container. It owns the lease state machine, the
// embedded store, the reaper, and the reconciliation of stored leases with
// the containers the runtime reports. The gRPC/REST edge is a thin adapter
// over Manager; this package knows nothing about the wire.
//
// # Components
//
// The Manager keeps the lease records, the conversation index, the state
// machine and the store; each concern around them is a component with its
// own configuration (a field of Config with a DefaultXConfig, defaults and
// rules written once, embedded as is by the orchestrator's configuration)
// and a small interface back to the Manager, declared in its file:
//
//	acquire       Config          acquirer        acquire.go (Manager.Acquire), pool.go (claims)
//	admission     AdmissionConfig, NetworkConfig  limits.go, network.go
//	controller    Config          controller      reconcile.go, work.go, plan.go (reconcile, events, resync, workers, removals)
//	disk limit    DiskConfig      diskEnforcer    disk.go
//	drain         Config          drainer         drain.go (Manager.Drain, Manager.Draining)
//	events        -               hub             events.go (Manager.Subscribe)
//	fleet         FleetConfig     fleet           replicas.go
//	network       NetworkConfig   networkKeeper   network.go (enforcement of the policies)
//	pause, idle   PauseConfig     pauser          pause.go, use.go
//	warm pools    PoolsConfig     poolSet         pool.go
//	reaper        Config          reaper          reaper.go (expiry, idle pauses, removals' retries, purge)
//	restarts      RestartConfig   restarter       restart.go
//	snapshots     SnapshotConfig  snapshotKeeper  snapshot.go (Manager.Snapshots)
//	tokens        Secret          Tokens          token.go, sign.go (Manager.Tokens)
//	volumes       VolumeConfig    volumeKeeper    volumes.go (Manager.Volumes)
//
// The acquirer's configuration is Config's own acquire defaults and bounds
// (DefaultImage, DefaultTTL, MaxTTL, DefaultIdleTimeout); it goes through
// admission, volumes, snapshots (forks), the fleet and the warm pools.
// The reaper's is Config's ReapInterval and Retention (with
// FleetConfig.ActivityFlushInterval); it goes through the pauser (idle
// pauses), the disk limit (kept containers) and admission (the limit on
// ended records). The drainer's is Config.ReapConcurrency; the acquire
// path, the pauser and the warm pools ask it whether it is draining.
// The components share the Manager's mutex: a method named …Locked is
// called with it held, as on the Manager. Tokens (lease and agent tokens,
// signed URLs) is the exception: it needs only the secret (NewTokens),
// holds no state and no lock, and nothing of the Manager. The hub (the
// subscribers of lease events) has no configuration and needs nothing of
// the Manager but its mutex and logger.
//
// # State machine
//
//	             ┌──────────────── release, reap ────────────────┐
//	             │                                               ▼
//	acquire ─► PENDING ── sandbox ready ──► READY ── release ──► RELEASING ──► RELEASED
//	             │                          │  │     reap           (container removed)
//	             │                          │  └── ttl or idle timeout ──► EXPIRED
//	             └── create failed, ────────┴───── died past the restart ──► FAILED
//	                 restart during creation       budget, vanished, removed
//
// PENDING → READY | FAILED | RELEASING; READY → RELEASING | EXPIRED |
// FAILED | PENDING | PAUSED; PAUSED → READY | PAUSED | RELEASING | EXPIRED
// | FAILED; RELEASING → RELEASED | FAILED. RELEASED, EXPIRED and FAILED are
// ended and final. PENDING, READY, PAUSED and RELEASING are live (they
// count against AdmissionConfig.MaxLive).
//
// A Phase says what a lease is doing within its state where the state
// alone does not (state.go); it is persisted in Lease.Phase, and phases
// never add a state, so clients see the same states:
//
//	PENDING/restarting  READY → PENDING is only ever an in-place restart:
//	                    the lease's container exited unexpectedly and is
//	                    started again with its files (see Config.Restart);
//	                    left for READY, FAILED or RELEASING. An OOM kill of
//	                    one of its processes does not change the lease.
//	READY/claiming      a warm claim's READY record, written while the
//	                    pooled agent is configured (see Warm pools; the
//	                    lease is PENDING in memory meanwhile); loaded, the
//	                    phase is dropped (READY/claiming → READY) once
//	                    reconcile has asked the agent.
//	FAILED/kept         failed past the disk limit with the stopped
//	                    container kept for the operator (see Disk limit);
//	                    FAILED/kept → FAILED when it could not be stopped.
//
// The transition table (moves in state.go) is over (state, phase) places.
// A transition enters a state and a phase (PhaseNone unless it says
// otherwise); a phase change (READY/claiming → READY, FAILED/kept →
// FAILED) keeps the state and changes the phase only. Every transition is
// appended to Lease.Transitions with its reason, time and the phase it
// entered; the lease's State, Phase, Reason and UpdatedAt follow the last
// one. A phase change is checked against the same table but not recorded
// (the history and the events watchers get are those of state changes).
// An illegal transition or phase change is a bug and fails with
// errdefs.ErrFailedPrecondition. Records written before phases existed
// are read into them (Lease.UnmarshalJSON); a phase the table does not
// know with the record's state loads as none.
//
// READY ⇄ PAUSED is Manager.Pause and Manager.Resume (pause.go), at one of
// two depths recorded in Lease.Paused: PauseFreeze (the cgroup freezer,
// runtime.Freezer; memory and processes kept) or PauseHibernate (the
// container stopped, files kept, processes gone; resume restarts it in
// place). There is no intermediate state: the PAUSED record is written
// before the runtime pauses, the READY record after it resumed, and
// reconcile brings a PAUSED lease's container back to the recorded depth,
// so a crash in between leaves a paused lease that the next request
// resumes. A deliberate stop is never taken for a crash (a hibernated
// lease's stopped container is what plan expects). A PAUSED lease neither
// idle-expires nor runs out its TTL: it expires after
// Config.Pause.PausedRetention. PAUSED → PAUSED records a frozen sandbox found
// stopped after an engine restart (now hibernated).
//
// A lease reaches EXPIRED or FAILED first and loses its container right
// after: Lease.Cleaned records that the runtime confirmed the removal. A
// RELEASING lease becomes RELEASED only once its container is gone.
//
// # Conversations and tokens
//
// At most one PENDING, READY or PAUSED lease holds a conversation. Acquire
// returns it (to the same owner; a PAUSED one is resumed first) or creates one; concurrent acquires of one
// conversation share a single creation. Lease tokens (leaseID + "." +
// base64url HMAC-SHA256 of the lease id under the server secret) and agent
// tokens (a separate derivation) are derived, never stored, and verified in
// constant time (Tokens, Manager.Tokens).
//
// # Crash safety
//
// Every state change is written through to the Store (a bbolt file,
// fsync'd per transaction; the reaper batches its writes into one) outside
// the Manager's mutex, in revision order per lease. A PENDING record is written before the runtime is asked to create
// the container, and RELEASING before it is asked to remove one, so a crash
// at any point leaves a record that explains every container. Containers
// carry labels naming the lease and the orchestrator instance (see package
// runtime), which makes the runtime a second source of truth. The
// controller is level-based: Start, every runtime event and every resync
// observe a lease's containers as they are and apply the decision of one
// pure function, plan (plan.go), to the record and that observation.
//
// One operation runs on a lease at a time (work.go): a creation or warm
// claim, an in-place restart, a pause, resume, snapshot or pause fix, or a
// removal holds the lease (entry.op) while it runs. A caller that finds it
// held waits and shares the outcome (acquires join a creation, resumes a
// resume, removals a removal), or marks the lease dirty: events and
// resyncs never plan a held lease, and when its operation ends the lease
// goes to a work queue with client-go's semantics (queued once, never
// handled by two workers at once), whose Config.ReapConcurrency workers
// remove its container or look at it again. Runtime events, the reaper and
// releases feed the same queue.
//
// At Start that means: READY leases with a running container are adopted;
// READY leases whose container died are restarted in place (within the
// restart budget), as are PENDING leases that were restarting
// (PENDING/restarting); READY leases
// whose container vanished, and PENDING leases of a creation (a
// half-created sandbox is not trusted), become FAILED; RELEASING leases
// finish their release; every container of this instance that no adopted
// lease owns is removed. While running, the runtime's event stream restarts
// (or, past the budget, fails) leases whose containers die and fails those
// whose containers are removed, and periodic
// resyncs (also after every reconnect of the stream) catch what events miss
// and remove orphans. Activity times (Touch) are written lazily, at most
// every Config.Fleet.ActivityFlushInterval, so after a crash a lease may look a
// few seconds idler than it was.
//
// # Warm pools
//
// Config.Pools (PoolsConfig) keep sandboxes of a profile ready before any
// lease exists (pool.go, docs/pools.md). A pooled sandbox is created under
// a lease id allocated up front and labelled with its pool; an acquire of
// the pool's profile creates its lease with that id, so the container's
// labels name the lease, and the agent's one-shot Configure gives it the
// lease's env and secrets; the claim's READY record is written in
// PhaseClaiming while it runs (pool.go). Reconcile adopts unclaimed members (a pool
// label, no lease record) back into their pools, or removes them. Pooled
// sandboxes count against PoolsConfig.MaxPooled, not MaxLive, until
// claimed.
//
// # Reaper
//
// Every Config.ReapInterval the reaper expires READY leases past their TTL
// or idle timeout, queues containers due for removal for the
// Config.ReapConcurrency workers (a failed removal is retried with backoff),
// writes pending activity times, and purges ended, cleaned records older
// than Config.Retention. It holds the mutex only for in-memory updates, so
// Acquire never waits on it.
//
// # Disk limit
//
// READY leases with Resources.DiskBytes are measured (Runtime.Usage) every
// Config.Disk.Interval, adaptively and at most Config.Disk.Concurrency at
// once (disk.go). Over the limit a lease gets a warning (Lease.Warnings;
// the proxy refuses uploads); still over after Config.Disk.Grace it goes
// FAILED/kept ("disk limit exceeded (X > Y bytes)") and its container is
// stopped but kept until Config.Retention has passed, for an
// operator to copy the files out: reconcile, resync and the reaper leave it
// alone until then.
package lease
