package proxy

import (
	"net/http"
	"strings"
)

// A path-form preview (/v1/sandboxes/LEASE/ports/PORT/…) is served on the
// orchestrator's own origin, where the dashboard (/ui) lives, and so is
// everything else a sandbox answers through the proxy (its agent's routes:
// a downloaded HTML file, say). A page that a tenant's sandbox serves
// there must not act with the dashboard's authority when the operator
// opens it (a preview that opens /ui/ and reads its CSRF value from
// sessionStorage, then lists and releases every owner's leases). So every
// answer from a sandbox on the orchestrator's origin carries previewCSP: the browser runs the page in a
// unique, opaque origin, where it can run its scripts, forms and popups
// but cannot read or write the orchestrator origin's storage, cookies or
// windows, and its requests to /ui are cross-site (the dashboard's
// SameSite=Strict cookie stays behind). Host-form previews have an origin
// of their own and are not confined. And no preview may set berth's
// cookies: a Set-Cookie naming one is dropped from every preview answer.

// previewCSP is the Content-Security-Policy added to every answer from a
// sandbox on the orchestrator's origin: a sandbox without allow-same-origin (popups inherit
// it: no allow-popups-to-escape-sandbox).
const previewCSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads allow-pointer-lock allow-presentation"

// berthCookiePrefix starts the name of every cookie berth sets (berth_ui,
// berth_token, berth_signed).
const berthCookiePrefix = "berth_"

// confine applies the rules above to the headers h of an answer from a
// sandbox; sameOrigin tells whether it is served on the orchestrator's
// origin (everything but a host-form preview).
func confine(h http.Header, sameOrigin bool) {
	if cs := h.Values("Set-Cookie"); len(cs) > 0 {
		kept := cs[:0:0]
		for _, c := range cs {
			if !strings.HasPrefix(strings.ToLower(setCookieName(c)), berthCookiePrefix) {
				kept = append(kept, c)
			}
		}
		h.Del("Set-Cookie")
		for _, c := range kept {
			h.Add("Set-Cookie", c)
		}
	}
	if sameOrigin {
		// Added, not set: the browser enforces every policy it is given,
		// so the app's own stays in force beside this one.
		h.Add("Content-Security-Policy", previewCSP)
	}
}

// setCookieName is the cookie name of a Set-Cookie header value, as a
// browser reads it: what comes before the first '=' of the first
// attribute, trimmed of white space.
func setCookieName(v string) string {
	first, _, _ := strings.Cut(v, ";")
	name, _, _ := strings.Cut(first, "=")
	return strings.TrimSpace(name)
}

// onOrchestratorOrigin reports whether t's answer is served on the
// orchestrator's own origin: every route but a host-form preview.
func (t *target) onOrchestratorOrigin() bool { return !t.preview || t.prefix != "" }
