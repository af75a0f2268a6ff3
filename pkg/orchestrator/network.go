package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// SetNetwork replaces a live lease's network policy. The operator and the
// lease's owner (client token) may; a lease token may not — whoever holds
// only the lease's token (the sandbox's user, say) cannot widen it.
func (s *leaseServer) SetNetwork(ctx context.Context, req *orchv1.SetNetworkRequest) (*orchv1.Lease, error) {
	if _, err := s.lookup(ctx, req.Id); err != nil {
		return nil, err
	}
	if principal(ctx).Role == RoleLease {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "network: a lease token cannot change its lease's network policy (use the owner's client token or the operator token)")
	}
	if req.Network == nil {
		return nil, errdefs.InvalidArgument("network", "required")
	}
	l, err := s.m.SetNetwork(ctx, req.Id, fromNetwork(req.Network))
	if err != nil {
		return nil, err
	}
	return toLease(l), nil
}

// fromNetwork converts an API policy (nil stays nil: the default).
func fromNetwork(n *orchv1.NetworkPolicy) lease.NetworkPolicy {
	return lease.NetworkPolicy{Mode: n.GetMode(), Allow: n.GetAllow(), Deny: n.GetDeny()}
}

// acquireNetwork converts an acquire's policy: nil for none given.
func acquireNetwork(n *orchv1.NetworkPolicy) *lease.NetworkPolicy {
	if n == nil {
		return nil
	}
	p := fromNetwork(n)
	return &p
}

// toNetwork converts a lease's policy for the API.
func toNetwork(p lease.NetworkPolicy) *orchv1.NetworkPolicy {
	if p.Mode == "" && len(p.Allow) == 0 && len(p.Deny) == 0 {
		return nil
	}
	return &orchv1.NetworkPolicy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny}
}

// validateEgress checks the egress settings.
func (c Config) validateEgress() error {
	switch c.Egress {
	case "auto", "required", "off":
	default:
		return fmt.Errorf("egress must be auto, required or off, got %q", c.Egress)
	}
	if err := c.leaseNetwork(nil).Validate(); err != nil { // the default policy and the ceiling
		return err
	}
	if c.networkCeiling().Bounded() && c.Egress == "off" {
		return fmt.Errorf("max-network-mode, network-always-deny and network-allow-ceiling need egress auto or required, got off")
	}
	for _, u := range c.EgressUpstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			return fmt.Errorf("egress upstream %q: want host:port", u)
		}
	}
	return nil
}

// leaseNetwork returns the lease manager's network configuration: the
// enforcer eg (nil: none), the default policy (DefaultNetworkMode,
// DefaultNetworkAllow, DefaultNetworkDeny) and the ceiling.
func (c Config) leaseNetwork(eg lease.Egress) lease.NetworkConfig {
	return lease.NetworkConfig{Egress: eg, Ceiling: c.networkCeiling(),
		Default: lease.NetworkPolicy{Mode: c.DefaultNetworkMode, Allow: c.DefaultNetworkAllow, Deny: c.DefaultNetworkDeny}}
}

// networkCeiling is the operator's bound on every lease's policy.
func (c Config) networkCeiling() lease.NetworkCeiling {
	return lease.NetworkCeiling{MaxMode: egress.Mode(c.MaxNetworkMode), AlwaysDeny: c.NetworkAlwaysDeny, AllowCeiling: c.NetworkAllowCeiling}
}

// newEgress returns the enforcer Config.Egress asks for, reporting to
// met: nil when it is off, or when it is auto and this host cannot
// enforce (logged once; an error when an operator ceiling is set).
func newEgress(cfg Config, instance string, met *egress.Metrics, log *slog.Logger) (*egress.Enforcer, error) {
	if cfg.Egress == "off" {
		return nil, nil
	}
	if cfg.Runtime == "kubernetes" {
		// The enforcer programs this host's iptables for sandboxes on it;
		// Pods run on the cluster's nodes, isolated by NetworkPolicy
		// objects (docs/kubernetes.md).
		if cfg.Egress == "required" || cfg.networkCeiling().Bounded() {
			return nil, errors.New("orchestrator: per-lease network policies (egress required, max-network-mode, network-always-deny, network-allow-ceiling) are not enforced on the kubernetes runtime: its isolation is NetworkPolicy objects")
		}
		log.Info("per-lease network policies are not enforced on the kubernetes runtime: only mode open without a deny list is accepted; sandboxes are isolated by NetworkPolicy objects")
		return nil, nil
	}
	e, err := egress.New(egress.Config{InstanceID: instance, Upstreams: cfg.EgressUpstreams, Metrics: met, Logger: log})
	if err != nil {
		if cfg.Egress == "required" {
			return nil, fmt.Errorf("orchestrator: egress required: %w", err)
		}
		if cfg.networkCeiling().Bounded() {
			// An operator ceiling that is not enforced would be a silent hole.
			return nil, fmt.Errorf("orchestrator: max-network-mode/network-always-deny/network-allow-ceiling are set but network policies cannot be enforced here: %w", err)
		}
		log.Warn("network policies are not enforced: only mode open without a deny list is accepted", "err", err)
		return nil, nil
	}
	return e, nil
}

// leaseEgress returns e as the lease manager's enforcer (nil, untyped,
// when there is none).
func leaseEgress(e *egress.Enforcer) lease.Egress {
	if e == nil {
		return nil
	}
	return e
}

func closeEgress(e *egress.Enforcer) {
	if e != nil {
		_ = e.Close()
	}
}
