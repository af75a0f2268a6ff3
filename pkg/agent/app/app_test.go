package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/agent/app"
)

// serveEnv makes the test binary a tiny app: it listens on the port named
// and answers every request with what it saw.
const serveEnv = "APP_TEST_SERVE_PORT"

func TestMain(m *testing.M) {
	if port := os.Getenv(serveEnv); port != "" {
		fmt.Println("test app starting")
		_ = http.ListenAndServe("127.0.0.1:"+port, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewEncoder(w).Encode(map[string]string{
				"path": r.URL.Path, "key": r.Header.Get(app.KeyHeader), "authorization": r.Header.Get("Authorization"),
				"env_key": os.Getenv("SESSION_API_KEY"), "cwd": must(os.Getwd()),
			})
		}))
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func must(s string, _ error) string { return s }

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitState waits until a's state is want (or it stopped for good).
func waitState(t *testing.T, a *app.App, want app.State) app.Status {
	t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if st := a.Status(); st.State == want {
			return st
		}
		select {
		case <-deadline:
			t.Fatalf("state %s, want %s: %+v", a.Status().State, want, a.Status())
		case <-a.Done():
			if st := a.Status(); st.State == want {
				return st
			}
			t.Fatalf("app stopped: %+v, want %s", a.Status(), want)
		case <-tick.C:
		}
	}
}

func TestForwardsWithKey(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	a, err := app.Start(ctx, app.Config{Argv: []string{os.Args[0]}, Port: port, Dir: dir, Key: "k-1",
		Env: append(os.Environ(), serveEnv+"="+strconv.Itoa(port), "SESSION_API_KEY=k-1")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-a.Done() })
	waitState(t, a, app.Running)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	for path, key := range map[string]string{"/api/conversations": "k-1", "/sockets/events/x": ""} {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer agent-token")
		req.Header.Set(app.KeyHeader, "from-client")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]string
		_ = json.NewDecoder(res.Body).Decode(&got)
		res.Body.Close()
		if got["path"] != path || got["key"] != key || got["authorization"] != "" || got["env_key"] != "k-1" || got["cwd"] != dir {
			t.Fatalf("%s: the app saw %v", path, got)
		}
	}
	if st := a.Status(); !strings.Contains(st.Output, "test app starting") {
		t.Fatalf("output not kept: %+v", st)
	}
}

func TestFailedStarts(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want []string
	}{
		{[]string{"/nonexistent/server"}, []string{"start /nonexistent/server", "no such file or directory"}},
		{[]string{"/bin/sh", "-c", "echo boom; exit 3"}, []string{"exited with status 3 before it listened on port"}},
	} {
		a, err := app.Start(context.Background(), app.Config{Argv: tc.argv, Port: freePort(t), Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		st := waitState(t, a, app.Failed)
		<-a.Done()
		for _, w := range tc.want {
			if !strings.Contains(st.Reason, w) {
				t.Fatalf("%v: reason %q lacks %q", tc.argv, st.Reason, w)
			}
		}
		if tc.argv[0] == "/bin/sh" && st.Output != "boom" {
			t.Fatalf("output %q", st.Output)
		}
	}
}

// An app that ended after it listened is started again (Restarts counts).
func TestRestartsAfterRunning(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	marker := t.TempDir() + "/ran"
	// The first run serves for a second and is then ended (timeout 1);
	// the second serves for good.
	script := fmt.Sprintf(`if [ -e %[1]s ]; then exec env %[2]s=%[3]d %[4]s; fi; touch %[1]s; exec env %[2]s=%[3]d timeout 1 %[4]s`, marker, serveEnv, port, os.Args[0])
	a, err := app.Start(ctx, app.Config{Argv: []string{"/bin/sh", "-c", script}, Port: port, Dir: t.TempDir(), Env: os.Environ(),
		RestartMin: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-a.Done() })
	waitState(t, a, app.Running)
	deadline := time.After(30 * time.Second)
	for a.Status().Restarts < 1 || a.Status().State != app.Running {
		select {
		case <-deadline:
			t.Fatalf("not restarted: %+v", a.Status())
		case <-a.Done():
			t.Fatalf("stopped: %+v", a.Status())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
