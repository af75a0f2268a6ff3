// Package ui serves the operator dashboard at /ui: HTML, CSS and plain
// JavaScript embedded in the binary, a sign-in that keeps the caller's
// token in an HttpOnly cookie, and a small API shim, /ui/api/, that turns
// that cookie into the bearer token of the orchestrator's own REST API.
//
// # Sign-in and CSRF
//
// POST /ui/login (form field "token": the operator token or a client
// token; lease tokens are refused) sets the cookie berth_ui (Path=/ui,
// HttpOnly, SameSite=Strict, Secure over TLS) and answers
// {"role","owner","csrf"}. The token never appears in a URL. csrf is 256
// random bits drawn at each sign-in and kept beside the token in the
// cookie (which scripts cannot read), so it is valid for that session only:
// a new sign-in (or a sign-out) makes the old value useless. It is
// only ever returned by that sign-in answer: the page keeps it in
// sessionStorage, so it lives in the tab that signed in and not in any
// other page of the origin. Every /ui/api/ call must carry it as the
// X-Berth-CSRF header, reads included: the cookie alone opens nothing.
// Requests whose Origin (or Sec-Fetch-Site) says another site sent them
// are refused. POST /ui/logout clears the cookie.
//
// # API shim
//
// /ui/api/v1/leases… (and /v1/pools…, /v1/volumes…, /v1/snapshots… when
// the orchestrator serves them) go to the REST API unchanged but for the
// Authorization header, so the API's own authorization applies: a client
// sees its owner's leases only. GET /ui/api/v1/sandboxes/LEASE/v1/processes
// and /v1/info go through the sandbox proxy; for a client session the shim
// checks that the lease is the client's and uses the lease's token (which
// the client can get from acquire anyway). Sandbox reads of a lease that is
// not READY answer 409 without touching the proxy, so that the dashboard
// never resumes a PAUSED lease by looking at it.
package ui

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// Prefix is where the dashboard is mounted.
const Prefix = "/ui/"

// CookieName is the session cookie; its value is the base64url-encoded token.
const CookieName = "berth_ui"

// CSRFHeader carries the session's CSRF value on every /ui/api/ call.
const CSRFHeader = "X-Berth-CSRF"

// SignInHeader is set to "required" on the shim's answers that mean the
// tab must sign in again (no session, an invalid token, a missing or wrong
// CSRF value), so the page tells them from the API's own 401 and 403.
const SignInHeader = "X-Berth-Sign-In"

//go:embed static
var staticFS embed.FS

// xtermFS holds the browser terminal's files when scripts/ui-xterm.sh
// built them before the Go build (xterm/xterm.bundle.js, xterm/xterm.css);
// otherwise only its README.
//
//go:embed xterm
var xtermFS embed.FS

// terminalFiles reports whether the browser terminal was built in.
func terminalFiles() bool {
	_, err := fs.Stat(xtermFS, "xterm/xterm.bundle.js")
	return err == nil
}

// Identity is who a token signs in as.
type Identity struct {
	// Operator is true for the operator token: every lease, reap.
	Operator bool
	// Owner is the client's owner, or "operator".
	Owner string
}

// Authenticator maps a token to the Identity it signs in as; ok is false
// for an unknown token and for lease tokens (the dashboard is for
// operators and clients).
type Authenticator func(token string) (id Identity, ok bool)

// Leases is what the shim needs of the lease manager for sandbox reads;
// *lease.Manager implements it.
type Leases interface {
	// Get returns one lease.
	Get(ctx context.Context, id string) (lease.Lease, error)
}

var _ Leases = (*lease.Manager)(nil)

