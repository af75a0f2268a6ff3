package orchestrator

import (
	"context"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/berth-dev/berth/pkg/lease"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/status"
)

// Drain takes the orchestrator out of service (operator only; see
// lease.Manager.Drain): new leases and resumes are refused from now on,
// then every live lease is hibernated or released. A failure on one lease
// is listed in the answer, not returned; the call itself fails only for a
// bad request, a caller who is not the operator, or a manager not running.
func (s *leaseServer) Drain(ctx context.Context, req *orchv1.DrainRequest) (*orchv1.DrainResponse, error) {
	if p := principal(ctx); p.Role != RoleOperator {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "drain needs the operator token")
	}
	mode, err := lease.ParseDrainMode("mode", req.Mode)
	if err != nil {
		return nil, err
	}
	res, err := s.m.Drain(ctx, mode, req.Reason)
	if err != nil {
		return nil, err
	}
	out := &orchv1.DrainResponse{Drained: res.Drained}
	for _, f := range res.Failed {
		out.Failed = append(out.Failed, &orchv1.DrainFailure{LeaseId: f.LeaseID, Error: failureText(f.Err)})
	}
	return out, nil
}

// failureText is err as a client reads it: its gRPC code's name, then the
// message ("FAILED_PRECONDITION: …").
func failureText(err error) string {
	st := status.Convert(errgrpc.ToGRPC(err))
	return code.Code(st.Code()).String() + ": " + st.Message()
}
