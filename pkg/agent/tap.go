package agent

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// tap refuses a call without the token from its headers alone, before its
// request message is read: an unauthenticated caller cannot make the agent
// read a large message. Health stays open. The interceptors check again.
func (t tokenChecker) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !t.enabled || strings.HasPrefix(info.FullMethodName, healthService) {
		return ctx, nil
	}
	for _, v := range info.Header.Get("authorization") {
		if t.ok(v) {
			return ctx, nil
		}
	}
	return ctx, status.Error(codes.Unauthenticated, "missing or invalid bearer token (send 'authorization: Bearer TOKEN')")
}
