package edge

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Direct is the client connection of a gateway that calls the unary
// methods of the services registered on it in this process, through the
// gRPC server's unary interceptors, instead of over the in-process socket:
// that saves the HTTP/2 framing, the protobuf encoding and decoding on both
// sides, the socket system calls and the wake-ups of four goroutines per
// call (the lease API's REST calls, a warm claim among them). Streams, and
// methods of services not registered here, go over the socket (Streams).
//
// The call sees what it would over the socket: the caller's outgoing
// metadata as its incoming metadata (and no outgoing metadata, so that an
// onward call of the handler does not forward the caller's credentials),
// its method (grpc.Method), headers and trailers that reach the
// grpc.Header and grpc.Trailer call options, and an error that is a gRPC
// status. The request and the response are copied (proto.Merge): the
// handler neither shares the caller's message nor the caller the
// handler's.
type Direct struct {
	// Streams carries what is not called directly.
	Streams grpc.ClientConnInterface
	chain   grpc.UnaryServerInterceptor
	methods map[string]directMethod
}

type directMethod struct {
	impl    any
	handler grpc.MethodHandler
}

// NewDirect returns a Direct that sends streams over streams and runs
// direct calls through the interceptors, the first outermost (as
// grpc.ChainUnaryInterceptor orders them). Register the services with
// RegisterService, as on the gRPC server.
func NewDirect(streams grpc.ClientConnInterface, interceptors ...grpc.UnaryServerInterceptor) *Direct {
	return &Direct{Streams: streams, chain: ChainUnary(interceptors...), methods: map[string]directMethod{}}
}

// RegisterService implements grpc.ServiceRegistrar: the unary methods of
// desc, served by impl, are then called directly. Register before the
// first call.
func (d *Direct) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		d.methods["/"+desc.ServiceName+"/"+m.MethodName] = directMethod{impl: impl, handler: m.Handler}
	}
}

// Invoke implements grpc.ClientConnInterface.
func (d *Direct) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	m, ok := d.methods[method]
	if !ok {
		return d.Streams.Invoke(ctx, method, args, reply, opts...)
	}
	in, ok1 := args.(proto.Message)
	out, ok2 := reply.(proto.Message)
	if !ok1 || !ok2 {
		return status.Errorf(codes.Internal, "edge: direct call of %s with %T, %T: not protobuf messages", method, args, reply)
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	ctx = metadata.NewIncomingContext(ctx, md)
	ctx = metadata.NewOutgoingContext(ctx, metadata.MD{})
	st := &directStream{method: method}
	ctx = grpc.NewContextWithServerTransportStream(ctx, st)
	dec := func(req any) error {
		msg, ok := req.(proto.Message)
		if !ok {
			return fmt.Errorf("edge: direct call of %s: request %T is not a protobuf message", method, req)
		}
		proto.Merge(msg, in)
		return nil
	}
	res, err := m.handler(m.impl, ctx, dec, d.chain)
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			*o.HeaderAddr = st.header
		case grpc.TrailerCallOption:
			*o.TrailerAddr = st.trailer
		}
	}
	if err != nil {
		// As the server makes its status of a handler's error.
		if s, ok := status.FromError(err); ok {
			return s.Err()
		}
		return status.FromContextError(err).Err()
	}
	msg, ok := res.(proto.Message)
	if !ok || !msg.ProtoReflect().IsValid() {
		return status.Errorf(codes.Internal, "edge: direct call of %s returned %T", method, res)
	}
	proto.Reset(out)
	proto.Merge(out, msg)
	return nil
}

// NewStream implements grpc.ClientConnInterface: streams go over Streams.
func (d *Direct) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return d.Streams.NewStream(ctx, desc, method, opts...)
}

// directStream is the grpc.ServerTransportStream of a direct call: it
// keeps the headers and trailers the handler sets for the call options.
type directStream struct {
	method          string
	header, trailer metadata.MD
}

func (s *directStream) Method() string { return s.method }

func (s *directStream) SetHeader(md metadata.MD) error {
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *directStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

func (s *directStream) SetTrailer(md metadata.MD) error {
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}

// ChainUnary chains interceptors as grpc.ChainUnaryInterceptor does: the
// first is the outermost.
func ChainUnary(ints ...grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		next := handler
		for i := len(ints) - 1; i >= 0; i-- {
			ic, inner := ints[i], next
			next = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, inner) }
		}
		return next(ctx, req)
	}
}
