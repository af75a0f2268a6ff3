package lease

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// State is where a lease is in its life. The string values are persisted and
// match the suffix of the proto enum (LEASE_STATE_<State>).
type State string

// Lease states. See the package documentation for the state machine.
const (
	// StateUnspecified is the zero State; it is the From of a lease's first
	// transition (its creation) and is never a lease's current state.
	StateUnspecified State = ""
	// StatePending: the sandbox is being created, or restarted in place
	// after its container exited (from READY; see Manager).
	StatePending State = "PENDING"
	// StateReady: the sandbox's agent answers; the lease can be used.
	StateReady State = "READY"
	// StatePaused: the sandbox is paused (Lease.Paused says how: frozen in
	// memory, or hibernated with its container stopped and files kept);
	// Manager.Resume, a proxied request or an acquire of its conversation
	// makes it READY again. It does not idle-expire; it expires after
	// Config.Pause.PausedRetention.
	StatePaused State = "PAUSED"
	// StateReleasing: the sandbox is being removed after a release or reap.
	StateReleasing State = "RELEASING"
	// StateReleased: released by a caller or operator; the sandbox is gone.
	StateReleased State = "RELEASED"
	// StateExpired: the TTL or idle timeout passed; the sandbox is removed
	// right after (see Lease.Cleaned).
	StateExpired State = "EXPIRED"
	// StateFailed: the sandbox failed to start, died or vanished; what is
	// left of it is removed right after (see Lease.Cleaned).
	StateFailed State = "FAILED"
)

// States lists every state a lease can be in, in life order.
var States = []State{StatePending, StateReady, StatePaused, StateReleasing, StateReleased, StateExpired, StateFailed}

// Phase says what a lease is doing within its State where the State alone
// does not: restarting, claiming, kept. A phase never adds a State (the
// API's state enum stays as it is); it is persisted (Lease.Phase) and
// recorded in the Transition that enters it. Each phase accompanies only
// the states named on its constant; the transition table (moves) says how
// it is entered and left.
type Phase string

// Lease phases. See the package documentation for the state machine.
const (
	// PhaseNone: the State says it all. Every state admits it, and a
	// transition enters it unless it names another phase.
	PhaseNone Phase = ""
	// PhaseRestarting accompanies PENDING: the lease's container exited
	// unexpectedly and is being started again in place (files kept), not
	// created. It is the only way from READY to PENDING (READY →
	// PENDING/restarting, the reason saying how the container ended) and
	// is left for READY ("restarted after …"), FAILED or RELEASING.
	PhaseRestarting Phase = "restarting"
	// PhaseClaiming accompanies READY in a warm claim's record: the claim
	// writes its READY record with it (PENDING → READY/claiming) while the
	// pooled sandbox's agent is still being configured, the lease staying
	// PENDING in memory until the agent is configured and the record
	// durable; the next record is READY without it (pool.go). The home
	// replica's restart that loads it asks the agent whether Configure
	// happened, fails the lease when not, and drops the phase either way
	// (READY/claiming → READY, a phase change); another replica drops it
	// when it reads the record, or moves on from it like READY.
	PhaseClaiming Phase = "claiming"
	// PhaseKept accompanies FAILED: the lease failed with its container
	// stopped but kept, files intact, for an operator to copy out (a
	// sandbox stopped past its disk limit: READY → FAILED/kept, disk.go).
	// The container is removed once Config.Retention has passed since
	// EndedAt (1h when Retention keeps records forever); the phase stays
	// after that, Lease.Cleaned saying the container is gone. A container
	// that could not be stopped is removed at once instead (FAILED/kept →
	// FAILED, a phase change).
	PhaseKept Phase = "kept"
)

// Phases lists every phase, PhaseNone first.
var Phases = []Phase{PhaseNone, PhaseRestarting, PhaseClaiming, PhaseKept}

// String returns the phase's name ("restarting"), or "none" for PhaseNone.
func (p Phase) String() string {
	if p == PhaseNone {
		return "none"
	}
	return string(p)
}

// place is where a lease is in the state machine: its state and phase.
type place struct {
	state State
	phase Phase
}

func (p place) String() string {
	if p.phase == PhaseNone {
		return p.state.String()
	}
	return p.state.String() + "/" + string(p.phase)
}

