package proxy

import "context"

// ClassifyForTest exposes the HTTP status classify picks for err.
func ClassifyForTest(ctx context.Context, err error) int {
	st, _, _ := classify(ctx, err)
	return st
}
