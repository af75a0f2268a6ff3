package e2b

import orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"

// AcquireRequestOf maps a NewSandbox JSON body as create does.
func (h *Handler) AcquireRequestOf(body string) (*orchv1.AcquireRequest, error) {
	var req newSandbox
	if err := decodeString(body, &req); err != nil {
		return nil, err
	}
	return h.acquireRequest(&req)
}
