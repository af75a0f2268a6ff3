package lease

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Network modes (NetworkPolicy.Mode).
const (
	// NetworkOpen lets a sandbox reach everything but what is always
	// denied (docs/network-policy.md) and its deny list.
	NetworkOpen = "open"
	// NetworkRestricted lets it reach only its allow list.
	NetworkRestricted = "restricted"
	// NetworkNone lets it reach nothing (the host still reaches its agent).
	NetworkNone = "none"
)

// NetworkPolicy is what a lease's sandbox may reach on the network (see
// docs/network-policy.md).
type NetworkPolicy struct {
	// Mode is NetworkNone, NetworkRestricted or NetworkOpen; "" takes the
	// operator's default (NetworkConfig.Default), open when it has none.
	Mode string `json:"mode,omitempty"`
	// Allow lists what restricted mode lets through: CIDRs, host:port and
	// domain names (exact or *.suffix).
	Allow []string `json:"allow,omitempty"`
	// Deny lists what is refused in every mode, in the same forms; a deny
	// wins over an allow.
	Deny []string `json:"deny,omitempty"`
}

// NetworkCeiling is the operator's bound on every lease's network policy
// (maximum mode, deny list always added, allow ceiling; see egress.Ceiling).
type NetworkCeiling = egress.Ceiling

// Clone returns a deep copy of p.
func (p NetworkPolicy) Clone() NetworkPolicy {
	p.Allow, p.Deny = slices.Clone(p.Allow), slices.Clone(p.Deny)
	return p
}

func (p NetworkPolicy) egress() egress.Policy {
	return egress.Policy{Mode: egress.Mode(p.Mode), Allow: p.Allow, Deny: p.Deny}
}

// Egress enforces leases' network policies on the host (package
// internal/egress implements it).
type Egress interface {
	// Apply enforces p for lease's sandbox, whose agent is at endpoint,
	// replacing what the lease had.
	Apply(ctx context.Context, lease, endpoint string, p egress.Policy) error
	// Remove deletes lease's rules; nothing to delete is success.
	Remove(ctx context.Context, lease string) error
	// Prune removes the rules of the leases keep rejects.
	Prune(ctx context.Context, keep func(lease string) bool) error
	// DNS returns the name servers to give sandboxes.
	DNS() []string
}

// NetworkConfig configures leases' network policies (network.go,
// docs/network-policy.md): their enforcement, the default, and the
// operator's ceiling. Zero fields take the defaults
// (DefaultNetworkConfig).
type NetworkConfig struct {
	// Egress enforces leases' network policies (internal/egress). Default
	// nil: none, and an acquire may only ask for mode open without a deny
	// list.
	Egress Egress
	// Default is the network policy of an acquire that gives none (or
	// gives no mode: its mode). Default: mode open, no lists.
	Default NetworkPolicy
	// Ceiling bounds every lease's network policy: requests above it are
	// refused, Ceiling.AlwaysDeny is added when enforcing. Default: no
	// bound.
	Ceiling NetworkCeiling
}

// DefaultNetworkConfig returns the defaults of NetworkConfig: no
// enforcement, mode open by default, no ceiling.
func DefaultNetworkConfig() NetworkConfig {
	return NetworkConfig{Default: NetworkPolicy{Mode: NetworkOpen}}
}

// withDefaults returns c with an empty Default.Mode taken from
// DefaultNetworkConfig, validated.
func (c NetworkConfig) withDefaults() (NetworkConfig, error) {
	if c.Default.Mode == "" {
		c.Default.Mode = DefaultNetworkConfig().Default.Mode
	}
	return c, c.Validate()
}

// Validate reports what cannot work: a Default that is not a valid policy
// (errdefs.ErrInvalidArgument naming network.*), a Ceiling that is not
// valid (egress.Ceiling.Validate's error naming its setting), a Default
// above the Ceiling (errdefs.ErrPermissionDenied naming network.*). An
// empty Default.Mode is open.
func (c NetworkConfig) Validate() error {
	def, err := egress.Normalize(c.Default.egress())
	if err != nil {
		return fmt.Errorf("default network policy: %w", err)
	}
	if err := c.Ceiling.Validate(); err != nil {
		return err
	}
	if err := c.Ceiling.Check(def); err != nil {
		return fmt.Errorf("the default network policy (default-network-*) is above the ceiling: %w", err)
	}
	return nil
}

// admit returns p (nil: the default) with the operator's default mode
// filled in and its entries normalised; errdefs.ErrInvalidArgument naming
// network.* for a bad policy, errdefs.ErrPermissionDenied naming network.*
// for one above Ceiling, and errdefs.ErrFailedPrecondition for a policy
// this orchestrator cannot enforce.
func (c NetworkConfig) admit(p *NetworkPolicy) (*NetworkPolicy, error) {
	var out NetworkPolicy
	if p != nil {
		out = p.Clone()
	}
	if out.Mode == "" {
		out.Mode = c.Default.Mode
		if p == nil {
			out = c.Default.Clone()
		}
	}
	n, err := egress.Normalize(out.egress())
	if err != nil {
		return nil, err
	}
	if err := c.Ceiling.Check(n); err != nil {
		return nil, err
	}
	out = NetworkPolicy{Mode: string(n.Mode), Allow: n.Allow, Deny: n.Deny}
	if c.Egress == nil && !n.Open() {
		return nil, errdefs.FailedPrecondition("network: egress policies are not enforced by this orchestrator (it needs root and iptables; setting egress): only mode open without a deny list is possible")
	}
	return &out, nil
}

// dns returns the name servers for a new sandbox (nil: the backend's
// default).
func (c NetworkConfig) dns() []string {
	if c.Egress == nil {
		return nil
	}
	return c.Egress.DNS()
}

