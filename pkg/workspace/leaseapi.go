package workspace

import (
	"context"
	"net/http"
	"net/url"
	"time"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// leaseAPI is the part of the orchestrator's lease API a Leased workspace
// uses. Errors carry errdefs categories.
type leaseAPI interface {
	Acquire(ctx context.Context, req *orchv1.AcquireRequest) (*orchv1.AcquireResponse, error)
	// Renew extends lease id by ttl from now (0: the lease's own TTL).
	Renew(ctx context.Context, id string, ttl time.Duration) (*orchv1.Lease, error)
	Release(ctx context.Context, id, reason string) (*orchv1.Lease, error)
	// Pause pauses lease id ("freeze" or "hibernate"); Resume resumes it
	// (pause.go).
	Pause(ctx context.Context, id, mode string) (*orchv1.Lease, error)
	Resume(ctx context.Context, id string) (*orchv1.Lease, error)
	Close() error
}

func newLeaseAPI(cfg LeasedConfig) (leaseAPI, error) {
	if cfg.Transport == TransportREST {
		c, err := newRESTClient(restOptions{
			target: cfg.OrchestratorAddr, token: cfg.Token, tlsConfig: cfg.TLSConfig, httpClient: cfg.HTTPClient,
			retryMax: DefaultRetryMax, waitMin: DefaultRetryWaitMin, waitMax: DefaultRetryWaitMax, log: cfg.Logger,
		})
		if err != nil {
			return nil, err
		}
		return &restLeaseAPI{c: c}, nil
	}
	conn, err := dialGRPC(cfg.OrchestratorAddr, cfg.Token, "", cfg.TLSConfig, nil)
	if err != nil {
		return nil, err
	}
	return &grpcLeaseAPI{conn: conn, c: orchv1.NewLeaseServiceClient(conn)}, nil
}

func ttlProto(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// grpcLeaseAPI calls the lease API over gRPC.
type grpcLeaseAPI struct {
	conn *grpc.ClientConn
	c    orchv1.LeaseServiceClient
}

func (a *grpcLeaseAPI) Acquire(ctx context.Context, req *orchv1.AcquireRequest) (*orchv1.AcquireResponse, error) {
	resp, err := a.c.Acquire(ctx, req)
	return resp, wireErr(err)
}

func (a *grpcLeaseAPI) Renew(ctx context.Context, id string, ttl time.Duration) (*orchv1.Lease, error) {
	resp, err := a.c.Renew(ctx, &orchv1.RenewRequest{Id: id, Ttl: ttlProto(ttl)})
	return resp, wireErr(err)
}

func (a *grpcLeaseAPI) Release(ctx context.Context, id, reason string) (*orchv1.Lease, error) {
	resp, err := a.c.Release(ctx, &orchv1.ReleaseRequest{Id: id, Reason: reason})
	return resp, wireErr(err)
}

// Pause pauses lease id (mode freeze or hibernate).
func (a *grpcLeaseAPI) Pause(ctx context.Context, id, mode string) (*orchv1.Lease, error) {
	resp, err := a.c.Pause(ctx, &orchv1.PauseRequest{Id: id, Mode: mode})
	return resp, wireErr(err)
}

// Resume resumes paused lease id.
func (a *grpcLeaseAPI) Resume(ctx context.Context, id string) (*orchv1.Lease, error) {
	resp, err := a.c.Resume(ctx, &orchv1.ResumeRequest{Id: id})
	return resp, wireErr(err)
}

func (a *grpcLeaseAPI) Close() error { return a.conn.Close() }

// restLeaseAPI calls the lease API over REST. Acquire (idempotent by
// conversation id) and Release (releasing an ended lease changes nothing)
// are retried like idempotent calls; Renew is not, since the renewal loop
// has its own retries.
type restLeaseAPI struct{ c *restClient }

func leaseRoute(id string) string { return "/v1/leases/" + url.PathEscape(id) }

func (a *restLeaseAPI) Acquire(ctx context.Context, req *orchv1.AcquireRequest) (*orchv1.AcquireResponse, error) {
	out := &orchv1.AcquireResponse{}
	return out, a.c.callJSON(ctx, request{method: http.MethodPost, route: "/v1/leases", retry: true}, req, out)
}

func (a *restLeaseAPI) Renew(ctx context.Context, id string, ttl time.Duration) (*orchv1.Lease, error) {
	out := &orchv1.Lease{}
	in := &orchv1.RenewRequest{Ttl: ttlProto(ttl)}
	return out, a.c.callJSON(ctx, request{method: http.MethodPost, route: leaseRoute(id) + ":renew"}, in, out)
}

func (a *restLeaseAPI) Release(ctx context.Context, id, reason string) (*orchv1.Lease, error) {
	out := &orchv1.Lease{}
	var q url.Values
	if reason != "" {
		q = url.Values{"reason": {reason}}
	}
	return out, a.c.callJSON(ctx, request{method: http.MethodDelete, route: leaseRoute(id), query: q, retry: true}, nil, out)
}

// Pause and Resume are retried like idempotent calls: pausing a lease
// paused the same way, or resuming a READY one, changes nothing.
func (a *restLeaseAPI) Pause(ctx context.Context, id, mode string) (*orchv1.Lease, error) {
	out := &orchv1.Lease{}
	return out, a.c.callJSON(ctx, request{method: http.MethodPost, route: leaseRoute(id) + ":pause", retry: true}, &orchv1.PauseRequest{Mode: mode}, out)
}

// Resume resumes paused lease id (POST /v1/leases/{id}:resume).
func (a *restLeaseAPI) Resume(ctx context.Context, id string) (*orchv1.Lease, error) {
	out := &orchv1.Lease{}
	return out, a.c.callJSON(ctx, request{method: http.MethodPost, route: leaseRoute(id) + ":resume", retry: true}, &orchv1.ResumeRequest{}, out)
}

func (a *restLeaseAPI) Close() error {
	a.c.close()
	return nil
}
