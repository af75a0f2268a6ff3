package edge

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// healthProbe is a Health server that records what its Check sees.
type healthProbe struct {
	healthpb.UnimplementedHealthServer
	in, out metadata.MD
	method  string
	req     *healthpb.HealthCheckRequest
	resp    *healthpb.HealthCheckResponse
}

func (h *healthProbe) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.in, _ = metadata.FromIncomingContext(ctx)
	h.out, _ = metadata.FromOutgoingContext(ctx)
	h.method, _ = grpc.Method(ctx)
	h.req = req
	switch req.GetService() {
	case "plain-error":
		return nil, errors.New("boom")
	case "not-found":
		return nil, status.Error(codes.NotFound, "no such service")
	case "cancelled":
		return nil, context.Canceled
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-header", "h")); err != nil {
		return nil, err
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t")); err != nil {
		return nil, err
	}
	h.resp = &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}
	return h.resp, nil
}

// recordingConn is the Streams of a Direct under test: it records the
// methods sent to it.
type recordingConn struct{ methods []string }

func (c *recordingConn) Invoke(_ context.Context, method string, _, _ any, _ ...grpc.CallOption) error {
	c.methods = append(c.methods, method)
	return nil
}

func (c *recordingConn) NewStream(_ context.Context, _ *grpc.StreamDesc, method string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
	c.methods = append(c.methods, method)
	return nil, errors.New("recordingConn: no streams")
}

// TestDirectCallsThroughTheInterceptors: a direct call runs the
// interceptors in grpc.ChainUnaryInterceptor's order, gives the handler the
// caller's metadata as incoming and none as outgoing, its method, copies of
// the messages, and hands headers and trailers to the call options.
func TestDirectCallsThroughTheInterceptors(t *testing.T) {
	var order []string
	mark := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			order = append(order, name+":"+info.FullMethod)
			return h(ctx, req)
		}
	}
	streams := &recordingConn{}
	d := NewDirect(streams, mark("outer"), mark("inner"))
	probe := &healthProbe{}
	healthpb.RegisterHealthServer(d, probe)

	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok")
	req := &healthpb.HealthCheckRequest{Service: "svc"}
	var header, trailer metadata.MD
	resp, err := healthpb.NewHealthClient(d).Check(ctx, req, grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		t.Fatal(err)
	}
	const method = "/grpc.health.v1.Health/Check"
	if want := []string{"outer:" + method, "inner:" + method}; len(order) != 2 || order[0] != want[0] || order[1] != want[1] {
		t.Errorf("interceptors ran %v, want %v", order, want)
	}
	if got := probe.in.Get("authorization"); len(got) != 1 || got[0] != "Bearer tok" {
		t.Errorf("handler's incoming authorization = %v", got)
	}
	if len(probe.out) != 0 {
		t.Errorf("handler's outgoing metadata = %v, want none (the caller's credentials must not travel on)", probe.out)
	}
	if probe.method != method {
		t.Errorf("grpc.Method = %q, want %q", probe.method, method)
	}
	if probe.req == req || probe.req.GetService() != "svc" {
		t.Errorf("handler got %p %v; want a copy of %p", probe.req, probe.req, req)
	}
	if resp == probe.resp || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("caller got %p %v; want a copy of %p", resp, resp, probe.resp)
	}
	if got := header.Get("x-header"); len(got) != 1 || got[0] != "h" {
		t.Errorf("header = %v", header)
	}
	if got := trailer.Get("x-trailer"); len(got) != 1 || got[0] != "t" {
		t.Errorf("trailer = %v", trailer)
	}
	if len(streams.methods) != 0 {
		t.Errorf("Streams saw %v, want nothing", streams.methods)
	}
}

// TestDirectErrorsAreStatuses: a handler's error reaches the caller as the
// server would send it: statuses unchanged, context errors as their codes,
// anything else as Unknown.
func TestDirectErrorsAreStatuses(t *testing.T) {
	d := NewDirect(&recordingConn{})
	healthpb.RegisterHealthServer(d, &healthProbe{})
	c := healthpb.NewHealthClient(d)
	for svc, want := range map[string]codes.Code{"plain-error": codes.Unknown, "not-found": codes.NotFound, "cancelled": codes.Canceled} {
		_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if s, ok := status.FromError(err); !ok || s.Code() != want {
			t.Errorf("%s: error %v, want code %s", svc, err, want)
		}
	}
}

// TestDirectSendsStreamsAndOtherServicesOver: streams, and methods of
// services not registered, go to Streams.
func TestDirectSendsStreamsAndOtherServicesOver(t *testing.T) {
	streams := &recordingConn{}
	d := NewDirect(streams)
	healthpb.RegisterHealthServer(d, &healthProbe{})
	_, _ = healthpb.NewHealthClient(d).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err := d.Invoke(context.Background(), "/other.Service/Call", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"/grpc.health.v1.Health/Watch", "/other.Service/Call"}
	if len(streams.methods) != 2 || streams.methods[0] != want[0] || streams.methods[1] != want[1] {
		t.Errorf("Streams saw %v, want %v", streams.methods, want)
	}
}
