package envd

import (
	"encoding/json"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/status"
)

// toConnect maps an errdefs-categorised error to a Connect error with the
// matching code (the codes are gRPC's).
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	st, _ := status.FromError(errgrpc.ToGRPC(err))
	return connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
}

// httpStatus is the HTTP status of an errdefs-categorised error.
func httpStatus(err error) int {
	st, _ := status.FromError(errgrpc.ToGRPC(err))
	return runtime.HTTPStatusFromCode(st.Code())
}

// writeHTTPError answers with envd's JSON error body {"message", "code"}.
func writeHTTPError(w http.ResponseWriter, err error) {
	code := httpStatus(err)
	writeHTTPErrorStatus(w, code, err.Error())
}

func writeHTTPErrorStatus(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	}{msg, code})
}