// Config configures the dashboard.
type Config struct {
	// API is the orchestrator's REST handler (it authenticates the bearer
	// token itself). Required.
	API http.Handler
	// Sandboxes is the sandbox proxy, as mounted at /v1/sandboxes/.
	// Without it the lease page shows no processes.
	Sandboxes http.Handler
	// Auth signs tokens in. Required.
	Auth Authenticator
	// Leases checks a client's sandbox reads. Required with Sandboxes.
	Leases Leases
	// Token returns a lease's token (the lease manager's Tokens().Token):
	// a client's sandbox reads are sent with it. Required with Sandboxes.
	Token func(leaseID string) string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Handler serves the dashboard under Prefix.
type Handler struct {
	cfg    Config
	log    *slog.Logger
	mux    *http.ServeMux
	static http.Handler
	// terminal is true when the browser terminal is served: its files
	// were built in and the proxy is there.
	terminal bool
}

// New returns the dashboard handler; mount it at "/ui/" (and "/ui").
func New(cfg Config) (*Handler, error) {
	if cfg.API == nil || cfg.Auth == nil {
		return nil, errors.New("ui: API and Auth are required")
	}
	if cfg.Sandboxes != nil && (cfg.Leases == nil || cfg.Token == nil) {
		return nil, errors.New("ui: Leases and Token are required with Sandboxes")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(),
		static:   http.StripPrefix("/ui/static/", http.FileServerFS(sub)),
		terminal: cfg.Sandboxes != nil && terminalFiles()}
	h.mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix, http.StatusFound)
	})
	h.mux.HandleFunc("GET /ui/{$}", h.index)
	h.mux.HandleFunc("GET /ui/static/", h.serveStatic)
	if h.terminal {
		xt := http.StripPrefix("/ui/", http.FileServerFS(xtermFS))
		for _, f := range []string{"xterm.bundle.js", "xterm.css"} {
			h.mux.HandleFunc("GET /ui/xterm/"+f, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Cache-Control", "no-cache")
				xt.ServeHTTP(w, r)
			})
		}
	}
	h.mux.HandleFunc("POST /ui/login", h.login)
	h.mux.HandleFunc("POST /ui/logout", h.logout)
	h.mux.HandleFunc("GET /ui/api/session", h.session)
	h.mux.HandleFunc("/ui/api/", h.apiShim)
	h.mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	return h, nil
}

// ServeHTTP serves the dashboard.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin") // no-referrer would make same-origin POSTs send "Origin: null"
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) index(w http.ResponseWriter, r *http.Request) {
	b, err := staticFS.ReadFile("static/index.html")
	if err != nil {
		http.Error(w, "ui: index missing", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}

func (h *Handler) serveStatic(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/") {
		http.NotFound(w, r) // no directory listings
		return
	}
	w.Header().Set("Cache-Control", "no-cache")
	h.static.ServeHTTP(w, r)
}

// newCSRF draws a session's CSRF value: 32 random bytes, hex.
func newCSRF() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sessionCookie is the cookie value of a session: the token, base64url,
// a dot and the session's CSRF value.
func sessionCookie(token, csrf string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(token)) + "." + csrf
}

// parseSession reads a session cookie's token and CSRF value; ok is false
// for anything else (a cookie of an older berth, which signed in without
// a CSRF value of its own, included).
func parseSession(value string) (token, csrf string, ok bool) {
	enc, csrf, found := strings.Cut(value, ".")
	tok, err := base64.RawURLEncoding.DecodeString(enc)
	if !found || err != nil || len(tok) == 0 || len(csrf) != 64 {
		return "", "", false
	}
	return string(tok), csrf, true
}

// sameOrigin reports whether r was sent by a page of this origin (or by a
// client that is no browser: no Origin, no Sec-Fetch-Site).
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host) && (u.Scheme == "http" || u.Scheme == "https")
}

func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (h *Handler) setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: value, Path: "/ui", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
}

// sessionInfo is the JSON of /ui/login and /ui/api/session.
type sessionInfo struct {
	Role  string `json:"role"`
	Owner string `json:"owner"`
	CSRF  string `json:"csrf,omitempty"`
	// Terminal tells the page that the browser terminal is served.
	Terminal bool `json:"terminal"`
}

