package agent

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/berth-dev/berth/internal/edge"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// healthService is the gRPC health service, open without a token.
const healthService = "/grpc.health.v1.Health/"

// tokenChecker compares bearer tokens with the configured one in constant
// time. An empty token disables authentication (only with Config.NoAuth).
type tokenChecker struct {
	sum     [32]byte
	enabled bool
}

func newTokenChecker(token string) tokenChecker {
	if token == "" {
		return tokenChecker{}
	}
	return tokenChecker{sum: sha256.Sum256([]byte(token)), enabled: true}
}

// ok reports whether header (an Authorization value) carries the token.
// Hashing both sides first makes the comparison constant-time whatever the
// lengths.
func (t tokenChecker) ok(header string) bool {
	if !t.enabled {
		return true
	}
	const prefix = "bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(header[len(prefix):])))
	return subtle.ConstantTimeCompare(got[:], t.sum[:]) == 1
}

func (t tokenChecker) checkGRPC(ctx context.Context, method string) error {
	if !t.enabled || strings.HasPrefix(method, healthService) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if t.ok(v) {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "missing or invalid bearer token (send 'authorization: Bearer TOKEN')")
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

// httpMiddleware rejects HTTP requests without the token, except /healthz.
func (t tokenChecker) httpMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || t.ok(r.Header.Get("Authorization")) {
			next.ServeHTTP(w, r)
			return
		}
		// Read what is left of a body first, so that clients which send it
		// whole before reading (Python's urllib) see the 401, not a reset.
		edge.DrainBody(w, r, false)
		w.Header().Set("WWW-Authenticate", `Bearer realm="berth-agent"`)
		writeJSONError(w, status.New(codes.Unauthenticated, "missing or invalid bearer token (send 'Authorization: Bearer TOKEN')"))
	})
}
