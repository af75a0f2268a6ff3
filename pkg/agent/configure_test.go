package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
	"github.com/berth-dev/berth/pkg/agent/statefile"
	"github.com/berth-dev/berth/pkg/errdefs"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// startConfigurable starts an agent keeping its Configure state in
// stateFile and returns it with a gRPC connection.
func startConfigurable(t *testing.T, stateFile string) (*testAgent, agentv1.ConfigServiceClient) {
	t.Helper()
	srv, err := agent.New(agent.Config{Token: testToken, WorkDir: t.TempDir(), StateFile: stateFile,
		Secrets: map[string]string{"BOOT": "boot-secret-value"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	addr := testserve.Serve(t, srv.Serve)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &testAgent{addr: addr, base: "http://" + addr, conn: conn}, agentv1.NewConfigServiceClient(conn)
}

func (a *testAgent) execOut(t *testing.T, command string, env map[string]string) string {
	t.Helper()
	code, body := a.do(t, "POST", "/v1/exec", map[string]any{"command": command, "env": env})
	var r struct{ Stdout string }
	if code != 200 || json.Unmarshal(body, &r) != nil {
		t.Fatalf("exec: %d %s", code, body)
	}
	return r.Stdout
}

// TestConfigure: Configure gives every later command the env and secrets
// (a request's own env still wins; the secrets are masked like those of
// the agent's start), once only, needs the token, and survives a restart
// of the agent through the state file (mode 0600).
func TestConfigure(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state", "configure.json")
	a, cs := startConfigurable(t, state)
	if _, err := cs.Configure(context.Background(), &agentv1.ConfigureRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Configure without a token: %v", err)
	}
	if out := a.execOut(t, `echo "[$GREETING]"`, nil); out != "[]\n" {
		t.Fatalf("before Configure: %q", out)
	}
	const val = "lease-secret-value-7"
	req := &agentv1.ConfigureRequest{Env: map[string]string{"GREETING": "hi", "OVER": "lease"}, Secrets: map[string]string{"LEASE_SECRET": val}}
	if _, err := cs.Configure(authed(context.Background(), testToken), req); err != nil {
		t.Fatal(err)
	}
	check := func(a *testAgent, when string) {
		t.Helper()
		out := a.execOut(t, `echo "$GREETING $OVER $LEASE_SECRET $BOOT"`, map[string]string{"OVER": "request"})
		if want := "hi request <secret:LEASE_SECRET> \n"; out != want {
			t.Fatalf("%s: %q, want %q", when, out, want)
		}
		if out := a.execOut(t, `echo boot-secret-value`, nil); out != "<secret:BOOT>\n" {
			t.Fatalf("%s: the start's secrets are no longer masked: %q", when, out)
		}
	}
	check(a, "configured")
	_, err := cs.Configure(authed(context.Background(), testToken), &agentv1.ConfigureRequest{Env: map[string]string{"GREETING": "evil"}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second Configure: %v, want FAILED_PRECONDITION", err)
	}
	check(a, "after a refused second Configure")
	fi, err := os.Stat(state)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", fi, err)
	}
	// A restarted agent applies the kept configuration and refuses another.
	b, cs2 := startConfigurable(t, state)
	check(b, "after a restart")
	if _, err := cs2.Configure(authed(context.Background(), testToken), req); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Configure after a restart: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := cs.Configure(authed(context.Background(), testToken), &agentv1.ConfigureRequest{Env: map[string]string{"A=B": "x"}}); status.Code(err) != codes.InvalidArgument &&
		!strings.Contains(err.Error(), "configured") {
		t.Fatalf("bad env: %v", err)
	}
}

// TestConfigureStateFile: the state file is made empty at the start (an
// empty one means "not configured", also after a restart); a Configure
// that fits in one page is written into it in place, a bigger one through
// a temporary file and a rename; both are whole after a restart, and the
// directory holds nothing else.
func TestConfigureStateFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		val  string
	}{
		{"in place", "small"},
		{"renamed", strings.Repeat("v", 8192)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state", "configure.json")
			startConfigurable(t, state)
			if b, err := os.ReadFile(state); err != nil || len(b) != 0 {
				t.Fatalf("state file after the start: %q %v, want it empty", b, err)
			}
			// A restart before any Configure: still unconfigured.
			a, cs := startConfigurable(t, state)
			if out := a.execOut(t, `echo "[$BIG]"`, nil); out != "[]\n" {
				t.Fatalf("before Configure: %q", out)
			}
			req := &agentv1.ConfigureRequest{Env: map[string]string{"BIG": tc.val}}
			if _, err := cs.Configure(authed(context.Background(), testToken), req); err != nil {
				t.Fatal(err)
			}
			var kept struct{ Env map[string]string }
			b, err := os.ReadFile(state)
			if err != nil || json.Unmarshal(b, &kept) != nil || kept.Env["BIG"] != tc.val {
				t.Fatalf("state file: %d bytes, %v", len(b), err)
			}
			ents, err := os.ReadDir(filepath.Dir(state))
			if err != nil || len(ents) != 2 || ents[0].Name() != statefile.Marker || ents[1].Name() != statefile.Name {
				t.Fatalf("state dir holds %v (%v), want configure.json and its marker alone", ents, err)
			}
			if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("state file: %v %v", fi, err)
			}
			b2, cs2 := startConfigurable(t, state)
			if out := b2.execOut(t, `printf %s "$BIG"`, nil); out != tc.val {
				t.Fatalf("after a restart: %d bytes, want %d", len(out), len(tc.val))
			}
			if _, err := cs2.Configure(authed(context.Background(), testToken), req); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("Configure after a restart: %v, want FAILED_PRECONDITION", err)
			}
		})
	}
}