func roleOf(id Identity) string {
	if id.Operator {
		return "operator"
	}
	return "client"
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, errdefs.Newf(errdefs.ErrPermissionDenied, "sign-in from another site refused"))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, errdefs.Newf(errdefs.ErrInvalidArgument, "token: cannot read the form: %v", err))
		return
	}
	tok := strings.TrimSpace(r.PostForm.Get("token"))
	if tok == "" {
		writeError(w, http.StatusBadRequest, errdefs.Newf(errdefs.ErrInvalidArgument, "token: required (the operator token or a client token)"))
		return
	}
	id, ok := h.cfg.Auth(tok)
	if !ok {
		h.log.Info("dashboard sign-in refused", "remote_addr", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, errdefs.Newf(errdefs.ErrUnauthenticated, "token: not an operator or client token"))
		return
	}
	h.log.Info("dashboard sign-in", "role", roleOf(id), "owner", id.Owner, "remote_addr", r.RemoteAddr)
	csrf := newCSRF()
	h.setCookie(w, r, sessionCookie(tok, csrf), 0)
	writeJSON(w, http.StatusOK, sessionInfo{Role: roleOf(id), Owner: id.Owner, CSRF: csrf, Terminal: h.terminal})
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, errdefs.Newf(errdefs.ErrPermissionDenied, "sign-out from another site refused"))
		return
	}
	h.setCookie(w, r, "", -1)
	w.WriteHeader(http.StatusNoContent)
}

// authorize returns the session's token and identity: the cookie must hold
// a valid token, the request must come from this origin and carry the
// session's CSRF value.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request) (string, Identity, bool) {
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, errdefs.Newf(errdefs.ErrPermissionDenied, "request from another site refused"))
		return "", Identity{}, false
	}
	var tok, want string
	c, err := r.Cookie(CookieName)
	ok := err == nil
	if ok {
		tok, want, ok = parseSession(c.Value)
	}
	if !ok {
		w.Header().Set(SignInHeader, "required")
		writeError(w, http.StatusUnauthorized, errdefs.Newf(errdefs.ErrUnauthenticated, "not signed in"))
		return "", Identity{}, false
	}
	id, ok := h.cfg.Auth(tok)
	if !ok {
		h.setCookie(w, r, "", -1)
		w.Header().Set(SignInHeader, "required")
		writeError(w, http.StatusUnauthorized, errdefs.Newf(errdefs.ErrUnauthenticated, "the session's token is no longer valid: sign in again"))
		return "", Identity{}, false
	}
	got := r.Header.Get(CSRFHeader)
	if got == "" && isWebSocket(r) {
		// A browser's WebSocket cannot set headers: the page offers the
		// value as the subprotocol berth.csrf.VALUE instead.
		got = wsCSRF(r.Header)
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		w.Header().Set(SignInHeader, "required")
		writeError(w, http.StatusForbidden, errdefs.Newf(errdefs.ErrPermissionDenied, "missing or wrong %s header: sign in again in this tab", CSRFHeader))
		return "", Identity{}, false
	}
	return tok, id, true
}

func (h *Handler) session(w http.ResponseWriter, r *http.Request) {
	_, id, ok := h.authorize(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, sessionInfo{Role: roleOf(id), Owner: id.Owner, Terminal: h.terminal})
}

// apiCollections are the REST collections the shim forwards to the API.
var apiCollections = []string{"/v1/leases", "/v1/pools", "/v1/volumes", "/v1/snapshots"}

// sandboxReads are the agent paths the shim reads through the proxy.
var sandboxReads = map[string]bool{"/v1/processes": true, "/v1/info": true}

// terminalPath is the agent's terminal WebSocket, forwarded when the
// browser terminal is built in.
const terminalPath = "/v1/terminals/ws"

// CSRFProtocolPrefix prefixes the CSRF value that a WebSocket upgrade
// offers as a subprotocol; the shim removes it before forwarding.
const CSRFProtocolPrefix = "berth.csrf."

// isWebSocket reports whether r asks for a WebSocket upgrade.
func isWebSocket(r *http.Request) bool {
	if r.Method != http.MethodGet || !strings.EqualFold(strings.TrimSpace(r.Header.Get("Upgrade")), "websocket") {
		return false
	}
	for _, v := range r.Header.Values("Connection") {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

// wsCSRF returns the CSRF value offered as a subprotocol, or "".
func wsCSRF(h http.Header) string {
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			if c, ok := strings.CutPrefix(strings.TrimSpace(p), CSRFProtocolPrefix); ok {
				return c
			}
		}
	}
	return ""
}

