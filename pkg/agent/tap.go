package agent

import (
	"context"

	"google.golang.org/grpc/tap"
)

// tap refuses a call without the token from its headers alone, before its
// request message is read: an unauthenticated caller cannot make the agent
// read a large message. Health stays open. The interceptors check again.
func (t tokenChecker) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	return ctx, t.checkMD(info.Header, info.FullMethodName)
}
