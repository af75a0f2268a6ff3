package orchestrator

import (
	"context"

	"k8s.io/client-go/rest"

	"github.com/berth-dev/berth/pkg/runtime"
)

// Platform is what a Server runs on, built by the caller (cmd/orchestrator's
// backend package) and passed to New: nothing is discovered by inspecting
// the runtime's type.
type Platform struct {
	// Runtime creates and watches the sandboxes. Required.
	Runtime runtime.Runtime
	// Cluster, when set, is the cluster that orchestrator replicas share
	// (the Kubernetes backend): the lease store defaults to its BerthLease
	// objects, the token-signing secret is its Secret, and one elected
	// replica runs expiry and reaping. Nil: one orchestrator per host, with
	// its secret and store in the data directory.
	Cluster Cluster
}

// Cluster is a cluster several orchestrator replicas share
// (kubernetes.Runtime implements it).
type Cluster interface {
	// RESTConfig is the API server's client configuration, for the lease
	// store (pkg/lease/kubestore).
	RESTConfig() *rest.Config
	// Namespace holds the replicas' objects.
	Namespace() string
	// SharedSecret returns the secret, at least minLen bytes, that signs
	// lease tokens, the same for every replica (made once).
	SharedSecret(ctx context.Context, minLen int) ([]byte, error)
	// RunLeader runs lead while this replica (identity) is the elected one,
	// until ctx ends.
	RunLeader(ctx context.Context, identity string, lead func(ctx context.Context)) error
}
