package runtime_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// An agent whose app could not start answers /healthz 500 APP_FAILED:
// WaitReady returns at once with the app's reason and output, not after
// its deadline.
func TestWaitReadyAppFailed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"status":"APP_FAILED","app":{"state":"failed","reason":"start /x: no such file","output":"last words"}}`))
	}))
	defer srv.Close()
	h := runtime.NewHealthProber()
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := h.WaitReady(ctx, strings.TrimPrefix(srv.URL, "http://"), func(context.Context) error { return nil })
	if !errors.Is(err, runtime.ErrAppFailed) || !errors.Is(err, errdefs.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "start /x: no such file") || !strings.Contains(err.Error(), "last words") || ctx.Err() != nil {
		t.Fatalf("WaitReady: %v", err)
	}
}

func TestSpecApp(t *testing.T) {
	base := runtime.Spec{LeaseID: "l1", Image: "berth/base", AgentToken: "t"}
	for _, tc := range []struct {
		app  *runtime.App
		want string
	}{
		{&runtime.App{Command: []string{"/s"}, Port: 8000}, ""},
		{&runtime.App{Port: 8000}, "app.command"},
		{&runtime.App{Command: []string{"/s"}, Port: runtime.AgentPort}, "app.port"},
		{&runtime.App{Command: []string{"/s"}, Port: 0}, "app.port"},
		{&runtime.App{Command: []string{"/s"}, Port: 8000, WorkDir: "rel"}, "app.working_dir"},
	} {
		s := base
		s.App = tc.app
		err := s.Validate()
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.app, err, tc.want)
		}
	}
	s := base
	s.App = &runtime.App{Command: []string{"/s"}, Port: 8000, Key: "k"}
	if s.Environ()[runtime.AgentAppKeyEnv] != "k" {
		t.Fatalf("Environ: %v", s.Environ())
	}
}
