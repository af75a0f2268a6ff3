package proxy_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// brokenRouter fails Route for one lease with an error of no category.
type brokenRouter struct {
	*fakeRouter
	broken string
}

func (b brokenRouter) Route(id string) (lease.Route, error) {
	if id == b.broken {
		return lease.Route{}, errors.New("store closed")
	}
	return b.fakeRouter.Route(id)
}

// TestRouteErrorMessages pins the status, code, message and state header
// of every answer the proxy decides itself, on the agent's REST routes,
// on previews (plain text) and over gRPC: clients match them, so they must
// not change when the errors are built from errdefs categories.
func TestRouteErrorMessages(t *testing.T) {
	fr := newFakeRouter()
	broken := fakeID(99)
	e := mountProxy(t, nil, brokenRouter{fr, broken}, nil)
	id := func(n int) string { return fakeID(n) }
	endpoint := closedPort(t)
	fr.set(id(1), lease.Route{State: lease.StateReleasing, Reason: "released by caller", Endpoint: endpoint})
	fr.set(id(2), lease.Route{State: lease.StatePending, Reason: "acquired"})
	fr.set(id(3), lease.Route{State: lease.StateFailed, Reason: "container died (exit 137)"})
	fr.set(id(4), lease.Route{State: lease.StateReady})
	fr.set(id(5), lease.Route{State: lease.State("BOGUS")})
	fr.set(id(6), lease.Route{State: lease.StateReady, Endpoint: "no-port"})
	fr.set(id(7), lease.Route{State: lease.StateReady, Endpoint: endpoint, DiskLimit: 100, DiskUsed: 100})
	fr.set(id(8), lease.Route{State: lease.StateReady, Endpoint: endpoint})
	unknown := id(50)

	for _, tc := range []struct {
		name, id, tok string
		status        int
		code          codes.Code
		state, msg    string
	}{
		{"no token", id(1), "", 401, codes.Unauthenticated, "", "missing token: send the lease token as 'Authorization: Bearer TOKEN'"},
		{"wrong token", id(1), "nope", 401, codes.Unauthenticated, "", "invalid token for lease " + id(1)},
		{"another lease's token", id(1), fakeToken(id(2)), 401, codes.Unauthenticated, "", "the token belongs to another lease, not " + id(1)},
		{"unknown lease", unknown, opToken, 404, codes.NotFound, "", "no lease " + unknown},
		{"bad lease id", "NOT-A-LEASE", opToken, 404, codes.NotFound, "", "no lease NOT-A-LEASE"},
		{"route fails", broken, opToken, 500, codes.Internal, "", "lease " + broken + ": store closed"},
		{"releasing", id(1), fakeToken(id(1)), 409, codes.FailedPrecondition, "RELEASING", "lease " + id(1) + " is RELEASING: released by caller"},
		{"pending", id(2), fakeToken(id(2)), 409, codes.Unavailable, "PENDING", "lease " + id(2) + " is PENDING (acquired): its sandbox is being started; retry shortly"},
		{"failed", id(3), opToken, 410, codes.FailedPrecondition, "FAILED", "lease " + id(3) + " is FAILED: container died (exit 137)"},
		{"no endpoint", id(4), fakeToken(id(4)), 502, codes.Unavailable, "", "lease " + id(4) + " has no agent endpoint"},
		{"unknown state", id(5), fakeToken(id(5)), 409, codes.FailedPrecondition, "BOGUS", "lease " + id(5) + " is BOGUS"},
	} {
		// REST: JSON {code, message}.
		r := do(t, "GET", e.sandboxURL(tc.id, "/v1/info"), "", bearerHdr(tc.tok), "")
		m := r.json(t)
		if r.code != tc.status || m["code"] != float64(tc.code) || m["message"] != tc.msg || r.header.Get(proxy.StateHeader) != tc.state {
			t.Errorf("REST %s: %d %s %s=%q, want %d {code %d, message %q} %q", tc.name, r.code, r.body,
				proxy.StateHeader, r.header.Get(proxy.StateHeader), tc.status, tc.code, tc.msg, tc.state)
		}
		// Preview: the same message as plain text.
		r = do(t, "GET", e.srv.URL+proxy.RoutePrefix+tc.id+"/ports/8080/", "", bearerHdr(tc.tok), "")
		if r.code != tc.status || string(r.body) != tc.msg+"\n" {
			t.Errorf("preview %s: %d %q, want %d %q", tc.name, r.code, r.body, tc.status, tc.msg+"\n")
		}
	}

	// Preview only: an endpoint without a port.
	r := do(t, "GET", e.srv.URL+proxy.RoutePrefix+id(6)+"/ports/8080/", "", bearerHdr(fakeToken(id(6))), "")
	if want := "lease " + id(6) + " has a bad endpoint \"no-port\"\n"; r.code != 502 || string(r.body) != want {
		t.Errorf("bad endpoint: %d %q, want 502 %q", r.code, r.body, want)
	}
	// REST upload past the disk limit: 507 with RESOURCE_EXHAUSTED.
	r = do(t, "PUT", e.sandboxURL(id(7), "/v1/files/a"), "", bearerHdr(fakeToken(id(7))), "data")
	if m := r.json(t); r.code != 507 || m["code"] != float64(codes.ResourceExhausted) ||
		m["message"] != "disk limit exceeded: lease "+id(7)+" has 100 of 100 bytes used; uploads are refused" {
		t.Errorf("upload past the disk limit: %d %s", r.code, r.body)
	}
	// An agent that cannot be reached: 502, UNAVAILABLE.
	r = do(t, "GET", e.sandboxURL(id(8), "/v1/info"), "", bearerHdr(fakeToken(id(8))), "")
	if m := r.json(t); r.code != 502 || m["code"] != float64(codes.Unavailable) ||
		m["message"] != "agent of lease "+id(8)+" unreachable: dial "+endpoint+": connection refused" {
		t.Errorf("unreachable agent: %d %s", r.code, r.body)
	}
	// Routes the proxy does not know.
	for path, want := range map[string]string{
		"/other":                                `{"code":5,"details":[],"message":"not a sandbox route: /other"}` + "\n",
		proxy.RoutePrefix + id(1) + "/ports/0/": `{"code":5,"details":[],"message":"bad preview port \"0\""}` + "\n",
	} {
		rec := httptest.NewRecorder()
		e.proxy.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 404 || rec.Body.String() != want {
			t.Errorf("%s: %d %q, want 404 %q", path, rec.Code, rec.Body.String(), want)
		}
	}

	// gRPC: the same codes and messages.
	cc := dialGRPC(t, serveGRPC(t, e.proxy))
	proc := agentv1.NewProcessServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, id, tok string
		code          codes.Code
		msg           string
	}{
		{"no lease named", "", opToken, codes.Unimplemented, "unknown method /berth.agent.v1.ProcessService/Exec (to call a sandbox's agent, send metadata x-berth-lease: LEASE_ID)"},
		{"no token", id(1), "", codes.Unauthenticated, "missing token: send the lease token as 'Authorization: Bearer TOKEN'"},
		{"another lease's token", id(1), fakeToken(id(2)), codes.Unauthenticated, "the token belongs to another lease, not " + id(1)},
		{"unknown lease", unknown, opToken, codes.NotFound, "no lease " + unknown},
		{"route fails", broken, opToken, codes.Internal, "lease " + broken + ": store closed"},
		{"pending", id(2), fakeToken(id(2)), codes.Unavailable, "lease " + id(2) + " is PENDING (acquired): its sandbox is being started; retry shortly"},
		{"failed", id(3), opToken, codes.FailedPrecondition, "lease " + id(3) + " is FAILED: container died (exit 137)"},
	} {
		_, err := proc.Exec(leaseCtx(ctx, tc.id, tc.tok), &agentv1.ExecRequest{Command: "true"})
		if st := status.Convert(err); st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("gRPC %s: %v %q, want %v %q", tc.name, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
	// An upload to a lease whose disk is full is refused before the agent is called.
	up, err := agentv1.NewFileServiceClient(cc).Upload(leaseCtx(ctx, id(7), fakeToken(id(7))))
	if err == nil {
		_, err = up.CloseAndRecv()
	}
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted ||
		st.Message() != "disk limit exceeded: lease "+id(7)+" has 100 of 100 bytes used; uploads are refused" {
		t.Errorf("gRPC upload past the disk limit: %v %q", st.Code(), st.Message())
	}
	// An agent that cannot be reached.
	_, err = proc.Exec(leaseCtx(ctx, id(8), fakeToken(id(8))), &agentv1.ExecRequest{Command: "true"})
	if st := status.Convert(err); st.Code() != codes.Unavailable {
		t.Errorf("gRPC unreachable agent: %v %q", st.Code(), st.Message())
	}
	st := e.proxy.Stats()
	if st.GRPC[codes.Unimplemented] != 1 || st.GRPC[codes.Internal] != 1 || st.GRPC[codes.ResourceExhausted] != 1 || st.GRPC[codes.Unauthenticated] != 2 {
		t.Errorf("gRPC stats = %+v", st.GRPC)
	}
}
