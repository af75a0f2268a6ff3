package agent

import (
	"context"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/agent/openhands"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// healthService is the gRPC health service, open without a token.
const healthService = "/grpc.health.v1.Health/"

// Answers to a call or request without the token; the gRPC one names the
// metadata key, the HTTP one the header.
var (
	errUnauthenticatedGRPC = errdefs.Newf(errdefs.ErrUnauthenticated, "missing or invalid bearer token (send 'authorization: Bearer TOKEN')")
	errUnauthenticatedHTTP = errdefs.Newf(errdefs.ErrUnauthenticated, "missing or invalid bearer token (send 'Authorization: Bearer TOKEN')")
)

// tokenChecker compares bearer tokens with the configured one in constant
// time (bearer.Secret). An empty token disables authentication (only with
// Config.NoAuth).
type tokenChecker struct {
	secret bearer.Secret
}

func newTokenChecker(token string) tokenChecker {
	return tokenChecker{secret: bearer.NewSecret(token)}
}

// ok reports whether header (an Authorization value) carries the token.
func (t tokenChecker) ok(header string) bool {
	if !t.secret.IsSet() {
		return true
	}
	tok, ok := bearer.Parse(header)
	return ok && t.secret.Matches(tok)
}

// checkMD is the gRPC check of the tap and the interceptors: health is
// open, every other method needs the token in md's authorization. The
// error is already a status: the tap and the interceptors are the edge.
func (t tokenChecker) checkMD(md metadata.MD, method string) error {
	if !t.secret.IsSet() || strings.HasPrefix(method, healthService) {
		return nil
	}
	for tok := range bearer.FromMD(md) {
		if t.secret.Matches(tok) {
			return nil
		}
	}
	return errgrpc.ToGRPC(errUnauthenticatedGRPC)
}

func (t tokenChecker) checkGRPC(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	return t.checkMD(md, method)
}

func (t tokenChecker) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := t.checkGRPC(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (t tokenChecker) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := t.checkGRPC(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// sessionKeyHeader carries the token as OpenHands clients send it (their
// api_key), an alternative to "Authorization: Bearer TOKEN".
const sessionKeyHeader = "X-Session-API-Key"

// okHTTP reports whether r carries the token, as a bearer token or in
// X-Session-API-Key (both compared in constant time); a token found in the
// latter is copied to Authorization.
func (t tokenChecker) okHTTP(r *http.Request) bool {
	if t.ok(r.Header.Get(bearer.Header)) {
		return true
	}
	for _, v := range r.Header.Values(sessionKeyHeader) {
		if v = strings.TrimSpace(v); v != "" && t.secret.Matches(v) {
			// The REST gateway passes Authorization on to the gRPC
			// services, which check it again.
			r.Header.Set(bearer.Header, "Bearer "+v)
			return true
		}
	}
	return false
}

// httpMiddleware rejects HTTP requests without the token, except /healthz
// and the OpenHands health route (GET /health).
func (t tokenChecker) httpMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || (r.URL.Path == openhands.HealthPath && r.Method == http.MethodGet) || t.okHTTP(r) {
			next.ServeHTTP(w, r)
			return
		}
		// Read what is left of a body first, so that clients which send it
		// whole before reading (Python's urllib) see the 401, not a reset.
		edge.DrainBody(w, r, false)
		w.Header().Set("WWW-Authenticate", `Bearer realm="berth-agent"`)
		edge.WriteError(w, errUnauthenticatedHTTP)
	})
}
