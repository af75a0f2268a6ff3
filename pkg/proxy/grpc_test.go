package proxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// serveGRPC serves a gRPC server built the way the orchestrator builds
// its own: the proxy as the unknown-service handler, the passthrough codec,
// and a service of its own (health) that must keep working. It returns the
// listener's address.
func serveGRPC(t testing.TB, p *proxy.Proxy) string {
	t.Helper()
	gs := grpc.NewServer(
		grpc.ChainStreamInterceptor(p.StreamInterceptor()),
		grpc.UnknownServiceHandler(p.GRPCHandler()),
		grpc.ForceServerCodecV2(p.Codec()),
		grpc.MaxRecvMsgSize(24<<20),
	)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	reflection.Register(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

func dialGRPC(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// leaseCtx returns ctx carrying the lease and token metadata.
func leaseCtx(ctx context.Context, id, tok string) context.Context {
	kv := []string{}
	if id != "" {
		kv = append(kv, proxy.LeaseMetadata, id)
	}
	if tok != "" {
		kv = append(kv, "authorization", "Bearer "+tok)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func TestGRPCAgentCalls(t *testing.T) {
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "grpc", "")
	_, tokB := e.acquire(t, "grpc-b", "")
	cc := dialGRPC(t, serveGRPC(t, e.proxy))
	proc := agentv1.NewProcessServiceClient(cc)
	files := agentv1.NewFileServiceClient(cc)
	ctx := leaseCtx(context.Background(), id, tok)

	// Unary.
	res, err := proc.Exec(ctx, &agentv1.ExecRequest{Command: "echo hi; echo oops >&2; exit 4"})
	if err != nil || res.ExitCode != 4 || res.Stdout != "hi\n" || res.Stderr != "oops\n" {
		t.Fatalf("Exec: %v %v", res, err)
	}

	// Server streaming, incremental.
	start := time.Now()
	st, err := proc.ExecStream(ctx, &agentv1.ExecRequest{Command: "echo first; sleep 1; echo second"})
	if err != nil {
		t.Fatal(err)
	}
	var firstAt time.Duration
	var out strings.Builder
	var exited *agentv1.Exited
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if b := ev.GetStdout(); b != nil {
			if firstAt == 0 {
				firstAt = time.Since(start)
			}
			out.Write(b)
		}
		if x := ev.GetExited(); x != nil {
			exited = x
		}
	}
	if out.String() != "first\nsecond\n" || exited == nil || firstAt > 800*time.Millisecond {
		t.Errorf("ExecStream: out %q exited %v, first output after %s", out.String(), exited, firstAt)
	}

	// Client streaming: 8 MiB in 1 MiB chunks, then server streaming back.
	path := filepath.Join(t.TempDir(), "up.bin")
	up, err := files.Upload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: path}}}); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{1})
	for range 8 {
		chunk := make([]byte, 1<<20)
		rng.Read(chunk)
		h.Write(chunk)
		if err := up.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk}}); err != nil {
			t.Fatal(err)
		}
	}
	ur, err := up.CloseAndRecv()
	sum := hex.EncodeToString(h.Sum(nil))
	if err != nil || ur.Size != 8<<20 || ur.Sha256 != sum {
		t.Fatalf("Upload: %v %v, want sha256 %s", ur, err, sum)
	}
	dl, err := files.Download(ctx, &agentv1.DownloadRequest{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	for {
		m, err := dl.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		h.Write(m.Chunk)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		t.Errorf("Download sha256 %s, want %s", got, sum)
	}

	// An error status from the agent passes through.
	if _, err := files.Stat(ctx, &agentv1.StatRequest{Path: "/nonexistent-berth-proxy"}); status.Code(err) != codes.NotFound {
		t.Errorf("Stat of a missing file: %v", err)
	}

	// The :authority form, with the operator token.
	byHost := dialGRPC(t, strings.TrimPrefix(cc.Target(), "passthrough:///"), grpc.WithAuthority(id+"."+domain))
	if _, err := agentv1.NewInfoServiceClient(byHost).GetInfo(leaseCtx(context.Background(), "", opToken), &agentv1.GetInfoRequest{}); err != nil {
		t.Errorf("GetInfo by authority: %v", err)
	}

	// Auth and routing errors.
	unknown := strings.Repeat("1", 26)
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		want    codes.Code
		message string
	}{
		{"no token", leaseCtx(context.Background(), id, ""), codes.Unauthenticated, "missing token"},
		{"wrong token", leaseCtx(context.Background(), id, "nope"), codes.Unauthenticated, "invalid token"},
		{"another lease's token", leaseCtx(context.Background(), id, tokB), codes.Unauthenticated, "another lease"},
		{"unknown lease", leaseCtx(context.Background(), unknown, opToken), codes.NotFound, "no lease"},
		{"no lease", leaseCtx(context.Background(), "", tok), codes.Unimplemented, proxy.LeaseMetadata},
	} {
		_, err := proc.Exec(tc.ctx, &agentv1.ExecRequest{Argv: []string{"true"}})
		if s := status.Convert(err); s.Code() != tc.want || !strings.Contains(s.Message(), tc.message) {
			t.Errorf("%s: %v, want %s %q", tc.name, err, tc.want, tc.message)
		}
	}

	// Reflection with x-berth-lease describes the agent; without, the server.
	listServices := func(ctx context.Context) []string {
		rs, err := rpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := rs.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
			t.Fatal(err)
		}
		resp, err := rs.Recv()
		if err != nil {
			t.Fatal(err)
		}
		rs.CloseSend()
		if _, err := rs.Recv(); !errors.Is(err, io.EOF) {
			t.Errorf("reflection end: %v", err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.Name)
		}
		return names
	}
	if names := strings.Join(listServices(ctx), " "); !strings.Contains(names, "berth.agent.v1.ProcessService") {
		t.Errorf("reflection through the proxy lists %s", names)
	}
	if names := strings.Join(listServices(context.Background()), " "); strings.Contains(names, "berth.agent.v1") || !strings.Contains(names, "grpc.health.v1.Health") {
		t.Errorf("the server's own reflection lists %s", names)
	}

	// The server's own services still work with the passthrough codec.
	if r, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v %v", r, err)
	}
	st2 := e.proxy.Stats()
	if st2.GRPC[codes.OK] != 6 || st2.GRPC[codes.Unauthenticated] != 3 || st2.GRPC[codes.NotFound] != 2 {
		t.Errorf("grpc stats %+v", st2.GRPC)
	}
}

