package edge

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"google.golang.org/grpc"
)

// errPanic is the answer to a call whose handler panicked; the panic
// itself is logged, never sent.
var errPanic = errdefs.Newf(errdefs.ErrInternal, "internal error")

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
			resp, err = nil, errgrpc.ToGRPC(errPanic)
		}
	}()
	return h(ctx, req)
}

// Stream is the stream server interceptor.
func (r Recoverer) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.Log.Error("panic in handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
			err = errgrpc.ToGRPC(errPanic)
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
				WriteError(w, errPanic)
			}
		}()
		next.ServeHTTP(w, req)
	})
}
