package orchestrator

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc/metadata"
)

// Signed URL lifetimes.
const (
	// DefaultSignedExpiry is a signed URL's lifetime when the call gives none.
	DefaultSignedExpiry = time.Hour
	// MaxSignedExpiry bounds a signed URL's lifetime.
	MaxSignedExpiry = 7 * 24 * time.Hour
)

// Sign returns a signed URL for one preview port, download or upload of a
// live lease the caller may see (the operator, the lease's owner, or the
// lease's own token). The proxy serves it (proxy.SignedPrefix).
func (s *leaseServer) Sign(ctx context.Context, req *orchv1.SignRequest) (*orchv1.SignResponse, error) {
	l, err := s.lookup(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	if l.State.Ended() {
		return nil, errdefs.FailedPrecondition("lease %s is %s: %s", l.ID, l.State, l.Reason)
	}
	expires, err := duration("expires", req.Expires)
	if err != nil {
		return nil, err
	}
	if expires == 0 {
		expires = DefaultSignedExpiry
	}
	if expires > MaxSignedExpiry {
		return nil, errdefs.InvalidArgument("expires", "%s exceeds the maximum %s", expires, MaxSignedExpiry)
	}
	if expires < time.Second {
		return nil, errdefs.InvalidArgument("expires", "%s is shorter than a second", expires)
	}
	sc := lease.SignedScope{LeaseID: l.ID}
	n := 0
	if req.Port != 0 {
		n++
		if req.Port < 1 || req.Port > 65535 {
			return nil, errdefs.InvalidArgument("port", "%d is not a TCP port (1-65535)", req.Port)
		}
		sc.Kind, sc.Port = lease.SignedPort, int(req.Port)
		if sc.Method, err = proxy.SignedMethod("method", req.Method); err != nil {
			return nil, err
		}
	}
	if req.Download != "" {
		n++
		sc.Kind, sc.Method = lease.SignedDownload, http.MethodGet
		if sc.Path, err = proxy.CleanSignedPath("download", req.Download); err != nil {
			return nil, err
		}
	}
	if req.Upload != "" {
		n++
		sc.Kind, sc.Method = lease.SignedUpload, http.MethodPut
		if sc.Path, err = proxy.CleanSignedPath("upload", req.Upload); err != nil {
			return nil, err
		}
	}
	if n != 1 {
		return nil, errdefs.InvalidArgument("port", "give exactly one of port, download and upload")
	}
	if req.Method != "" && sc.Kind != lease.SignedPort {
		return nil, errdefs.InvalidArgument("method", "only a port URL takes a method (downloads are GET, uploads PUT)")
	}
	// Signed at one-second precision; never later than the lease's expiry
	// would make sense either, but a renew may extend it, and each use
	// checks that the lease is live.
	sc.Expires = time.Now().Add(expires).Truncate(time.Second)
	path := proxy.SignedPath(sc, s.m.Tokens().Sign(sc))
	return &orchv1.SignResponse{Url: baseURL(ctx) + path, Path: path, ExpiresAt: ts(sc.Expires), Method: sc.Method}, nil
}

// baseURL is the address the call came in on: the REST gateway's Host (as
// x-forwarded-host, and X-Forwarded-Proto when a TLS-terminating proxy sets
// it), or a gRPC call's :authority; http://127.0.0.1:7070 when neither is known.
func baseURL(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return strings.TrimSpace(strings.Split(v[0], ",")[0])
		}
		return ""
	}
	host := first("x-forwarded-host")
	if host == "" {
		host = first(":authority")
	}
	if host == "" || strings.ContainsAny(host, "/ @\\") {
		host = "127.0.0.1:7070"
	}
	scheme := "http"
	if p := first("x-forwarded-proto"); p == "https" {
		scheme = p
	}
	return scheme + "://" + host
}
