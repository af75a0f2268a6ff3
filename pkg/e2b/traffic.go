package e2b

import (
	"context"
	"crypto/subtle"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/agent/envd"
	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/proxy"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Headers by which E2B's SDKs (with E2B_SANDBOX_URL) name the sandbox and
// the port a request is for.
const (
	SandboxIDHeader   = "E2b-Sandbox-Id"
	SandboxPortHeader = "E2b-Sandbox-Port"
)

// EnvdPort is the port E2B's SDKs reach envd on; berth's agent serves the
// envd protocol there (runtime.EnvdPort).
const EnvdPort = runtime.EnvdPort

// Sandboxes is what the traffic routes need from the lease manager;
// *lease.Manager implements it.
type Sandboxes interface {
	// Get returns a lease; an error wrapping errdefs.ErrNotFound when
	// there is none.
	Get(ctx context.Context, id string) (lease.Lease, error)
}

var _ Sandboxes = (*lease.Manager)(nil)

// Tokens is what the traffic routes need of the lease tokens;
// *lease.Tokens (lease.Manager.Tokens) implements it.
type Tokens interface {
	// Token returns a lease's token.
	Token(id string) string
	// AgentToken returns the bearer token of a lease's agent.
	AgentToken(id string) string
}

var _ Tokens = (*lease.Tokens)(nil)

// Forwarder forwards an authorized request into a sandbox; *proxy.Proxy
// implements it (resuming a paused lease, touching the lease).
type Forwarder interface {
	ServePort(w http.ResponseWriter, r *http.Request, req proxy.PortRequest)
}

var _ Forwarder = (*proxy.Proxy)(nil)

// Traffic serves the sandboxes' traffic: port EnvdPort is the agent's envd
// listener, whose X-Access-Token (a secure sandbox's envdAccessToken, its
// lease token) is checked here and replaced with the agent's own token;
// any other port is forwarded as it is (E2B's sandbox ports are public:
// the sandbox id, 80 random bits, names them). Only leases made through
// this API (LabelTemplate) are served.
type Traffic struct {
	// Sandboxes looks leases up. Required.
	Sandboxes Sandboxes
	// Tokens gives the leases' and their agents' tokens. Required.
	Tokens Tokens
	// Proxy forwards. Required.
	Proxy Forwarder
	// Logger receives refusals. Default slog.Default().
	Logger *slog.Logger
	// now is the clock of signature expirations (tests); nil is time.Now.
	now func() time.Time
}

// trafficRoute returns the sandbox and port r is for: the headers
// SandboxIDHeader and SandboxPortHeader, or a host PORT-ID.Domain. port
// is 0 when it does not parse.
func (h *Handler) trafficRoute(r *http.Request) (id string, port int, ok bool) {
	if id := r.Header.Get(SandboxIDHeader); id != "" {
		port := EnvdPort
		if ps := r.Header.Get(SandboxPortHeader); ps != "" {
			port = parsePort(ps)
		}
		return id, port, true
	}
	if h.domain == "" || r.Host == "" {
		return "", 0, false
	}
	host := r.Host
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, found := strings.CutSuffix(host, "."+h.domain)
	if !found || strings.IndexByte(label, '.') >= 0 {
		return "", 0, false
	}
	ps, id, found := strings.Cut(label, "-")
	if !found || id == "" {
		return "", 0, false
	}
	return id, parsePort(ps), true
}

// parsePort parses a decimal port 1-65535; 0 when it is not one.
func parsePort(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || s[0] == '0' || s[0] == '+' {
		return 0
	}
	return n
}

// notFoundBody is E2B's answer for a sandbox its proxy does not know.
type notFoundBody struct {
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId"`
}

func (t *Traffic) log() *slog.Logger {
	if t.Logger == nil {
		return slog.Default()
	}
	return t.Logger
}

// serve routes one request to port of sandbox id.
func (t *Traffic) serve(w http.ResponseWriter, r *http.Request, id string, port int) {
	if t == nil || !lease.ValidID(id) {
		drain(r)
		writeJSON(w, http.StatusBadGateway, notFoundBody{"The sandbox was not found", id})
		return
	}
	if port == 0 {
		drain(r)
		writeError(w, http.StatusBadRequest, "bad sandbox port (want 1-65535)")
		return
	}
	l, err := t.Sandboxes.Get(r.Context(), id)
	if err != nil || l.Labels[LabelTemplate] == "" || !trafficState(l.State) {
		drain(r)
		writeJSON(w, http.StatusBadGateway, notFoundBody{"The sandbox was not found", id})
		return
	}
	edit := func(h http.Header) {
		h.Del(SandboxIDHeader)
		h.Del(SandboxPortHeader)
	}
	if port == EnvdPort {
		if l.Labels[LabelSecure] == "true" {
			if msg := t.checkAccess(r, id); msg != "" {
				t.log().Info("e2b: envd access refused", "lease_id", id, "path", r.URL.Path, "reason", msg)
				drain(r)
				refuse(w, r, msg)
				return
			}
		}
		agent := t.Tokens.AgentToken(id)
		edit = func(h http.Header) {
			h.Del(SandboxIDHeader)
			h.Del(SandboxPortHeader)
			h.Set(envd.AccessTokenHeader, agent)
		}
	}
	t.Proxy.ServePort(w, r, proxy.PortRequest{LeaseID: id, Port: port, Header: edit})
}

// trafficState reports whether a lease in state s takes traffic (a paused
// one is resumed by the proxy; a pending one is answered 409 by it).
func trafficState(s lease.State) bool {
	switch s {
	case lease.StatePending, lease.StateReady, lease.StatePaused:
		return true
	}
	return false
}

// checkAccess checks a secure sandbox's access: X-Access-Token equal to
// lease id's token, or (a /files request without that header) a valid
// signature made with it. It returns why it refused, or "".
func (t *Traffic) checkAccess(r *http.Request, id string) string {
	want := t.Tokens.Token(id)
	if want == "" {
		return "the sandbox has no access token"
	}
	if h, sent := r.Header[http.CanonicalHeaderKey(envd.AccessTokenHeader)]; sent {
		if len(h) == 1 && subtle.ConstantTimeCompare([]byte(h[0]), []byte(want)) == 1 {
			return ""
		}
		return "invalid access token"
	}
	q := r.URL.Query()
	if r.URL.Path != "/files" || !q.Has("signature") {
		return "missing access token (send " + envd.AccessTokenHeader + ": the sandbox's envdAccessToken)"
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	var exp *int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return "bad signature_expiration"
		}
		now := time.Now
		if t.now != nil {
			now = t.now
		}
		if now().Unix() > n {
			return "the signature expired"
		}
		exp = &n
	}
	sig := envd.Signature(q.Get("path"), op, q.Get("username"), want, exp)
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(sig)) != 1 {
		return "invalid signature"
	}
	return ""
}

// refuse answers 401: as a Connect error on envd's Connect routes, as
// envd's JSON error elsewhere.
func refuse(w http.ResponseWriter, r *http.Request, msg string) {
	if strings.HasPrefix(r.URL.Path, "/process.Process/") || strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/") {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"code": "unauthenticated", "message": msg})
		return
	}
	writeError(w, http.StatusUnauthorized, msg)
}

// drain reads a small refused body so the client reads the answer rather
// than a reset; a large one closes the connection.
func drain(r *http.Request) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 64<<10))
	}
}