func TestGRPCReleasedAndCancel(t *testing.T) {
	e := newEnv(t, nil)
	id, tok := e.acquire(t, "grpc-cancel", "")
	cc := dialGRPC(t, serveGRPC(t, e.proxy))
	proc := agentv1.NewProcessServiceClient(cc)

	// A client that goes away cancels the agent's command.
	arg := fmt.Sprintf("32.%06d", rand.IntN(1e6))
	ctx, cancel := context.WithCancel(leaseCtx(context.Background(), id, tok))
	st, err := proc.ExecStream(ctx, &agentv1.ExecRequest{Argv: []string{"sleep", arg}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil { // started
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "sleep to start", func() bool { return len(procsWith("sleep", arg)) > 0 })
	cancel()
	eventually(t, 10*time.Second, "sleep "+arg+" to be killed", func() bool { return len(procsWith("sleep", arg)) == 0 })
	eventually(t, 5*time.Second, "the cancel to be logged", func() bool { return strings.Contains(e.logs.String(), "client went away") })

	if r := do(t, "DELETE", e.orch.Base+"/v1/leases/"+id, "", bearerHdr(opToken), ""); r.code != 200 {
		t.Fatalf("release: %d", r.code)
	}
	_, err = proc.Exec(leaseCtx(context.Background(), id, tok), &agentv1.ExecRequest{Argv: []string{"true"}})
	if s := status.Convert(err); s.Code() != codes.FailedPrecondition || !strings.Contains(s.Message(), "RELEASED") {
		t.Errorf("released: %v", err)
	}
}

// echoService is a bidi-streaming service of the fake agent: it checks the
// forwarded metadata, echoes every message, sends a header and a trailer,
// and ends with an error status carrying a detail.
func echoService(t *testing.T, agentToken string) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "test.Echo",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName: "Bidi", ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				md, _ := metadata.FromIncomingContext(ss.Context())
				if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+agentToken {
					return status.Errorf(codes.Unauthenticated, "agent got authorization %q", got)
				}
				if len(md.Get(proxy.LeaseMetadata)) != 0 || len(md.Get("x-custom")) != 1 {
					return status.Errorf(codes.InvalidArgument, "agent got metadata %v", md)
				}
				if err := ss.SendHeader(metadata.Pairs("x-hdr", "h")); err != nil {
					return err
				}
				n := 0
				for {
					m := new(wrapperspb.StringValue)
					if err := ss.RecvMsg(m); errors.Is(err, io.EOF) {
						break
					} else if err != nil {
						return err
					}
					n++
					if err := ss.SendMsg(wrapperspb.String("echo:" + m.Value)); err != nil {
						return err
					}
				}
				ss.SetTrailer(metadata.Pairs("x-trl", "t"))
				s, _ := status.New(codes.Aborted, fmt.Sprintf("done after %d", n)).WithDetails(&errdetails.ErrorInfo{Reason: "ECHO_DONE"})
				return s.Err()
			},
		}},
	}
}