// moves is the transition table, over (state, phase) places. A move to
// another place of the same state (only the phase changes) is a phase
// change, made by Lease.SetPhase; every other move is a transition, made
// by Lease.Transition or Lease.TransitionPhase (PAUSED → PAUSED included).
// A place not listed (a phase its state does not admit) cannot be entered;
// ended places have no transition out.
var moves = map[place][]place{
	{StateUnspecified, PhaseNone}: {{StatePending, PhaseNone}},
	{StatePending, PhaseNone}: {
		{StateReady, PhaseNone}, {StateReady, PhaseClaiming}, {StateFailed, PhaseNone}, {StateReleasing, PhaseNone},
	},
	{StatePending, PhaseRestarting}: {{StateReady, PhaseNone}, {StateFailed, PhaseNone}, {StateReleasing, PhaseNone}},
	{StateReady, PhaseNone}: {
		{StatePending, PhaseRestarting}, {StatePaused, PhaseNone}, {StateReleasing, PhaseNone},
		{StateExpired, PhaseNone}, {StateFailed, PhaseNone}, {StateFailed, PhaseKept},
	},
	// A claim's record is READY/claiming; loaded by a replica that is not
	// its home it may stay so in memory, and moves on like READY.
	{StateReady, PhaseClaiming}: {
		{StateReady, PhaseNone}, {StatePending, PhaseRestarting}, {StatePaused, PhaseNone}, {StateReleasing, PhaseNone},
		{StateExpired, PhaseNone}, {StateFailed, PhaseNone}, {StateFailed, PhaseKept},
	},
	// PAUSED → PAUSED records a frozen sandbox found stopped (now hibernated).
	{StatePaused, PhaseNone}: {
		{StateReady, PhaseNone}, {StatePaused, PhaseNone}, {StateReleasing, PhaseNone}, {StateExpired, PhaseNone}, {StateFailed, PhaseNone},
	},
	{StateReleasing, PhaseNone}: {{StateReleased, PhaseNone}, {StateFailed, PhaseNone}},
	{StateFailed, PhaseKept}:    {{StateFailed, PhaseNone}},
}

// admitted reports whether the table knows the place: some move leaves or
// enters it. A lease is never anywhere else.
func (p place) admitted() bool {
	if _, ok := moves[p]; ok {
		return true
	}
	for _, tos := range moves {
		if slices.Contains(tos, p) {
			return true
		}
	}
	return false
}

// canMove reports whether the table allows from → to.
func canMove(from, to place) bool { return slices.Contains(moves[from], to) }

// phaseChange reports whether from → to is a phase change (same state,
// another phase) rather than a transition.
func phaseChange(from, to place) bool { return from.state == to.state && from.phase != to.phase }

// String returns the state's name ("READY"), or "UNSPECIFIED" for the zero value.
func (s State) String() string {
	if s == StateUnspecified {
		return "UNSPECIFIED"
	}
	return string(s)
}

// Valid reports whether s is one of States.
func (s State) Valid() bool { return slices.Contains(States, s) }

// Live reports whether a lease in state s still has (or is getting, or is
// losing) a sandbox: PENDING, READY, PAUSED or RELEASING. Live leases count
// against AdmissionConfig.MaxLive.
func (s State) Live() bool {
	return s == StatePending || s == StateReady || s == StatePaused || s == StateReleasing
}

// Ended reports whether s is final: RELEASED, EXPIRED or FAILED.
func (s State) Ended() bool {
	return s == StateReleased || s == StateExpired || s == StateFailed
}

// CanTransition reports whether the state machine allows a transition from
// → to, in some phase of each (see moves; phase changes are not
// transitions).
func CanTransition(from, to State) bool {
	for f, tos := range moves {
		for _, t := range tos {
			if f.state == from && t.state == to && !phaseChange(f, t) {
				return true
			}
		}
	}
	return false
}

// ParseState parses a state name, case-insensitively, with or without the
// proto prefix "LEASE_STATE_". It returns errdefs.ErrInvalidArgument for
// anything else, including UNSPECIFIED.
func ParseState(s string) (State, error) {
	u := State(strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "LEASE_STATE_"))
	if !u.Valid() {
		return StateUnspecified, errdefs.InvalidArgument("state", "unknown lease state %q", s)
	}
	return u, nil
}

