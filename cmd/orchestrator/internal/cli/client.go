// Package cli implements the orchestrator's operator and CI command line:
// `orchestrator lease acquire|get|list|renew|release|reap|watch` talking to a
// running orchestrator over gRPC. Output is a human table by default or JSON
// with -o json; the exit code is 0 on success and non-zero with a one-line
// error on stderr otherwise, so shell scripts can rely on it.
package cli

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// DefaultAddr is the orchestrator's default address.
const DefaultAddr = "http://127.0.0.1:7070"

// dialTarget turns --addr (a URL like http://127.0.0.1:7070, or host:port)
// into a gRPC target.
func dialTarget(addr string) (string, error) {
	if !strings.Contains(addr, "://") {
		return addr, nil
	}
	u, err := url.Parse(addr)
	if err != nil {
		return "", fmt.Errorf("--addr %q: %w", addr, err)
	}
	if u.Scheme != "http" {
		return "", fmt.Errorf("--addr %q: only http:// is supported (the orchestrator serves h2c)", addr)
	}
	host := u.Host
	if u.Port() == "" {
		host += ":80"
	}
	return host, nil
}

// dial connects to the orchestrator at addr.
func dial(addr string) (*grpc.ClientConn, error) {
	target, err := dialTarget(addr)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// withToken attaches the bearer token to outgoing calls.
func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}
