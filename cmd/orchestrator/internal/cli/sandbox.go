package cli

import (
	"context"
	"errors"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// sandboxConn is a gRPC connection to the orchestrator whose calls carry
// the lease (x-berth-lease), so the proxy forwards them to that sandbox.
type sandboxConn struct {
	conn *grpc.ClientConn
	ctx  context.Context
}

// sandboxFlags are the flags of the commands that talk to a sandbox (exec,
// cp, git).
type sandboxFlags struct {
	clientFlags
	output string
}

// register adds --addr, --token and -o to fs; hideOutput hides -o where
// it has no effect (exec, cp accept it as the old parser did).
func (sf *sandboxFlags) register(fs *pflag.FlagSet, env Env, hideOutput bool) {
	sf.clientFlags.register(fs, env)
	addOutputFlag(fs, &sf.output)
	if hideOutput {
		_ = fs.MarkHidden("output")
	}
}

// open connects to the orchestrator for lease's sandbox.
func (sf *sandboxFlags) open(ctx context.Context, lease string) (*sandboxConn, error) {
	if lease == "" {
		return nil, usageError{"a lease id is required"}
	}
	conn, err := sf.dial()
	if err != nil {
		return nil, err
	}
	ctx = withToken(ctx, sf.bearer())
	ctx = metadata.AppendToOutgoingContext(ctx, "x-berth-lease", lease)
	return &sandboxConn{conn: conn, ctx: ctx}, nil
}

// errNoExit is an exec stream that ended without the command's status.
var errNoExit = errors.New("stream ended without an exit status")