// Transition is one recorded state change.
type Transition struct {
	// From is the state before; StateUnspecified for the creation.
	From State `json:"from"`
	// To is the state after.
	To State `json:"to"`
	// Phase is the phase entered with To (PhaseNone mostly; see Phase).
	Phase Phase `json:"phase,omitempty"`
	// Reason says why, in words meant for people ("ttl of 10m0s passed").
	Reason string `json:"reason"`
	// At is when it happened.
	At time.Time `json:"at"`
}

// Lease is one conversation's claim on a sandbox. Values returned by the
// Manager are copies: changing them changes nothing.
//
// Env is user data and is persisted with the lease (the store file is created
// with mode 0600); callers should not put long-lived secrets in it. Tokens
// are never stored: they are derived from the lease id and the server secret.
type Lease struct {
	// ID is the lease id: 26 characters of lowercase base32hex, sortable by
	// creation time, safe in a DNS label and a URL path segment.
	ID string `json:"id"`
	// ConversationID is the caller's conversation; at most one live lease
	// holds a conversation at a time (see Manager.Acquire).
	ConversationID string `json:"conversation_id"`
	// Owner is who acquired the lease (set by the edge from the credential).
	Owner string `json:"owner,omitempty"`
	// Labels are user labels; they are also put on the container.
	Labels map[string]string `json:"labels,omitempty"`
	// Image is the image the sandbox was created from.
	Image string `json:"image"`
	// User is the user the sandbox's commands run as by default (and that
	// owns files created through the agent); "" is the image's own user.
	User string `json:"user,omitempty"`
	// Env is the environment given to the sandbox (persisted, see above).
	Env map[string]string `json:"env,omitempty"`
	// SecretNames are the names of the secrets given to the sandbox
	// (AcquireRequest.Secrets), sorted; their values are never stored.
	SecretNames []string `json:"secretNames,omitempty"`
	// Resources are the limits the sandbox was created with (after defaults).
	Resources runtime.Resources `json:"resources"`
	// PublicPorts are preview ports the proxy serves without a token.
	PublicPorts []int `json:"publicPorts,omitempty"`
	// Network is what the sandbox may reach (see NetworkPolicy); it may
	// change while the lease runs (Manager.SetNetwork).
	Network NetworkPolicy `json:"network,omitzero"`
	// Volume is the workspace volume mounted at /workspace when the lease
	// persists its workspace (AcquireRequest.Persist): one per owner and
	// conversation (VolumeName), kept after the lease ends. "" otherwise.
	Volume string `json:"volume,omitempty"`
	// Mounts are the host paths mounted into the sandbox
	// (AcquireRequest.Mounts), with their symlinks resolved.
	Mounts []runtime.Mount `json:"mounts,omitempty"`
	// App is the server the sandbox's agent runs and forwards to
	// (AcquireRequest.App); nil for none.
	App *App `json:"app,omitempty"`
	// WorkDir is the default working directory of the sandbox's commands
	// (AcquireRequest.WorkDir); "" for the image's.
	WorkDir string `json:"workDir,omitempty"`
	// State is the current state; Reason is the reason of the last transition.
	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Phase says what the lease is doing within State, where State alone
	// does not say it: PhaseRestarting (PENDING), PhaseClaiming (READY, in
	// a warm claim's record only), PhaseKept (FAILED with its container
	// kept). It is the phase the last transition entered, unless a phase
	// change (Lease.SetPhase) followed. Records written before it existed
	// are read into it (see UnmarshalJSON).
	Phase Phase `json:"phase,omitempty"`
	// CreatedAt is when the lease was acquired; UpdatedAt when it last changed
	// state or expiry.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// ExpiresAt is when the TTL runs out. It is set at acquire, reset to
	// ready time + TTL when the sandbox becomes ready, and moved by Renew.
	ExpiresAt time.Time `json:"expires_at"`
	// LastActivityAt is the last time traffic (Manager.Touch) or an acquire
	// used the lease; it drives the idle timeout. It is persisted lazily, so
	// after a restart it may be a few seconds old.
	LastActivityAt time.Time `json:"last_activity_at"`
	// TTL is the lifetime granted by the last acquire or renew.
	TTL time.Duration `json:"ttl"`
	// IdleTimeout expires the lease after this long without activity; zero
	// means none.
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	// Paused is how a PAUSED lease is paused (PauseFreeze or
	// PauseHibernate); "" in every other state.
	Paused PauseMode `json:"paused,omitempty"`
	// PausedAt is when the lease was paused; Config.Pause.PausedRetention counts
	// from it. Zero unless PAUSED.
	PausedAt time.Time `json:"paused_at,omitzero"`
	// IdlePolicy is what the idle timeout does to this lease (IdleExpire,
	// IdleFreeze or IdleHibernate).
	IdlePolicy IdlePolicy `json:"idle_policy,omitempty"`
	// Pool names the warm pool the sandbox was claimed from; "" for a
	// sandbox created for this lease (see docs/pools.md).
	Pool string `json:"pool,omitempty"`
	// Instance is the orchestrator instance that created the lease (its
	// home): with a SharedStore, only the home replica acts on its
	// sandbox's runtime events, restarts it and reconciles it; every
	// replica serves it. "" in records written before it existed (home
	// everywhere).
	Instance string `json:"instance,omitempty"`
	// ContainerID is the runtime's id of the sandbox, once created.
	ContainerID string `json:"container_id,omitempty"`
	// Endpoint is the agent's host:port, reachable from the orchestrator's host.
	Endpoint string `json:"endpoint,omitempty"`
	// Transitions is the history, oldest first: at most MaxTransitions,
	// the most recent ones. The first is the creation (From
	// StateUnspecified, To StatePending) until older transitions are
	// dropped; TransitionsDropped counts those.
	Transitions []Transition `json:"transitions"`
	// TransitionsDropped counts the oldest transitions dropped from
	// Transitions to keep it at MaxTransitions (a lease paused and resumed
	// without end would otherwise grow its record without bound).
	TransitionsDropped int `json:"transitions_dropped,omitempty"`
	// EndedAt is when the lease reached an ended state; zero while live.
	EndedAt time.Time `json:"ended_at,omitzero"`
	// Restarts counts the in-place restarts of the sandbox after its
	// container exited unexpectedly (each one a READY → PENDING/restarting
	// → READY pair of transitions; files kept, processes lost).
	Restarts int `json:"restarts,omitempty"`
	// Cleaned is true once the sandbox's removal was confirmed by the runtime.
	// An ended lease with Cleaned false still has a container to remove; the
	// reaper keeps trying, and the record is not purged until it succeeds.
	Cleaned bool `json:"cleaned,omitempty"`
	// DiskEnforcement says who enforces Resources.DiskBytes: "engine",
	// "berth" or "" (no limit); see runtime.DiskEnforcementEngine.
	DiskEnforcement string `json:"disk_enforcement,omitempty"`
	// Usage is what the sandbox consumed when last measured (leases with a
	// disk limit only). It is kept in memory and written to the store only
	// with the lease's other changes, so after a restart it may be stale
	// until the next measurement.
	Usage Usage `json:"usage,omitzero"`
	// Warnings are conditions that need attention ("disk limit exceeded:
	// X of Y bytes"); empty when all is well.
	Warnings []string `json:"warnings,omitempty"`
}

