package agent

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// directProcess is the ProcessService client of the REST gateway: Exec,
// the hot path of every REST command, calls the service in this process
// through the gRPC server's own interceptors (recovery, the token check,
// metrics) instead of over the in-process socket, which saves the HTTP/2
// framing, the protobuf round trip and four socket system calls per
// command; the other methods (the streams among them) go over the socket
// as before. The gateway's outgoing metadata (the caller's Authorization
// header among it) becomes the call's incoming metadata, as the socket
// would have carried it. It is edge.Direct for one method without
// edge.Direct's copies of the messages: an Exec answer carries up to
// twice the output limit, and the handler does not keep the request.
type directProcess struct {
	agentv1.ProcessServiceClient
	srv   agentv1.ProcessServiceServer
	chain grpc.UnaryServerInterceptor
}

// Exec implements agentv1.ProcessServiceClient.
func (d directProcess) Exec(ctx context.Context, req *agentv1.ExecRequest, _ ...grpc.CallOption) (*agentv1.ExecResponse, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	ctx = metadata.NewIncomingContext(ctx, md)
	info := &grpc.UnaryServerInfo{Server: d.srv, FullMethod: agentv1.ProcessService_Exec_FullMethodName}
	res, err := d.chain(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return d.srv.Exec(ctx, req.(*agentv1.ExecRequest))
	})
	if err != nil {
		return nil, err
	}
	out, ok := res.(*agentv1.ExecResponse)
	if !ok {
		return nil, fmt.Errorf("agent: Exec returned %T", res)
	}
	return out, nil
}
