package agent_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
)

// TestSecretsMaskedByTheAgent: Config.Secrets reach the process runner:
// an exec through the API shows <secret:NAME> for the value.
func TestSecretsMaskedByTheAgent(t *testing.T) {
	const val = "agent-secret-value-42"
	srv, err := agent.New(agent.Config{Token: testToken, WorkDir: t.TempDir(), Secrets: map[string]string{"TOKEN": val},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	addr := testserve.Serve(t, srv.Serve)
	a := &testAgent{addr: addr, base: "http://" + addr}
	code, body := a.do(t, "POST", "/v1/exec", map[string]any{"command": `echo "x $TOKEN y"; echo $TOKEN >&2`, "env": map[string]string{"TOKEN": val}})
	var r struct{ Stdout, Stderr string }
	if code != 200 || json.Unmarshal(body, &r) != nil {
		t.Fatalf("exec: %d %s", code, body)
	}
	if string(r.Stdout) != "x <secret:TOKEN> y\n" || string(r.Stderr) != "<secret:TOKEN>\n" || strings.Contains(string(body), val) {
		t.Errorf("exec answer %s", body)
	}
}
