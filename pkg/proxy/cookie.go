package proxy

import (
	"net/http"
	"net/url"
	"strings"
)

// isTokenCookie reports whether one cookie-pair of a Cookie header (the text
// between two ';') is a token cookie: its name, trimmed of white space, is
// TokenCookie. net/http's Request.Cookies trims names too (of spaces and
// tabs only), so whatever net/http reads as a token cookie is one here.
func isTokenCookie(pair string) bool {
	name, _, _ := strings.Cut(pair, "=")
	return strings.TrimSpace(name) == TokenCookie
}

// tokenCookies returns the values of the token cookies in h's Cookie
// headers, parsed by net/http, and, when strip is set, removes every token
// cookie from h (including ones whose value net/http refuses), keeping the
// other cookies as sent. Reading and stripping share this one function so a
// token that is accepted can never be forwarded.
func tokenCookies(h http.Header, strip bool) []string {
	vals := h["Cookie"]
	if len(vals) == 0 {
		return nil
	}
	var toks []string
	var kept []string
	changed := false
	for _, v := range vals {
		if !strings.Contains(v, TokenCookie) {
			kept = append(kept, v)
			continue
		}
		var parts []string
		for part := range strings.SplitSeq(v, ";") {
			if !isTokenCookie(part) {
				if p := strings.TrimSpace(part); p != "" {
					parts = append(parts, p)
				}
				continue
			}
			changed = true
			// The value as net/http's Request.Cookies parses it (the
			// parser that also trims the name; http.ParseCookie does not).
			one := http.Request{Header: http.Header{"Cookie": {part}}}
			for _, c := range one.CookiesNamed(TokenCookie) {
				toks = append(toks, c.Value)
			}
		}
		if len(parts) > 0 {
			kept = append(kept, strings.Join(parts, "; "))
		}
	}
	if strip && changed {
		if len(kept) == 0 {
			h.Del("Cookie")
		} else {
			h["Cookie"] = kept
		}
	}
	return toks
}

// localRedirect returns a Location for a redirect that stays on the
// requested host: escapedPath with its leading run of slashes, backslashes,
// white space and control characters (raw or percent-encoded) collapsed
// into one '/', so that neither "//evil.example/x" nor "/\evil.example",
// "/%2F/evil.example" or "/\t/evil.example" can name another host; rawQuery
// is appended as it was sent. Anything that still parses with a scheme or a
// host becomes "/".
func localRedirect(escapedPath, rawQuery string) string {
	p := escapedPath
	for p != "" {
		c := p[0]
		switch {
		case c == '/' || c == '\\' || c <= ' ' || c == 0x7f:
			p = p[1:]
			continue
		case c == '%' && len(p) >= 3:
			if b, err := url.PathUnescape(p[:3]); err == nil && len(b) == 1 {
				if d := b[0]; d == '/' || d == '\\' || d <= ' ' || d == 0x7f {
					p = p[3:]
					continue
				}
			}
		}
		break
	}
	loc := "/" + p
	if rawQuery != "" {
		loc += "?" + rawQuery
	}
	u, err := url.Parse(loc)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		strings.HasPrefix(loc, "//") || strings.HasPrefix(loc, "/\\") {
		return "/"
	}
	return loc
}