// Below: the enforcement of the policies (networkKeeper), and
// Manager.SetNetwork, which changes a lease's record and persists it.

func netOf(p *NetworkPolicy) NetworkPolicy {
	if p == nil {
		return NetworkPolicy{Mode: NetworkOpen}
	}
	return p.Clone()
}

// networkKeeper enforces the leases' network policies on the host
// (NetworkConfig.Egress): it applies a lease's policy to its sandbox's
// address, forgets it when the sandbox is gone, and applies them all again
// at Start. Without an Egress it does nothing. It reads the lease records
// with the Manager's mu held and never writes them.
type networkKeeper struct {
	cfg    NetworkConfig
	log    *slog.Logger
	mu     *sync.Mutex       // the Manager's
	leases map[string]*entry // the Manager's, read with mu held
}

// enforce applies lease id's policy to its sandbox at endpoint (a
// no-op without NetworkConfig.Egress).
func (n *networkKeeper) enforce(ctx context.Context, id, endpoint string) error {
	if n.cfg.Egress == nil {
		return nil
	}
	n.mu.Lock()
	e := n.leases[id]
	var p NetworkPolicy
	if e != nil {
		p = e.l.Network.Clone()
	}
	n.mu.Unlock()
	if e == nil {
		return nil
	}
	pol, clamped := n.cfg.Ceiling.Clamp(p.egress())
	if clamped {
		// Recorded before the operator lowered the ceiling.
		n.log.Warn("network policy above the operator's ceiling: enforcing it lowered", "lease_id", id,
			"mode", p.Mode, "enforced_mode", pol.Mode)
	}
	if err := n.cfg.Egress.Apply(ctx, id, endpoint, pol); err != nil {
		return wrapf(err, "lease %s: enforce network policy", id)
	}
	return nil
}

// drop deletes lease id's rules (the sandbox is gone, or its address
// free).
func (n *networkKeeper) drop(ctx context.Context, id string) {
	if n.cfg.Egress == nil {
		return
	}
	rctx, cancel := detached(ctx, 30*time.Second)
	defer cancel()
	if err := n.cfg.Egress.Remove(rctx, id); err != nil {
		n.log.Warn("removing the sandbox's network rules failed", "lease_id", id, "err", err)
	}
}

// reapply enforces the policies of the READY and PAUSED leases again
// (after a restart of the orchestrator, whose resolver port changed) and
// removes the rules of every other lease of this instance.
func (n *networkKeeper) reapply(ctx context.Context) {
	if n.cfg.Egress == nil {
		return
	}
	type job struct{ id, endpoint string }
	var jobs []job
	live := map[string]bool{}
	n.mu.Lock()
	for id, e := range n.leases {
		if (e.l.State == StateReady || e.l.State == StatePaused || e.l.State == StatePending) && e.l.Endpoint != "" {
			live[id] = true
			if running(&e.l) {
				jobs = append(jobs, job{id, e.l.Endpoint})
			}
		}
	}
	n.mu.Unlock()
	for _, j := range jobs {
		if err := n.enforce(ctx, j.id, j.endpoint); err != nil {
			n.log.Warn("re-applying the network policy failed", "lease_id", j.id, "err", err)
		}
	}
	if err := n.cfg.Egress.Prune(ctx, func(id string) bool { return live[id] }); err != nil {
		n.log.Warn("pruning network rules of ended leases failed", "err", err)
	}
}

// running reports whether l's sandbox runs at l.Endpoint: READY, or
// PAUSED by freezing (a hibernated sandbox's container is stopped and its
// address free for another).
func running(l *Lease) bool {
	return l.State == StateReady || (l.State == StatePaused && l.Paused == PauseFreeze)
}

// SetNetwork replaces lease id's network policy while it runs: the new
// policy applies to the sandbox's new connections at once (connections
// already open stay open) and is recorded with the lease, so that it holds
// after restarts. Mode "" takes the operator's default. Errors:
// errdefs.ErrNotFound; errdefs.ErrInvalidArgument naming network.*;
// errdefs.ErrPermissionDenied naming network.* above the operator's
// ceiling (NetworkConfig.Ceiling, for every caller);
// errdefs.ErrFailedPrecondition for an ended lease or a policy this
// orchestrator cannot enforce.
func (m *Manager) SetNetwork(ctx context.Context, id string, p NetworkPolicy) (Lease, error) {
	np, err := m.cfg.Network.admit(&p)
	if err != nil {
		return Lease{}, err
	}
	m.mu.Lock()
	e := m.leases[id]
	if e == nil {
		m.mu.Unlock()
		return Lease{}, errdefs.NotFound("lease %s not found", id)
	}
	if e.l.State.Ended() || e.l.State == StateReleasing {
		st := e.l.State
		m.mu.Unlock()
		return Lease{}, errdefs.FailedPrecondition("lease %s is %s", id, st)
	}
	e.l.Network = np.Clone()
	e.rev++
	endpoint, run := e.l.Endpoint, running(&e.l)
	l, rev := e.snapshot()
	m.mu.Unlock()
	if err := m.persist(l, rev); err != nil {
		return Lease{}, wrapf(err, "lease %s: persist network policy", id)
	}
	// A sandbox being created or restarted, or hibernated, gets it when it
	// is ready again (its address may change, and the old one may belong
	// to another sandbox by then).
	if run && endpoint != "" {
		if err := m.network.enforce(ctx, id, endpoint); err != nil {
			return Lease{}, err
		}
	}
	m.log.Info("network policy changed", "lease_id", id, "mode", np.Mode, "allow", len(np.Allow), "deny", len(np.Deny))
	return l.Clone(), nil
}
