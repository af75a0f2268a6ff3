package proxy

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// servePreview proxies a request to port of lease id's sandbox; prefix is
// the path-form prefix ("" for the host form) and rawPath the upstream
// path, escaped.
func (p *Proxy) servePreview(w http.ResponseWriter, r *http.Request, id string, port int, prefix, rawPath string) {
	var ts tokens
	ts.addAll(r.Header.Values(bearer.Header), r.Header.Values(TokenHeader))
	for _, v := range tokenCookies(r.Header, false) {
		ts.add(v)
	}
	rawQuery, qtok := cutQueryParam(r.URL.RawQuery, TokenQuery)
	ts.add(qtok)
	op, rerr := p.open(r.Context(), id, &ts, port, origin{"preview", r.Method, r.URL.Path, r.RemoteAddr})
	if rerr != nil {
		p.fail(w, r, true, id, rerr)
		return
	}
	defer op.hold.Done()
	rt, matched := op.rt, op.matched
	if qtok != "" && matched == strings.TrimSpace(qtok) && (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Upgrade") == "" {
		p.bootstrap(w, r, matched, prefix, rawQuery)
		return
	}
	t, rerr := portTarget(id, rt, port, prefix, rawPath, rawQuery)
	if rerr != nil {
		p.fail(w, r, true, id, rerr)
		return
	}
	// An Authorization header that carries a berth token is not passed to
	// the previewed port; any other (the app's own) is.
	t.stripAuth = p.hasBerthAuth(r.Header)
	t.hold = op.hold
	p.forward(w, r, t)
}

// portTarget is the target of a request to port of lease id's sandbox
// (route rt): prefix is the path-form prefix, rawPath the upstream path,
// escaped, and rawQuery the query to pass on.
func portTarget(id string, rt lease.Route, port int, prefix, rawPath, rawQuery string) (*target, *routeError) {
	host, _, err := net.SplitHostPort(rt.Endpoint)
	if err != nil {
		return nil, newRouteError(http.StatusBadGateway, errdefs.ErrUnavailable, "lease %s has a bad endpoint %q", id, rt.Endpoint)
	}
	path, err := url.PathUnescape(rawPath)
	if err != nil {
		return nil, errBadEscape()
	}
	return &target{
		leaseID: id, host: net.JoinHostPort(host, strconv.Itoa(port)), path: path, rawPath: rawPath,
		rawQuery: rawQuery, preview: true, port: port, prefix: prefix,
	}, nil
}

// hasBerthAuth reports whether an Authorization header in h carries a
// berth token (which is not passed to a previewed port).
func (p *Proxy) hasBerthAuth(h http.Header) bool {
	for tok := range bearer.FromHeader(h) {
		if p.isBerthToken(tok) {
			return true
		}
	}
	return false
}

// bootstrap turns a ?berth_token=TOKEN query into a cookie scoped to this
// preview (its host, or its path prefix) and redirects to the same URL
// without the parameter, so the token leaves the address bar and history.
func (p *Proxy) bootstrap(w http.ResponseWriter, r *http.Request, tok, prefix, rawQuery string) {
	path := "/"
	if prefix != "" {
		path = prefix + "/"
	}
	http.SetCookie(w, &http.Cookie{
		Name: TokenCookie, Value: tok, Path: path,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil,
	})
	p.redirectClean(w, r, rawQuery)
}

// redirectSlash answers 307 to prefix + "/" with the request's query: a
// preview's relative links need the trailing slash.
func (p *Proxy) redirectSlash(w http.ResponseWriter, r *http.Request, prefix string) {
	loc := prefix + "/"
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	http.Redirect(w, r, loc, http.StatusTemporaryRedirect)
	p.metrics.http(http.StatusTemporaryRedirect)
}

// redirectClean answers 302 Found to the request's own path with rawQuery
// (its query without the token or signature), not to be cached, and with
// no Referer sent from the next page.
func (p *Proxy) redirectClean(w http.ResponseWriter, r *http.Request, rawQuery string) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Location", localRedirect(r.URL.EscapedPath(), rawQuery))
	w.WriteHeader(http.StatusFound)
	p.metrics.http(http.StatusFound)
}

// isBerthToken reports whether tok is the operator token or any lease's
// token (such a value is never passed to a preview port).
func (p *Proxy) isBerthToken(tok string) bool {
	if p.cfg.Operator.Matches(tok) {
		return true
	}
	_, ok := p.leaseTokens.VerifyToken(tok)
	return ok
}

// cutQueryParam removes every name=value pair from a raw query, keeping the
// rest in order and as escaped, and returns the first value (decoded).
func cutQueryParam(raw, name string) (rest, value string) {
	if raw == "" || !strings.Contains(raw, name) {
		return raw, ""
	}
	var kept []string
	found := false
	for part := range strings.SplitSeq(raw, "&") {
		k, v, _ := strings.Cut(part, "=")
		if dk, err := url.QueryUnescape(k); err == nil && dk == name {
			if !found {
				if dv, err := url.QueryUnescape(v); err == nil {
					value, found = dv, true
				}
			}
			continue
		}
		if part != "" {
			kept = append(kept, part)
		}
	}
	return strings.Join(kept, "&"), value
}
