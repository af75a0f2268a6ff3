package edge

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRecovererTurnsPanicsIntoInternal(t *testing.T) {
	r := Recoverer{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	_, err := r.Unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Y"}, func(context.Context, any) (any, error) {
		panic("boom")
	})
	if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "internal error" {
		t.Fatalf("unary panic: %v, want Internal \"internal error\"", err)
	}
	err = r.Stream(nil, nil, &grpc.StreamServerInfo{FullMethod: "/x/Z"}, func(any, grpc.ServerStream) error { panic("boom") })
	if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "internal error" {
		t.Fatalf("stream panic: %v, want Internal \"internal error\"", err)
	}
	rec := httptest.NewRecorder()
	r.HTTP(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if want := `{"code":13,"details":[],"message":"internal error"}` + "\n"; rec.Code != 500 || rec.Body.String() != want {
		t.Fatalf("http panic: %d %q", rec.Code, rec.Body.String())
	}
}
