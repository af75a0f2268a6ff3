package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/agent/statefile"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/berth-dev/berth/pkg/lease"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// agentConfigurer is lease.AgentConfigurer: it gives a claimed warm-pool
// sandbox its lease's env and secrets by writing the agent's state file
// when the sandbox's state directory is on this host (package statefile),
// else over the agent's gRPC ConfigService (the proxy refuses it to
// clients). For the latter it keeps one connection, opened ahead
// (Prepare), to each ready pooled sandbox, so that a claim costs one round
// trip on an established connection.
type agentConfigurer struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // endpoint → connection opened by Prepare
}

var (
	_ lease.AgentConfigurer = (*agentConfigurer)(nil)
	_ lease.AgentPreparer   = (*agentConfigurer)(nil)
)

// configuredConnLinger is how long the connection of a Configure stays
// open after it: past a burst of claims.
const configuredConnLinger = 5 * time.Second

func newAgentConfigurer() *agentConfigurer {
	return &agentConfigurer{conns: map[string]*grpc.ClientConn{}}
}

func dialAgent(endpoint string) (*grpc.ClientConn, error) {
	cc, err := grpc.NewClient("passthrough:///"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(), grpc.WithUserAgent("berth-orchestrator"))
	if err != nil {
		return nil, fmt.Errorf("agent at %s: %w", endpoint, err)
	}
	return cc, nil
}

// Prepare implements lease.AgentPreparer: unless the agent a can be
// configured through its state directory (statefile.Usable), it connects
// to the agent (bounded by ctx) and keeps the connection for Configure.
func (c *agentConfigurer) Prepare(ctx context.Context, a lease.AgentTarget) {
	if a.StateDir != "" && statefile.Usable(a.StateDir) {
		return
	}
	endpoint := a.Endpoint
	cc, err := dialAgent(endpoint)
	if err != nil {
		return
	}
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if s == connectivity.TransientFailure || s == connectivity.Shutdown || !cc.WaitForStateChange(ctx, s) {
			cc.Close()
			return
		}
	}
	// One call through the agent's gRPC server (health needs no token)
	// warms what a Configure goes through.
	_, _ = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	c.mu.Lock()
	old := c.conns[endpoint]
	c.conns[endpoint] = cc
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// Forget implements lease.AgentPreparer: it closes the connection to
// endpoint, if any.
func (c *agentConfigurer) Forget(endpoint string) {
	c.mu.Lock()
	cc := c.conns[endpoint]
	delete(c.conns, endpoint)
	c.mu.Unlock()
	if cc != nil {
		cc.Close()
	}
}

// Configure implements lease.AgentConfigurer: through the agent's state
// directory when this host has it (statefile.WriteClaim: no call wakes the
// agent while the claim waits; it applies the file before its first
// command), else with ConfigService.Configure.
func (c *agentConfigurer) Configure(ctx context.Context, a lease.AgentTarget, agentToken string, env, secrets map[string]string) error {
	c.mu.Lock()
	cc := c.conns[a.Endpoint]
	delete(c.conns, a.Endpoint)
	c.mu.Unlock()
	if a.StateDir != "" {
		err := statefile.WriteClaim(a.StateDir, statefile.Config{Env: env, Secrets: secrets})
		if !errors.Is(err, statefile.ErrNotLocal) {
			if cc != nil {
				defer time.AfterFunc(configuredConnLinger, func() { cc.Close() })
			}
			if err != nil {
				return fmt.Errorf("configure the agent at %s: %w", a.Endpoint, err)
			}
			return nil
		}
	}
	endpoint := a.Endpoint
	if cc == nil {
		var err error
		if cc, err = dialAgent(endpoint); err != nil {
			return fmt.Errorf("configure %w", err)
		}
	}
	// Closed later, not on the claim's path: a connection's end costs the
	// agent about 0.3 ms of CPU (its transport's goroutines, GOAWAY), which
	// ten claims at once pay while they wait for CPU (docs/benchmarks.md).
	// The CPU is the same, spent after the burst.
	defer time.AfterFunc(configuredConnLinger, func() { cc.Close() })
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, bearer.MetadataKey, "Bearer "+agentToken)
	if _, err := agentv1.NewConfigServiceClient(cc).Configure(ctx, &agentv1.ConfigureRequest{Env: env, Secrets: secrets}); err != nil {
		return fmt.Errorf("configure agent at %s: %w", endpoint, errgrpc.FromGRPC(err))
	}
	return nil
}
