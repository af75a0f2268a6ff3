package cli

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// DefaultAddr is the orchestrator's default address.
const DefaultAddr = "http://127.0.0.1:7070"

// clientFlags are the flags every client command takes.
type clientFlags struct {
	addr, token string
	env         Env
}

// register adds --addr and --token to fs. The token's flag has no default
// value, so that --help never prints a secret: the environment is read in
// bearer, after parsing.
func (c *clientFlags) register(fs *pflag.FlagSet, env Env) {
	addr := env.getenv("BERTH_ADDR")
	if addr == "" {
		addr = DefaultAddr
	}
	fs.StringVar(&c.addr, "addr", addr, "orchestrator address (env BERTH_ADDR)")
	fs.StringVar(&c.token, "token", "", "API token (default: env BERTH_TOKEN, else BERTH_OPERATOR_TOKEN)")
	c.env = env
}

// bearer returns the token to send: --token, else BERTH_TOKEN, else
// BERTH_OPERATOR_TOKEN.
func (c *clientFlags) bearer() string {
	if c.token != "" {
		return c.token
	}
	if tok := c.env.getenv("BERTH_TOKEN"); tok != "" {
		return tok
	}
	return c.env.getenv("BERTH_OPERATOR_TOKEN")
}

// dial connects to the orchestrator at --addr. A malformed address is a
// usage mistake.
func (c *clientFlags) dial() (*grpc.ClientConn, error) {
	target, err := dialTarget(c.addr)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, usagef("--addr %q: %v", c.addr, err)
	}
	return conn, nil
}

// dialInterruptible dials like dial for a call that runs until the command
// is interrupted: the context it returns ends on SIGINT or SIGTERM, and
// done closes the connection and stops the signal handling.
func (c *clientFlags) dialInterruptible(ctx context.Context) (*grpc.ClientConn, context.Context, func(), error) {
	conn, err := c.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	return conn, ctx, func() { stop(); conn.Close() }, nil
}

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

// withToken attaches the bearer token to outgoing calls.
func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}
