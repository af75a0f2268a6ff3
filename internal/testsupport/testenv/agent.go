package testenv

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// agentClient is the HTTP client of AgentCall: no proxy (sandboxes are on a
// local bridge), and a bound so a wedged agent fails the test.
var agentClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil}}

// AgentCall sends one REST request (body as is) with the bearer token to
// the sandbox agent at endpoint (host:port) and returns the status and the
// response body; a transport failure fails tb.
func AgentCall(tb testing.TB, endpoint, token, method, path, body string) (int, []byte) {
	tb.Helper()
	req, err := http.NewRequest(method, "http://"+endpoint+path, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := agentClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// ExecResult is the agent's answer to a REST exec (POST /v1/exec).
type ExecResult struct {
	ExitCode int    `json:"exitCode"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// AgentExec runs the shell command command through the agent's REST exec as
// user ("" for the sandbox's default user), bounded by 20s, and returns
// the HTTP status and the result; when the status is not 200, the result's
// Stderr holds the response body.
func AgentExec(tb testing.TB, endpoint, token, user, command string) (int, ExecResult) {
	tb.Helper()
	req, _ := json.Marshal(map[string]any{"command": command, "user": user, "timeout": "20s"})
	code, b := AgentCall(tb, endpoint, token, http.MethodPost, "/v1/exec", string(req))
	var res ExecResult
	if code != http.StatusOK {
		res.Stderr = string(b)
		return code, res
	}
	if err := json.Unmarshal(b, &res); err != nil {
		tb.Fatalf("exec result %s: %v", b, err)
	}
	return code, res
}