// TestConfigureThroughStateFile: an agent holding its empty state file
// marks its directory, and a configuration written there by
// statefile.WriteClaim (as the orchestrator does on the engine's host) is
// applied before the next command, with no call to the agent: env for
// every command, secrets masked, and the configuration final (the gRPC
// Configure, also before any command, and a second WriteClaim are
// refused). A restarted agent
// applies it again; a file it cannot read fails the command rather than
// run it without the lease's environment.
func TestConfigureThroughStateFile(t *testing.T) {
	for name, pad := range map[string]string{"in place": "", "renamed": strings.Repeat("p", 2*statefile.InPlaceMax)} {
		t.Run(name, func(t *testing.T) { testConfigureThroughStateFile(t, pad) })
	}
}

// testConfigureThroughStateFile is TestConfigureThroughStateFile with an
// extra variable PAD=pad in the configuration (a big one is renamed over
// the state file, not written in place).
func testConfigureThroughStateFile(t *testing.T, pad string) {
	dir := filepath.Join(t.TempDir(), "state")
	state := filepath.Join(dir, statefile.Name)
	a, cs := startConfigurable(t, state)
	if !statefile.Usable(dir) {
		t.Fatal("the agent's state directory is not usable for a claim: no marker or no empty state file")
	}
	if out := a.execOut(t, `echo "[$GREETING]"`, nil); out != "[]\n" {
		t.Fatalf("before the claim: %q", out)
	}
	const val = "lease-secret-value-9"
	if err := statefile.WriteClaim(dir, statefile.Config{Env: map[string]string{"GREETING": "hi", "PAD": pad}, Secrets: map[string]string{"LEASE_SECRET": val}}); err != nil {
		t.Fatal(err)
	}
	check := func(a *testAgent, when string) {
		t.Helper()
		if out := a.execOut(t, `echo "$GREETING $LEASE_SECRET ${#PAD}"`, nil); out != fmt.Sprintf("hi <secret:LEASE_SECRET> %d\n", len(pad)) {
			t.Fatalf("%s: %q", when, out)
		}
	}
	// Before any command: a Configure (the orchestrator's probe after its
	// restart) finds the configuration and refuses.
	if _, err := cs.Configure(authed(context.Background(), testToken), &agentv1.ConfigureRequest{Env: map[string]string{"GREETING": "evil"}}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Configure after a claim through the file: %v, want FAILED_PRECONDITION", err)
	}
	check(a, "after the claim")
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", fi, err)
	}
	if err := statefile.WriteClaim(dir, statefile.Config{Env: map[string]string{"GREETING": "evil"}}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a second WriteClaim: %v, want FAILED_PRECONDITION", err)
	}
	check(a, "after the refused second configurations")
	b, _ := startConfigurable(t, state)
	check(b, "after a restart")
	if _, err := os.Stat(filepath.Join(dir, statefile.Marker)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a configured agent's restart left the marker: %v", err)
	}

	// Fails closed: a configuration the agent cannot read.
	dir2 := filepath.Join(t.TempDir(), "state")
	c, _ := startConfigurable(t, filepath.Join(dir2, statefile.Name))
	if err := os.WriteFile(filepath.Join(dir2, "garbage"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir2, "garbage"), filepath.Join(dir2, statefile.Name)); err != nil {
		t.Fatal(err)
	}
	code, body := c.do(t, "POST", "/v1/exec", map[string]any{"command": "true"})
	if code != 500 || !strings.Contains(string(body), statefile.Name) {
		t.Fatalf("exec with an unreadable configuration: %d %s, want 500 naming the file", code, body)
	}
}
