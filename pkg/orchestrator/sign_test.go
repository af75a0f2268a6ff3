package orchestrator_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

// call sends a JSON request with token and decodes a JSON object answer.
func signCall(t *testing.T, method, url, token, body string) (int, map[string]any, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m, string(b)
}

func acquireFor(t *testing.T, s *orchtest.Server, conv string) (id, token string) {
	t.Helper()
	code, m, b := signCall(t, "POST", s.Base+"/v1/leases", orchtest.OperatorToken, `{"conversationId":"`+conv+`","ttl":"600s"}`)
	if code != 200 {
		t.Fatalf("acquire: %d %s", code, b)
	}
	return m["lease"].(map[string]any)["id"].(string), m["token"].(string)
}

// TestSignValidation: Sign checks its fields (400 naming the field), who
// may sign (the lease's own token, not another lease's), and builds the
// URL on the address the call came in on.
func TestSignValidation(t *testing.T) {
	s := orchtest.Start(t, nil)
	id, tok := acquireFor(t, s, "sign-a")
	_, other := acquireFor(t, s, "sign-b")
	url := s.Base + "/v1/leases/" + id + ":sign"
	code, m, b := signCall(t, "POST", url, tok, `{"port": 8080, "method": "get", "expires": "120s"}`)
	if code != 200 || !strings.HasPrefix(m["url"].(string), s.Base+"/v1/signed/"+id+"/ports/8080/?berth_exp=") ||
		!strings.Contains(m["url"].(string), "berth_method=GET") || m["method"] != "GET" || m["expiresAt"] == nil {
		t.Fatalf("sign port: %d %s", code, b)
	}
	for _, tc := range []struct{ body, field string }{
		{`{}`, "port"},
		{`{"port": 70000}`, "port"},
		{`{"port": 80, "download": "/x"}`, "port"},
		{`{"download": "relative"}`, "download"},
		{`{"upload": "/a/../b"}`, "upload"},
		{`{"download": "/x", "method": "PUT"}`, "method"},
		{`{"port": 80, "method": "G T"}`, "method"},
		{`{"port": 80, "expires": "999999s"}`, "expires"},
		{`{"port": 80, "expires": "-5s"}`, "expires"},
	} {
		code, _, b := signCall(t, "POST", url, tok, tc.body)
		if code != 400 || !strings.Contains(b, tc.field) {
			t.Errorf("sign %s: %d %s, want 400 naming %s", tc.body, code, b, tc.field)
		}
	}
	if code, _, b := signCall(t, "POST", url, other, `{"port": 80}`); code != 404 {
		t.Errorf("sign with another lease's token: %d %s, want 404", code, b)
	}
	if code, _, b := signCall(t, "POST", url, "", `{"port": 80}`); code != 401 {
		t.Errorf("sign without a token: %d %s", code, b)
	}
}

// TestLogsREST: the REST stream is newline-delimited JSON, one
// {"result": LogEntry} per line, transitions first; another lease's
// token cannot read it.
func TestLogsREST(t *testing.T) {
	s := orchtest.Start(t, nil)
	id, tok := acquireFor(t, s, "logs-a")
	_, other := acquireFor(t, s, "logs-b")
	req, _ := http.NewRequest("GET", s.Base+"/v1/leases/"+id+"/logs", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sources []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var line struct {
			Result struct {
				Source, Text string
			}
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		sources = append(sources, line.Result.Source+":"+line.Result.Text)
	}
	if resp.StatusCode != 200 || len(sources) < 2 || sources[0] != "transition:acquired" || !strings.HasPrefix(sources[1], "transition:") {
		t.Fatalf("logs: %d %q", resp.StatusCode, sources)
	}
	if code, _, b := signCall(t, "GET", s.Base+"/v1/leases/"+id+"/logs", other, ""); code != 404 {
		t.Errorf("logs with another lease's token: %d %s", code, b)
	}
	if code, _, b := signCall(t, "GET", s.Base+"/v1/leases/"+id+"/logs?tail=-1", tok, ""); code != 400 || !strings.Contains(b, "tail") {
		t.Errorf("logs tail=-1: %d %s", code, b)
	}
}
