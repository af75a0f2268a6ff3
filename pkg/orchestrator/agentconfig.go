package orchestrator

import (
	"context"
	"fmt"

	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/berth-dev/berth/pkg/lease"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// agentConfigurer is lease.AgentConfigurer over the agent's gRPC
// ConfigService: the call that gives a claimed warm-pool sandbox its
// lease's env and secrets (the proxy refuses it to clients).
type agentConfigurer struct{}

var _ lease.AgentConfigurer = agentConfigurer{}

// Configure implements lease.AgentConfigurer.
func (agentConfigurer) Configure(ctx context.Context, endpoint, agentToken string, env, secrets map[string]string) error {
	cc, err := grpc.NewClient("passthrough:///"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(), grpc.WithUserAgent("berth-orchestrator"))
	if err != nil {
		return fmt.Errorf("configure agent at %s: %w", endpoint, err)
	}
	defer cc.Close()
	ctx = metadata.AppendToOutgoingContext(ctx, bearer.MetadataKey, "Bearer "+agentToken)
	if _, err := agentv1.NewConfigServiceClient(cc).Configure(ctx, &agentv1.ConfigureRequest{Env: env, Secrets: secrets}); err != nil {
		return fmt.Errorf("configure agent at %s: %w", endpoint, errgrpc.FromGRPC(err))
	}
	return nil
}
