package egress

import (
	"context"
	"sync/atomic"
)

// Repair runs the periodic repair now (tests).
func (e *Enforcer) Repair() { e.repair() }

// countingIPT is the real iptables, counting the restores.
type countingIPT struct {
	execIPT
	restores *atomic.Int64
}

func (c countingIPT) restore(ctx context.Context, filter, nat []string) error {
	c.restores.Add(1)
	return c.execIPT.restore(ctx, filter, nat)
}

// NewCounting returns an Enforcer on the real iptables and the count of
// its iptables-restore runs (tests).
func NewCounting(cfg Config) (*Enforcer, *atomic.Int64) {
	n := &atomic.Int64{}
	return newEnforcer(cfg, countingIPT{restores: n}), n
}
