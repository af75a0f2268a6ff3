package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"github.com/go-openapi/loads"
	oaspec "github.com/go-openapi/spec"
	"github.com/go-openapi/strfmt"
	"github.com/go-openapi/validate"
)

// TestOpenAPI fetches both OpenAPI v2 descriptions from a real orchestrator
// (its own at /openapi.json, public; the agent's through the proxy at
// /v1/sandboxes/{lease}/openapi.json, with the lease token), checks that
// they are what the binary embeds, loads and validates them with
// go-openapi, and sends one request per documented path and method (path
// parameters filled with dummy values, POST bodies that are not JSON so
// that nothing runs) to assert that each is served: the answer must not be
// the router's "no such route" (grpc-gateway's 404 "Not Found", or
// 405/501). An application error (lease not found, invalid body) is fine.
func TestOpenAPI(t *testing.T) {
	t.Parallel() // its own orchestrator; mostly waits
	o := orchtest.Start(t, nil)
	code, b := httpCall(t, o.Base, "POST", "/v1/leases", orchtest.OperatorToken, `{"conversationId":"openapi"}`)
	if code != 200 {
		t.Fatalf("acquire: %d %s", code, b)
	}
	id, tok := field(b, `"id":"`), field(b, `"token":"`)

	for _, c := range []struct {
		name, base, tok, wrongMethod string
		embedded                     []byte
	}{
		{"orchestrator", o.Base, "", "PUT /v1/leases", orchv1.OpenAPIv2},
		{"agent", o.Base + "/v1/sandboxes/" + id, tok, "PUT /v1/info", agentv1.OpenAPIv2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // the same orchestrator, read only
			code, doc := httpCall(t, c.base, "GET", "/openapi.json", c.tok, "")
			if code != 200 || doc != string(c.embedded) {
				t.Fatalf("GET /openapi.json: %d, %d bytes, want 200 and the %d embedded bytes", code, len(doc), len(c.embedded))
			}
			spec, err := loads.Analyzed(json.RawMessage(doc), "")
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if err := validate.Spec(spec, strfmt.Default); err != nil {
				t.Fatalf("validate: %v", err)
			}
			callTok := c.tok
			if callTok == "" {
				callTok = orchtest.OperatorToken
			}
			// The negative controls: an undocumented path, and a documented
			// path with a wrong method, are the router's errors.
			for _, ctl := range []string{"GET /v1/no-such-route", c.wrongMethod} {
				method, path, _ := strings.Cut(ctl, " ")
				if code, body := httpCall(t, c.base, method, path, callTok, ""); !routingError(code, body) {
					t.Fatalf("control %s = %d %s, not recognized as a routing error", ctl, code, body)
				}
			}
			var ops []string
			for path, item := range spec.Spec().Paths.Paths {
				for method, op := range map[string]*oaspec.Operation{"GET": item.Get, "POST": item.Post, "PUT": item.Put, "DELETE": item.Delete, "PATCH": item.Patch} {
					if op != nil {
						ops = append(ops, method+" "+path)
					}
				}
			}
			sort.Strings(ops)
			if len(ops) == 0 {
				t.Fatal("no operations documented")
			}
			param := regexp.MustCompile(`\{([^}]+)\}`)
			for _, op := range ops {
				method, path, _ := strings.Cut(op, " ")
				path = param.ReplaceAllString(path, "no-such-$1")
				body := ""
				if method == "POST" {
					body = "not json" // rejected after routing: nothing runs
				}
				code, resp, timedOut := httpCallTimeout(t, c.base, method, path, callTok, body, 3*time.Second)
				if timedOut {
					// A stream that is open and waiting: the router answers at once.
					t.Logf("%s: served (stream open, no answer in 3s)", op)
					continue
				}
				if routingError(code, resp) {
					t.Errorf("%s (%s): documented but not served: %d %s", op, path, code, strings.TrimSpace(resp))
					continue
				}
				t.Logf("%s: served (%d)", op, code)
			}
		})
	}
}

// routingError reports whether an answer is the router's "no such route":
// grpc-gateway's default 404 (code 5, message "Not Found"), the edge's 405,
// or a 501 (an unrouted method), as opposed to an application error.
func routingError(code int, body string) bool {
	switch code {
	case http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return true
	case http.StatusNotFound:
		var e struct {
			Message string `json:"message"`
		}
		return json.Unmarshal([]byte(body), &e) != nil || e.Message == "Not Found"
	}
	return false
}

func httpCall(t *testing.T, base, method, path, tok, body string) (int, string) {
	t.Helper()
	code, b, timedOut := httpCallTimeout(t, base, method, path, tok, body, 30*time.Second)
	if timedOut {
		t.Fatalf("%s %s: no answer", method, path)
	}
	return code, b
}

// httpCallTimeout sends one request; timedOut reports that no answer (or
// not all of its body) came within d.
func httpCallTimeout(t *testing.T, base, method, path, tok, body string, d time.Duration) (code int, b string, timedOut bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, context.DeadlineExceeded) {
		return 0, "", true
	}
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if errors.Is(err, context.DeadlineExceeded) {
		return resp.StatusCode, string(raw), resp.StatusCode == 200
	}
	return resp.StatusCode, string(raw), false
}