// stripCSRFProtocol removes the CSRF subprotocol from h, keeping the
// others (berth.terminal.v1, which the agent selects).
func stripCSRFProtocol(h http.Header) {
	var keep []string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(p, CSRFProtocolPrefix) {
				keep = append(keep, p)
			}
		}
	}
	h.Del("Sec-WebSocket-Protocol")
	if len(keep) > 0 {
		h.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
	}
}

func (h *Handler) apiShim(w http.ResponseWriter, r *http.Request) {
	tok, id, ok := h.authorize(w, r)
	if !ok {
		return
	}
	p := strings.TrimPrefix(r.URL.Path, "/ui/api")
	if path.Clean(p) != p {
		writeError(w, http.StatusNotFound, errdefs.Newf(errdefs.ErrNotFound, "no dashboard route %s", r.URL.Path))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	for _, c := range apiCollections {
		if p == c || strings.HasPrefix(p, c+"/") || strings.HasPrefix(p, c+":") {
			h.forward(w, r, h.cfg.API, p, tok)
			return
		}
	}
	if rest, ok := strings.CutPrefix(p, "/v1/sandboxes/"); ok && h.cfg.Sandboxes != nil {
		leaseID, agentPath, _ := strings.Cut(rest, "/")
		agentPath = "/" + agentPath
		terminal := h.terminal && agentPath == terminalPath && isWebSocket(r)
		if r.Method != http.MethodGet || !(sandboxReads[agentPath] || terminal) {
			writeError(w, http.StatusNotFound, errdefs.Newf(errdefs.ErrNotFound, "the dashboard reads only %s of a sandbox", "GET /v1/processes and /v1/info"))
			return
		}
		if terminal {
			stripCSRFProtocol(r.Header)
		}
		h.sandboxRead(w, r, id, tok, leaseID, p)
		return
	}
	writeError(w, http.StatusNotFound, errdefs.Newf(errdefs.ErrNotFound, "no dashboard route %s", r.URL.Path))
}

// sandboxRead forwards a GET of a READY lease's agent through the proxy
// with the token that opens it for this session.
func (h *Handler) sandboxRead(w http.ResponseWriter, r *http.Request, id Identity, tok, leaseID, p string) {
	l, err := h.cfg.Leases.Get(r.Context(), leaseID)
	if err != nil || (!id.Operator && l.Owner != id.Owner) {
		// Another owner's lease is as unknown as a missing one.
		writeError(w, http.StatusNotFound, errdefs.Newf(errdefs.ErrNotFound, "no lease %s", leaseID))
		return
	}
	if l.State != lease.StateReady {
		writeError(w, http.StatusConflict, errdefs.Newf(errdefs.ErrFailedPrecondition, "lease %s is %s: the dashboard reads only READY sandboxes (it never resumes a paused one)", leaseID, l.State))
		return
	}
	if !id.Operator {
		tok = h.cfg.Token(leaseID)
	}
	h.forward(w, r, h.cfg.Sandboxes, p, tok)
}

// forward serves r with next as if it had been sent to p with the bearer
// token tok and without the dashboard's cookie and CSRF header.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, next http.Handler, p, tok string) {
	r2 := r.Clone(r.Context())
	r2.URL.Path = p
	r2.URL.RawPath = ""
	r2.RequestURI = p
	if r.URL.RawQuery != "" {
		r2.RequestURI += "?" + r.URL.RawQuery
	}
	r2.Header.Del("Cookie")
	r2.Header.Del(CSRFHeader)
	r2.Header.Del("X-Berth-Token")
	r2.Header.Set("Authorization", "Bearer "+tok)
	next.ServeHTTP(w, r2)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers {"code","message","details"} as the REST API does.
func writeError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Cache-Control", "no-store")
	edge.WriteErrorStatus(w, status, err)
}
