package proxy

import (
	"net/http"
	"net/url"
	pathpkg "path"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// Signed URLs open one preview port, or download or upload one file, of a
// lease without any other credential (see lease.SignedScope and
// docs/signed-urls.md):
//
//	/v1/signed/{lease}/ports/{port}/{path}?berth_exp=UNIX&berth_sig=SIG[&berth_method=M]
//	/v1/signed/{lease}/files/{absolute path without its leading /}?berth_exp=UNIX&berth_sig=SIG
//
// A port URL covers every path under the port, with any method unless it
// names one (berth_method; GET also serves HEAD). A file URL serves GET
// and HEAD when it was signed as a download, PUT when signed as an upload.
// The signature is checked first (in constant time), then the expiry, then
// that the lease is live (a PAUSED lease is resumed): a missing signature
// is 401, a wrong or expired one 403, an ended lease 410, each with a body
// that says which. The berth_* parameters and the signed cookie never
// reach the sandbox.
//
// A browser's navigation (a GET that accepts text/html) to a port URL gets
// the same treatment as a ?berth_token= preview: an HttpOnly, SameSite=Lax
// cookie (Secure over TLS, or with X-Forwarded-Proto: https) scoped to /v1/signed/{lease}/ports/{port}/ and
// expiring with the signature, and a redirect to the same URL without the
// signature, so it leaves the address bar and history. Other clients (curl,
// scripts) are served directly.

// Names of the parts of a signed URL.
const (
	// SignedPrefix is the URL path prefix of signed URLs.
	SignedPrefix = "/v1/signed/"
	// SignedExpiresQuery carries the expiry (Unix seconds).
	SignedExpiresQuery = "berth_exp"
	// SignedSignatureQuery carries the signature (base64url).
	SignedSignatureQuery = "berth_sig"
	// SignedMethodQuery carries the one method a port URL is signed for;
	// absent means any method.
	SignedMethodQuery = "berth_method"
	// SignedCookie carries a port URL's signature after a browser's first
	// visit ("METHOD.EXPIRES.SIG").
	SignedCookie = "berth_signed"
)

// SignedVerifier is the optional part of a Config.Tokens that checks
// signed URLs (*lease.Tokens implements it). Without it every signed URL
// is 401.
type SignedVerifier interface {
	// VerifySigned reports whether sig is the signature of s (constant time).
	VerifySigned(s lease.SignedScope, sig string) bool
}

var _ SignedVerifier = (*lease.Tokens)(nil)

// SignedPath returns the path and query of the signed URL for s and its
// signature sig (append it to the orchestrator's address).
func SignedPath(s lease.SignedScope, sig string) string {
	q := SignedExpiresQuery + "=" + strconv.FormatInt(s.Expires.Unix(), 10)
	var b strings.Builder
	b.WriteString(SignedPrefix + s.LeaseID)
	switch s.Kind {
	case lease.SignedPort:
		b.WriteString("/ports/" + strconv.Itoa(s.Port) + "/")
		if s.Method != lease.AnyMethod {
			q += "&" + SignedMethodQuery + "=" + url.QueryEscape(s.Method)
		}
	default:
		b.WriteString("/files" + (&url.URL{Path: s.Path}).EscapedPath())
	}
	b.WriteString("?" + q + "&" + SignedSignatureQuery + "=" + sig)
	return b.String()
}

// CleanSignedPath checks a file path for a signed URL: absolute and clean
// (no "..", ".", "//" or trailing '/' segments, which the URL could not
// carry unchanged), without NUL, not "/". It returns the path or an
// INVALID_ARGUMENT naming field.
func CleanSignedPath(field, p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.InvalidArgument(field, "required")
	case !strings.HasPrefix(p, "/"):
		return "", errdefs.InvalidArgument(field, "%q is not an absolute path", p)
	case strings.IndexByte(p, 0) >= 0:
		return "", errdefs.InvalidArgument(field, "contains a NUL byte")
	case p == "/":
		return "", errdefs.InvalidArgument(field, "names the root directory, not a file")
	case pathpkg.Clean(p) != p:
		return "", errdefs.InvalidArgument(field, "%q is not clean (want %q)", p, pathpkg.Clean(p))
	}
	return p, nil
}

// SignedMethod checks and normalizes the method of a port URL: "" and "*"
// are lease.AnyMethod, anything else an HTTP method token in upper case.
func SignedMethod(field, m string) (string, error) {
	if m == "" || m == lease.AnyMethod {
		return lease.AnyMethod, nil
	}
	m = strings.ToUpper(m)
	if len(m) > 16 || strings.IndexFunc(m, func(r rune) bool { return r < 'A' || r > 'Z' }) >= 0 {
		return "", errdefs.InvalidArgument(field, "%q is not an HTTP method", m)
	}
	return m, nil
}

// signedParts are the signature fields of one request, from its query or
// (port URLs) its cookie.
type signedParts struct {
	exp, sig, method string
	fromQuery        bool
}

