package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/berth-dev/berth/pkg/lease"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// frame is one gRPC message in wire format, passed through the proxy
// without being decoded. Only the codec knows how to fill and send it.
type frame struct {
	data mem.BufferSlice
}

// codec passes frames through and delegates every other message to the
// standard proto codec.
type codec struct {
	proto encoding.CodecV2
}

var passthrough = &codec{proto: encoding.GetCodecV2(protoenc.Name)}

// Codec returns the codec the orchestrator's gRPC server must be built with
// (grpc.ForceServerCodecV2(p.Codec())) for GRPCHandler to receive raw
// frames. It is the standard proto codec for every other message, so the
// server's own services are unaffected. Its name is "proto".
func (p *Proxy) Codec() encoding.CodecV2 { return passthrough }

// Marshal returns a frame's buffers (handing its reference to gRPC) or
// marshals a proto message.
func (c *codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		out := f.data
		f.data = nil
		return out, nil
	}
	return c.proto.Marshal(v)
}

// Unmarshal keeps a reference to the wire bytes in a frame, or unmarshals a
// proto message.
func (c *codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		data.Ref()
		f.data = data
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// Name is "proto", the content-subtype the frames are relayed with.
func (c *codec) Name() string { return protoenc.Name }

// GRPCHandler returns the handler to install with
// grpc.UnknownServiceHandler: it forwards any call that names a lease (in
// metadata x-berth-lease, or by :authority {lease}.{Domain}) to that lease's
// agent, for all four kinds of RPC, without decoding messages. It checks the
// token itself (metadata authorization "Bearer TOKEN" or x-berth-token: the
// lease's token or the operator token), strips it and x-berth-lease, and
// sends the agent's token instead; other metadata, headers, trailers and
// the status pass through both ways. A client that goes away cancels the
// upstream call.
func (p *Proxy) GRPCHandler() grpc.StreamHandler { return p.timedGRPC }

var bidi = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// StreamInterceptor returns a stream interceptor that sends gRPC server
// reflection calls carrying x-berth-lease metadata to that lease's agent
// instead of the server's own reflection service, so that
// "grpcurl -H 'x-berth-lease: ID' -H 'authorization: Bearer TOKEN' ADDR
// list" lists and describes the agent's API through the orchestrator.
// Streaming calls are decoded only when the handler receives, so the
// frames pass through untouched. The diverted calls are authenticated by
// the proxy; install the interceptor before the server's own
// authentication (which may refuse reflection to lease tokens). Every
// other call goes on down the chain.
func (p *Proxy) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		if strings.HasPrefix(info.FullMethod, "/grpc.reflection.") {
			if md, _ := metadata.FromIncomingContext(ss.Context()); len(md.Get(LeaseMetadata)) > 0 {
				return p.handleGRPC(srv, ss)
			}
		}
		return next(srv, ss)
	}
}

// handleGRPC is the gRPC edge of the proxy: it resolves the call to a
// lease's agent (resolveGRPC), relays it (relayGRPC), and turns the
// proxy's own errors into statuses (errgrpc) once, here.
func (p *Proxy) handleGRPC(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return errgrpc.ToGRPC(errdefs.Newf(errdefs.ErrInternal, "proxy: no method in stream"))
	}
	c, err := p.resolveGRPC(ss.Context(), method)
	if err != nil {
		err = errgrpc.ToGRPC(err)
		p.metrics.grpc(status.Code(err))
		return err
	}
	return p.relayGRPC(ss, c)
}

// grpcCall is a call resolved to the agent it goes to.
type grpcCall struct {
	id, method string
	md         metadata.MD // the caller's metadata
	rt         lease.Route
	budget     *grpcUploadBudget // an upload held to the lease's disk limit
	release    func()            // gives back the call's stream slot (streams.go)
	hold       *lease.Hold       // the lease's hold (auth.go, open); relayGRPC ends it
}

