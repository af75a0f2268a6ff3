package edge

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Recoverer turns panics into INTERNAL errors (HTTP 500) and logs them
// with their stack, so no panic reaches the wire or kills the server.
type Recoverer struct {
	// Log receives the panics.
	Log *slog.Logger
}

// Unary is the unary server interceptor.
func (r Recoverer) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			r.Log.Error("panic in handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
			resp, err = nil, status.Error(codes.Internal, "internal error")
		}
	}()
	return h(ctx, req)
}

// Stream is the stream server interceptor.
func (r Recoverer) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.Log.Error("panic in handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
	}()
	return h(srv, ss)
}

// HTTP wraps an HTTP handler.
func (r Recoverer) HTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				r.Log.Error("panic in http handler", "path", req.URL.Path, "panic", p, "stack", string(debug.Stack()))
				WriteJSONError(w, status.New(codes.Internal, "internal error"))
			}
		}()
		next.ServeHTTP(w, req)
	})
}