// serveSigned serves one request under SignedPrefix; rest is the escaped
// path after the prefix.
func (p *Proxy) serveSigned(w http.ResponseWriter, r *http.Request, rest string) {
	id, after, _ := strings.Cut(rest, "/")
	kind, tail, _ := strings.Cut(after, "/")
	switch kind {
	case "ports":
		ps, appPath, slash := strings.Cut(tail, "/")
		port, ok := parsePort(ps)
		if !ok {
			p.fail(w, r, true, "", errNoRoute("bad preview port "+strconv.Quote(ps)))
			return
		}
		if !slash {
			p.redirectSlash(w, r, SignedPrefix+id+"/ports/"+ps)
			return
		}
		p.serveSignedPort(w, r, id, port, "/"+appPath)
	case "files":
		p.serveSignedFile(w, r, id, "/"+tail)
	default:
		p.fail(w, r, false, "", errNoRoute("not a signed URL: "+r.URL.Path+" (want "+SignedPrefix+"{lease}/ports/{port}/ or "+SignedPrefix+"{lease}/files/{path})"))
	}
}

// signedQuery takes the signature fields out of a raw query; rest is the
// query without them.
func signedQuery(raw string) (parts signedParts, rest string) {
	rest, parts.exp = cutQueryParam(raw, SignedExpiresQuery)
	rest, parts.sig = cutQueryParam(rest, SignedSignatureQuery)
	rest, parts.method = cutQueryParam(rest, SignedMethodQuery)
	parts.fromQuery = parts.exp != "" || parts.sig != ""
	return parts, rest
}

// signedCookie reads (and, with strip, removes) the signed cookies of h;
// it returns the last well-formed one.
func signedCookies(h http.Header, strip bool) (parts signedParts, ok bool) {
	eachCookie(h, SignedCookie, strip, func(part string) {
		_, val, _ := strings.Cut(part, "=")
		m, rest, ok1 := strings.Cut(strings.TrimSpace(val), ".")
		e, s, ok2 := strings.Cut(rest, ".")
		if ok1 && ok2 {
			parts, ok = signedParts{method: m, exp: e, sig: s}, true
		}
	})
	return parts, ok
}

// errForbidden is a 403 with its reason.
func errForbidden(format string, args ...any) *routeError {
	return newRouteError(http.StatusForbidden, errdefs.ErrPermissionDenied, format, args...)
}

// verifySigned checks parts against scope s (whose Method and Expires it
// fills from parts) and the request's method: signature first, then
// expiry, then method.
func (p *Proxy) verifySigned(r *http.Request, s lease.SignedScope, parts signedParts) *routeError {
	if parts.sig == "" || parts.exp == "" {
		return errUnauthenticated("missing signature: a signed URL carries " + SignedExpiresQuery + " and " + SignedSignatureQuery + " (get one with POST /v1/leases/{id}:sign)")
	}
	v, ok := p.leaseTokens.(SignedVerifier)
	if !ok {
		return errUnauthenticated("signed URLs are not supported by this server")
	}
	exp, err := strconv.ParseInt(parts.exp, 10, 64)
	if err != nil || exp <= 0 {
		return errForbidden("invalid signed URL: %s is not a Unix time", SignedExpiresQuery)
	}
	s.Expires = time.Unix(exp, 0)
	if !lease.ValidID(s.LeaseID) || !v.VerifySigned(s, parts.sig) {
		return errForbidden("invalid signature: the URL was changed, or was signed for another lease, port, path or method")
	}
	if now := time.Now(); !now.Before(s.Expires) {
		return errForbidden("signed URL expired at %s (%s ago)", s.Expires.UTC().Format(time.RFC3339), now.Sub(s.Expires).Round(time.Second))
	}
	if s.Method != lease.AnyMethod && r.Method != s.Method && !(s.Method == http.MethodGet && r.Method == http.MethodHead) {
		return errForbidden("this signed URL is for %s requests, not %s", s.Method, r.Method)
	}
	return nil
}

// openSigned verifies parts against scope s (verifySigned), then looks
// the lease up, resumes and holds it (admit) and checks that it takes
// traffic (so a URL stops working when its lease ends). On success the
// caller calls the hold's Done when the request ends.
func (p *Proxy) openSigned(r *http.Request, s lease.SignedScope, parts signedParts) (lease.Route, *lease.Hold, *routeError) {
	if rerr := p.verifySigned(r, s, parts); rerr != nil {
		return lease.Route{}, nil, rerr
	}
	id := s.LeaseID
	rt, rerr := p.lookup(id)
	var hold *lease.Hold
	if rerr == nil {
		rt, hold, rerr = p.admit(r.Context(), id, rt)
	}
	if rerr == nil {
		rerr = usable(id, rt)
	}
	if rerr != nil {
		hold.Done()
		return rt, nil, rerr
	}
	return rt, hold, nil
}