func TestGRPCBidiPassthrough(t *testing.T) {
	fr := newFakeRouter()
	id := fakeID(3)
	agent := grpc.NewServer()
	agent.RegisterService(echoService(t, "agent-"+id), struct{}{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go agent.Serve(ln)
	defer agent.Stop()
	fr.set(id, lease.Route{State: lease.StateReady, Endpoint: ln.Addr().String()})
	e := mountProxy(t, nil, fr, func(c *proxy.Config) { c.TouchInterval = 50 * time.Millisecond })
	cc := dialGRPC(t, serveGRPC(t, e.proxy))

	ctx := metadata.AppendToOutgoingContext(leaseCtx(context.Background(), id, fakeToken(id)), "x-custom", "c")
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/test.Echo/Bidi")
	if err != nil {
		t.Fatal(err)
	}
	// Ping-pong proves messages flow both ways before the half-close.
	for _, s := range []string{"a", "b", "c"} {
		if err := cs.SendMsg(wrapperspb.String(s)); err != nil {
			t.Fatal(err)
		}
		m := new(wrapperspb.StringValue)
		if err := cs.RecvMsg(m); err != nil || m.Value != "echo:"+s {
			t.Fatalf("echo %s: %v %v", s, m, err)
		}
		time.Sleep(60 * time.Millisecond) // long enough for the stream to touch the lease
	}
	if hdr, err := cs.Header(); err != nil || strings.Join(hdr.Get("x-hdr"), "") != "h" {
		t.Errorf("header %v %v", hdr, err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	err = cs.RecvMsg(new(wrapperspb.StringValue))
	s := status.Convert(err)
	if s.Code() != codes.Aborted || s.Message() != "done after 3" || len(s.Details()) != 1 {
		t.Errorf("status %v details %v", s, s.Details())
	} else if info, ok := s.Details()[0].(*errdetails.ErrorInfo); !ok || info.Reason != "ECHO_DONE" {
		t.Errorf("detail %v", s.Details()[0])
	}
	if tr := cs.Trailer(); strings.Join(tr.Get("x-trl"), "") != "t" {
		t.Errorf("trailer %v", tr)
	}
	if n := fr.touched(id); n < 4 {
		t.Errorf("a 180ms stream with a 50ms touch interval touched the lease %d times", n)
	}

	// The agent unreachable: UNAVAILABLE.
	agent.Stop()
	_, err = agentv1.NewProcessServiceClient(cc).Exec(leaseCtx(context.Background(), id, fakeToken(id)), &agentv1.ExecRequest{Argv: []string{"true"}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("stopped agent: %v", err)
	}
}