// resolveGRPC finds the lease a call names (metadata x-berth-lease, or the
// :authority {lease}.{Domain}), authorizes the caller's token for it and
// checks that it can take the call (open), and sets the disk budget of an
// upload.
func (p *Proxy) resolveGRPC(ctx context.Context, method string) (*grpcCall, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	id := firstMD(md, LeaseMetadata)
	if id == "" {
		if label, ok := p.hostLabel(firstMD(md, ":authority")); ok {
			if port, lid, ok := parseHostLabel(label); ok && port == 0 {
				id = lid
			}
		}
	}
	if id == "" {
		// To the caller this is a method the server does not have; no
		// errdefs category means "no such method", so the transport's own
		// status is made here, at the edge.
		return nil, status.Errorf(codes.Unimplemented, "unknown method %s (to call a sandbox's agent, send metadata %s: LEASE_ID)", method, LeaseMetadata)
	}
	var ts tokens
	ts.addAll(md.Get(bearer.MetadataKey), md.Get(TokenMetadata))
	remote := ""
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		remote = pr.Addr.String()
	}
	op, rerr := p.open(ctx, id, &ts, 0, origin{"grpc", "POST", method, remote})
	if rerr != nil {
		if errdefs.IsInternal(rerr) || errdefs.IsUnavailable(rerr) && rerr.state == "" {
			p.log.Warn("proxy error", "lease_id", id, "method", method, "code", rerr.code().String(), "error", rerr.Error())
		}
		return nil, rerr
	}
	if rerr := orchestratorOnly(method); rerr != nil { // orchestratoronly.go
		op.hold.Done()
		return nil, rerr
	}
	budget, berr := limitGRPCUpload(method, id, op.rt)
	if berr != nil {
		op.hold.Done()
		p.log.Info("upload refused: disk limit", "lease_id", id, "method", method)
		return nil, berr
	}
	release, rerr := p.acquireStream(id, op.acc, method) // streams.go
	if rerr != nil {
		op.hold.Done()
		return nil, rerr
	}
	return &grpcCall{id: id, method: method, md: md, rt: op.rt, budget: budget, release: release, hold: op.hold}, nil
}

// relayGRPC calls c's agent with the caller's metadata (its token swapped
// for the agent's) and pumps the frames both ways until either side ends;
// the agent's headers, trailers and status come back as they are.
func (p *Proxy) relayGRPC(ss grpc.ServerStream, c *grpcCall) (err error) {
	ctx := ss.Context()
	id, method, budget := c.id, c.method, c.budget
	defer c.release()
	defer c.hold.Done()
	stop := p.track(id)
	p.metrics.inFlight.Add(1)
	defer func() {
		err = errgrpc.ToGRPC(err)
		p.metrics.inFlight.Add(-1)
		stop()
		p.metrics.grpc(status.Code(err))
	}()

	cc, release, err := p.pool.get(c.rt.Endpoint)
	if err != nil {
		p.log.Warn("proxy upstream error", "lease_id", id, "method", method, "upstream", c.rt.Endpoint, "error", err.Error())
		return errdefs.Newf(errdefs.ErrUnavailable, "agent of lease %s unreachable: %v", id, err)
	}
	defer release()

	uctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, p.upstreamMD(c)))
	defer cancel()

	cs, err := cc.NewStream(uctx, bidi, method)
	if err != nil {
		return p.upstreamErr(ctx, id, method, err)
	}
	if longStream(method) {
		// A terminal or a watch may stay silent as long as it likes: a
		// pause does not wait for its first answer (auth.go, admit).
		c.hold.Answered()
	}
	go p.pumpUp(ss, cs, budget, cancel)

	// agent → client
	hdr, _ := cs.Header()
	c.hold.Answered() // the agent answered (or the call failed): a pause may go on
	if hdr != nil {
		if err := ss.SendHeader(hdr); err != nil {
			cancel()
			return p.upstreamErr(ctx, id, method, err)
		}
	}
	for {
		f := new(frame)
		rerr := cs.RecvMsg(f)
		if rerr != nil {
			if budget != nil && budget.exceeded.Load() {
				p.log.Info("upload refused: disk limit", "lease_id", id, "method", method)
				return errdefs.Newf(errdefs.ErrResourceExhausted, "%s", budget.msg)
			}
			ss.SetTrailer(cs.Trailer())
			if errors.Is(rerr, io.EOF) {
				if budget != nil {
					p.chargeDisk(id, budget.sent())
				}
				return nil
			}
			return p.upstreamErr(ctx, id, method, rerr)
		}
		if err := ss.SendMsg(f); err != nil {
			f.data.Free()
			cancel()
			return p.upstreamErr(ctx, id, method, err)
		}
	}
}

// upstreamMD is the metadata sent to c's agent: the caller's, without its
// token, the lease name and the transport's own keys, with the agent's
// token.
func (p *Proxy) upstreamMD(c *grpcCall) metadata.MD {
	out := metadata.MD{}
	for k, v := range c.md {
		switch k {
		case bearer.MetadataKey, LeaseMetadata, TokenMetadata, ":authority", "user-agent", "content-type", "te", "grpc-timeout":
			continue
		}
		out[k] = v
	}
	out[bearer.MetadataKey] = []string{"Bearer " + p.leaseTokens.AgentToken(c.id)}
	return out
}