// serveSignedPort proxies a request of a signed port URL.
func (p *Proxy) serveSignedPort(w http.ResponseWriter, r *http.Request, id string, port int, rawPath string) {
	parts, rawQuery := signedQuery(r.URL.RawQuery)
	if !parts.fromQuery {
		parts, _ = signedCookies(r.Header, false)
	}
	if parts.method == "" {
		parts.method = lease.AnyMethod
	}
	s := lease.SignedScope{LeaseID: id, Kind: lease.SignedPort, Port: port, Method: parts.method}
	rt, hold, rerr := p.openSigned(r, s, parts)
	if rerr != nil {
		p.fail(w, r, true, id, rerr)
		return
	}
	defer hold.Done()
	prefix := SignedPrefix + id + "/ports/" + strconv.Itoa(port)
	if parts.fromQuery && (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		r.Header.Get("Upgrade") == "" && strings.Contains(r.Header.Get("Accept"), "text/html") {
		p.bootstrapSigned(w, r, parts, prefix, rawQuery)
		return
	}
	t, rerr := portTarget(id, rt, port, prefix, rawPath, rawQuery)
	if rerr != nil {
		p.fail(w, r, true, id, rerr)
		return
	}
	// The signature never reaches the app: neither its cookie nor its
	// query parameters (rawQuery is without them); nor a berth token in
	// Authorization.
	signedCookies(r.Header, true)
	t.stripAuth = p.hasBerthAuth(r.Header)
	t.hold = hold
	if parts.fromQuery {
		w.Header().Set("Referrer-Policy", "no-referrer")
	}
	p.log.Debug("signed preview access", "lease_id", id, "port", port, "method", r.Method, "path", r.URL.Path, "remote_addr", r.RemoteAddr)
	p.forward(w, r, t)
}

// bootstrapSigned turns a browser's first visit of a signed port URL into
// a cookie scoped to the port's prefix, expiring with the signature, and
// redirects to the URL without the signature (as bootstrap does for
// ?berth_token=).
func (p *Proxy) bootstrapSigned(w http.ResponseWriter, r *http.Request, parts signedParts, prefix, rawQuery string) {
	exp, _ := strconv.ParseInt(parts.exp, 10, 64) // verified
	http.SetCookie(w, &http.Cookie{
		Name: SignedCookie, Value: parts.method + "." + parts.exp + "." + parts.sig, Path: prefix + "/",
		Expires: time.Unix(exp, 0), HttpOnly: true, SameSite: http.SameSiteLaxMode,
		// Over TLS, or behind a TLS-terminating proxy that says so (a
		// client that lies only keeps the cookie from itself over http).
		Secure: r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"),
	})
	p.redirectClean(w, r, rawQuery)
}

// serveSignedFile serves a signed download (GET, HEAD) or upload (PUT) of
// the file at the escaped absolute path rawPath.
func (p *Proxy) serveSignedFile(w http.ResponseWriter, r *http.Request, id, rawPath string) {
	var s lease.SignedScope
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s = lease.SignedScope{LeaseID: id, Kind: lease.SignedDownload, Method: http.MethodGet}
	case http.MethodPut:
		s = lease.SignedScope{LeaseID: id, Kind: lease.SignedUpload, Method: http.MethodPut}
	default:
		w.Header().Set("Allow", "GET, HEAD, PUT")
		p.fail(w, r, false, id, newRouteError(http.StatusMethodNotAllowed, errdefs.ErrInvalidArgument,
			"method %s: signed file URLs take GET or HEAD (downloads) and PUT (uploads)", r.Method))
		return
	}
	path, err := url.PathUnescape(rawPath)
	if err != nil {
		p.fail(w, r, false, id, errBadEscape())
		return
	}
	if s.Path, err = CleanSignedPath("path", path); err != nil {
		p.fail(w, r, false, id, newRouteError(http.StatusBadRequest, errdefs.ErrInvalidArgument, "%s", err.Error()))
		return
	}
	parts, _ := signedQuery(r.URL.RawQuery)
	if parts.method != "" {
		p.fail(w, r, false, id, errForbidden("invalid signature: %s is not part of a file URL", SignedMethodQuery))
		return
	}
	rt, hold, rerr := p.openSigned(r, s, parts)
	if rerr != nil {
		p.fail(w, r, false, id, rerr)
		return
	}
	defer hold.Done()
	agentPath := strings.TrimSuffix(filesPrefix, "/") + s.Path
	// No query reaches the agent (upload mode, offsets): the holder of the
	// URL gets exactly the signed operation. Range headers pass.
	t := &target{
		leaseID: id, host: rt.Endpoint, path: agentPath, rawPath: (&url.URL{Path: agentPath}).EscapedPath(),
		agentToken: p.leaseTokens.AgentToken(id), stripAuth: true, hold: hold,
	}
	if s.Kind == lease.SignedDownload {
		t.disposition = mimeAttachment(pathpkg.Base(s.Path))
	}
	r.Header.Del("Cookie")
	if !p.limitUpload(w, r, t, rt) {
		p.metrics.http(t.status)
		return
	}
	p.log.Debug("signed file access", "lease_id", id, "kind", string(s.Kind), "path", s.Path, "remote_addr", r.RemoteAddr)
	p.forward(w, r, t)
}

// mimeAttachment is a Content-Disposition that saves a download under name.
func mimeAttachment(name string) string {
	ascii := strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e || r == '"' || r == '\\' {
			return '_'
		}
		return r
	}, name)
	return `attachment; filename="` + ascii + `"; filename*=UTF-8''` + url.PathEscape(name)
}
