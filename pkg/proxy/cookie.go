package proxy

import (
	"net/http"
	"net/url"
	"strings"
)

// isCookie reports whether one cookie-pair of a Cookie header (the text
// between two ';') is the cookie name: its name, trimmed of white space, is
// name. net/http's Request.Cookies trims names too (of spaces and tabs
// only), so whatever net/http reads as that cookie is one here.
func isCookie(pair, name string) bool {
	n, _, _ := strings.Cut(pair, "=")
	return strings.TrimSpace(n) == name
}

// eachCookie calls fn with every cookie-pair named name (isCookie) in h's
// Cookie headers, in order, and, when strip is set, removes them all from
// h, keeping the other cookies as sent. Reading and stripping share this
// one function so a credential that is accepted can never be forwarded.
func eachCookie(h http.Header, name string, strip bool, fn func(pair string)) {
	vals := h["Cookie"]
	if len(vals) == 0 {
		return
	}
	var kept []string
	changed := false
	for _, v := range vals {
		if !strings.Contains(v, name) {
			kept = append(kept, v)
			continue
		}
		var parts []string
		for part := range strings.SplitSeq(v, ";") {
			if !isCookie(part, name) {
				if p := strings.TrimSpace(part); p != "" {
					parts = append(parts, p)
				}
				continue
			}
			changed = true
			fn(part)
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
}

// tokenCookies returns the values of the token cookies in h's Cookie
// headers, parsed by net/http, and, when strip is set, removes every token
// cookie from h (including ones whose value net/http refuses), keeping the
// other cookies as sent.
func tokenCookies(h http.Header, strip bool) []string {
	var toks []string
	eachCookie(h, TokenCookie, strip, func(part string) {
		// The value as net/http's Request.Cookies parses it (the parser
		// that also trims the name; http.ParseCookie does not).
		one := http.Request{Header: http.Header{"Cookie": {part}}}
		for _, c := range one.CookiesNamed(TokenCookie) {
			toks = append(toks, c.Value)
		}
	})
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