// pumpUp relays the client's frames to the agent until the client
// half-closes (then it half-closes upstream), goes away or passes the
// upload budget (then it cancels the agent's side).
func (p *Proxy) pumpUp(ss grpc.ServerStream, cs grpc.ClientStream, budget *grpcUploadBudget, cancel context.CancelFunc) {
	for {
		f := new(frame)
		if err := ss.RecvMsg(f); err != nil {
			if errors.Is(err, io.EOF) {
				_ = cs.CloseSend() // half-close: the client has sent everything
			} else {
				cancel() // the client is gone or broken: cancel the agent's side
			}
			return
		}
		if budget != nil && !budget.add(f.data.Len()) {
			// Past the disk limit: cancel the agent's side, whose
			// atomic upload then leaves nothing behind.
			f.data.Free()
			cancel()
			return
		}
		if err := cs.SendMsg(f); err != nil {
			f.data.Free()
			// io.EOF: the agent ended the call; its status comes from RecvMsg.
			return
		}
	}
}

// upstreamErr returns the status of a failed call, logging clients that
// went away and agents that could not be reached.
func (p *Proxy) upstreamErr(ctx context.Context, id, method string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.Canceled) {
			p.log.Info("client went away", "lease_id", id, "method", method, "status", StatusClientClosedRequest)
		}
		// The client's own deadline (grpc-timeout) was propagated upstream.
		return status.FromContextError(cerr).Err()
	}
	st := status.Convert(err)
	if st.Code() == codes.Unavailable {
		p.log.Warn("proxy upstream error", "lease_id", id, "method", method, "code", st.Code().String(), "error", st.Message())
	}
	return st.Err()
}

func firstMD(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return strings.TrimSpace(v[0])
	}
	return ""
}

// connPool caches one client connection per agent endpoint and closes
// those that stayed unused for Config.ConnIdleTimeout.
type connPool struct {
	p         *Proxy
	mu        sync.Mutex
	conns     map[string]*pooledConn
	lastSweep time.Time
	closed    bool
}

type pooledConn struct {
	cc       *grpc.ClientConn
	refs     int
	lastUsed time.Time
}

func (cp *connPool) init(p *Proxy) {
	cp.p = p
	cp.conns = map[string]*pooledConn{}
	cp.lastSweep = time.Now()
}

// get returns the connection to endpoint (creating it lazily: grpc
// connects on the first call) and a release func.
func (cp *connPool) get(endpoint string) (*grpc.ClientConn, func(), error) {
	now := time.Now()
	cp.mu.Lock()
	if cp.closed {
		cp.mu.Unlock()
		return nil, nil, errors.New("proxy closed")
	}
	var idle []*grpc.ClientConn
	if now.Sub(cp.lastSweep) > cp.p.cfg.ConnIdleTimeout/2 {
		cp.lastSweep = now
		for ep, pc := range cp.conns {
			if pc.refs == 0 && now.Sub(pc.lastUsed) > cp.p.cfg.ConnIdleTimeout {
				idle = append(idle, pc.cc)
				delete(cp.conns, ep)
			}
		}
	}
	pc := cp.conns[endpoint]
	if pc == nil {
		cc, err := cp.dial(endpoint)
		if err != nil {
			cp.mu.Unlock()
			return nil, nil, err
		}
		pc = &pooledConn{cc: cc}
		cp.conns[endpoint] = pc
	}
	pc.refs++
	cp.mu.Unlock()
	for _, cc := range idle {
		_ = cc.Close()
	}
	release := func() {
		cp.mu.Lock()
		pc.refs--
		pc.lastUsed = time.Now()
		cp.mu.Unlock()
	}
	return pc.cc, release, nil
}

func (cp *connPool) dial(endpoint string) (*grpc.ClientConn, error) {
	cfg := &cp.p.cfg
	d := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	cc, err := grpc.NewClient("passthrough:///"+endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: cfg.DialTimeout,
		}),
		// Never re-send a call: the proxy does not know what is safe to repeat.
		grpc.WithDisableRetry(),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(passthrough),
			grpc.MaxCallRecvMsgSize(cfg.MaxMessageSize),
			grpc.MaxCallSendMsgSize(cfg.MaxMessageSize),
		),
		grpc.WithUserAgent("berth-proxy"),
	)
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", endpoint, err)
	}
	return cc, nil
}

func (cp *connPool) closeAll() error {
	cp.mu.Lock()
	cp.closed = true
	conns := cp.conns
	cp.conns = map[string]*pooledConn{}
	cp.mu.Unlock()
	var errs []error
	for _, pc := range conns {
		if err := pc.cc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
