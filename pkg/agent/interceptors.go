package agent

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recoverer turns panics into INTERNAL errors (and HTTP 500s) and logs them
// with their stack, so no panic reaches the wire or kills the agent.
type recoverer struct{ log *slog.Logger }

func (r recoverer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("panic in handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
			resp, err = nil, status.Error(codes.Internal, "internal error")
		}
	}()
	return handler(ctx, req)
}

func (r recoverer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("panic in handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
	}()
	return handler(srv, ss)
}

func (r recoverer) httpMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				r.log.Error("panic in http handler", "path", req.URL.Path, "panic", p, "stack", string(debug.Stack()))
				writeJSONError(w, status.New(codes.Internal, "internal error"))
			}
		}()
		next.ServeHTTP(w, req)
	})
}