// Usage is what a lease's sandbox consumed when last measured.
type Usage struct {
	// DiskBytes is the size of the sandbox's writable layer (and volumes).
	DiskBytes int64 `json:"disk_bytes"`
	// MeasuredAt is when DiskBytes was measured; zero if never.
	MeasuredAt time.Time `json:"measured_at,omitzero"`
}

// Clone returns a deep copy of l.
func (l Lease) Clone() Lease {
	l.Labels = maps.Clone(l.Labels)
	l.Env = maps.Clone(l.Env)
	l.SecretNames = slices.Clone(l.SecretNames)
	l.Transitions = slices.Clone(l.Transitions)
	l.PublicPorts = slices.Clone(l.PublicPorts)
	l.Network = l.Network.Clone()
	l.Mounts = slices.Clone(l.Mounts)
	l.Warnings = slices.Clone(l.Warnings)
	if l.App != nil {
		a := *l.App
		a.Command = slices.Clone(a.Command)
		l.App = &a
	}
	return l
}

// TransitionCount returns how many transitions l has made: those kept in
// Transitions and those dropped. It only grows, so of two records of one
// lease the one with the larger count is the newer.
func (l Lease) TransitionCount() int { return l.TransitionsDropped + len(l.Transitions) }

// Transition moves l to state to in PhaseNone: TransitionPhase(to,
// PhaseNone, reason, at).
func (l *Lease) Transition(to State, reason string, at time.Time) (Transition, error) {
	return l.TransitionPhase(to, PhaseNone, reason, at)
}

