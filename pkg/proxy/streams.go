package proxy

import (
	"net/http"
	"path"

	"github.com/berth-dev/berth/pkg/streamlimit"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// Agent routes that hold a stream open as long as the client likes; each
// one counts in the caller's stream limit (Config.Streams).
const (
	terminalWSPath = "/v1/terminals/ws" // the terminal attach WebSocket
	fileWatchPath  = "/v1/files:watch"  // FileService.Watch over REST
)

// longStream reports whether method, a gRPC method name or a decoded
// agent HTTP path, is a terminal attach or a file watch.
func longStream(method string) bool {
	switch method {
	case agentv1.TerminalService_Connect_FullMethodName, agentv1.FileService_Watch_FullMethodName:
		return true
	}
	switch path.Clean(method) {
	case terminalWSPath, fileWatchPath, agentv1.TerminalService_Connect_FullMethodName, agentv1.FileService_Watch_FullMethodName:
		return true
	}
	return false
}

// streamCaller is the stream limiter's key of a caller let through to
// lease id: its lease token, or the operator token.
func streamCaller(id string, acc access) string {
	if acc == accessOperator {
		return streamlimit.Operator
	}
	return streamlimit.Lease(id)
}

// acquireStream takes a stream slot for a terminal attach or a file watch
// (method as for longStream; other calls take none) of a caller with acc
// on lease id. The caller calls release when the call ends. Past the
// limit it is a 429 (RESOURCE_EXHAUSTED) naming the limit.
func (p *Proxy) acquireStream(id string, acc access, method string) (release func(), rerr *routeError) {
	if !longStream(method) {
		return func() {}, nil
	}
	release, err := p.cfg.Streams.Acquire(streamCaller(id, acc))
	if err != nil {
		p.log.Info("stream refused: stream limit", "lease_id", id, "method", method, "limit", p.cfg.Streams.Max())
		return nil, &routeError{status: http.StatusTooManyRequests, err: err}
	}
	return release, nil
}
