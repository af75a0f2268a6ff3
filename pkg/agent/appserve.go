package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/berth-dev/berth/pkg/agent/app"
	"github.com/berth-dev/berth/pkg/agent/users"
)

// startApp starts Config.App as the default user, in its directory, with
// the commands' environment plus its key.
func startApp(cfg Config, us *users.Resolver, conf *configurer, log *slog.Logger) (*app.App, context.CancelFunc, error) {
	ac := cfg.App
	dir := ac.Dir
	if dir == "" {
		dir = cfg.WorkDir
	}
	env, err := conf.environ()
	if err != nil {
		return nil, nil, err
	}
	acfg := app.Config{Argv: ac.Argv, Port: ac.Port, Dir: dir, Key: ac.Key, Logger: log.With("component", "app")}
	if us != nil && os.Geteuid() == 0 {
		id := us.Default
		acfg.Credential = id.Credential()
		for k, v := range id.Env() {
			env = append(env, k+"="+v)
		}
	}
	if ac.Key != "" {
		for _, k := range app.KeyEnv {
			env = append(env, k+"="+ac.Key)
		}
	}
	acfg.Env = env
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.Start(ctx, acfg)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	return a, cancel, nil
}

// appHandler is the handler of the routes the agent forwards to its app;
// nil without one.
func appHandler(a *app.App) http.Handler {
	if a == nil {
		return nil
	}
	return a.Handler()
}

// AppFailedStatus is the /healthz status of an agent whose app could not
// start (HTTP 500): the sandbox will not become ready.
const AppFailedStatus = "APP_FAILED"

// healthz answers GET /healthz: 200 SERVING; with an app, 503 while it
// starts and 500 AppFailedStatus (with the app's status: reason and last
// output lines) when it could not start.
func healthz(a *app.App) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if a == nil {
			_, _ = w.Write([]byte(`{"status":"SERVING"}` + "\n"))
			return
		}
		st := a.Status()
		body := struct {
			Status string     `json:"status"`
			App    app.Status `json:"app"`
		}{"SERVING", st}
		code := http.StatusOK
		switch st.State {
		case app.Starting:
			body.Status, code = "NOT_SERVING", http.StatusServiceUnavailable
		case app.Failed:
			body.Status, code = AppFailedStatus, http.StatusInternalServerError
		}
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	}
}