// TransitionPhase moves l to state to in phase p, recording a Transition
// with reason at time at and updating State, Phase, Reason, UpdatedAt (and
// EndedAt for an ended state). A move the table (moves) does not allow, or
// a phase change (same state, another phase: that is SetPhase's), leaves
// l unchanged and returns an error wrapping errdefs.ErrFailedPrecondition:
// it means a bug, not a user error.
func (l *Lease) TransitionPhase(to State, p Phase, reason string, at time.Time) (Transition, error) {
	from, dest := place{l.State, l.Phase}, place{to, p}
	if !canMove(from, dest) || phaseChange(from, dest) {
		return Transition{}, errdefs.FailedPrecondition("lease %s: illegal transition %s -> %s", l.ID, from, dest)
	}
	t := Transition{From: l.State, To: to, Phase: p, Reason: reason, At: at}
	l.Transitions = append(l.Transitions, t)
	if drop := len(l.Transitions) - MaxTransitions; drop > 0 {
		// A fresh array: copies of l (Lease values) may share the old one.
		l.Transitions = slices.Clone(l.Transitions[drop:])
		l.TransitionsDropped += drop
	}
	l.State, l.Phase, l.Reason, l.UpdatedAt = to, p, reason, at
	if to.Ended() {
		l.EndedAt = at
	}
	return t, nil
}

// SetPhase changes l's phase within its state (READY/claiming → READY,
// FAILED/kept → FAILED), checked against the same table as transitions.
// A phase change is not a transition: it is not recorded in Transitions
// (the history, its bound, its count and the events watchers get are
// those of state changes, as before phases existed) and changes neither
// Reason nor UpdatedAt. Setting the current phase does nothing. A change
// the table does not allow leaves l unchanged and returns an error
// wrapping errdefs.ErrFailedPrecondition.
func (l *Lease) SetPhase(p Phase) error {
	from, dest := place{l.State, l.Phase}, place{l.State, p}
	if from == dest {
		return nil
	}
	if !canMove(from, dest) {
		return errdefs.FailedPrecondition("lease %s: illegal phase change %s -> %s", l.ID, from, dest)
	}
	l.Phase = p
	return nil
}

// UnmarshalJSON decodes a lease record, reading records written before
// Phase existed into it: "claiming": true on a READY record is
// PhaseClaiming, "keep_container": true on a FAILED one PhaseKept, and a
// PENDING record whose last transition came from READY is PhaseRestarting.
// A READY → PENDING transition recorded without a phase is given
// PhaseRestarting (it never meant anything else), so the restart budget
// counts the restarts of old records too.
func (l *Lease) UnmarshalJSON(b []byte) error {
	type record Lease // Lease's fields without this method
	var r struct {
		record
		// Fields of records written before Phase existed.
		Claiming      bool `json:"claiming"`
		KeepContainer bool `json:"keep_container"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	*l = Lease(r.record)
	for i, t := range l.Transitions {
		if t.From == StateReady && t.To == StatePending && t.Phase == PhaseNone {
			l.Transitions[i].Phase = PhaseRestarting
		}
	}
	if l.Phase != PhaseNone {
		return nil
	}
	switch n := len(l.Transitions); {
	case r.Claiming && l.State == StateReady:
		l.Phase = PhaseClaiming
	case r.KeepContainer && l.State == StateFailed:
		l.Phase = PhaseKept
	case l.State == StatePending && n > 0 && l.Transitions[n-1].From == StateReady:
		l.Phase = PhaseRestarting
	}
	return nil
}
