package proxy

import (
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// A browser's WebSocket cannot send an Authorization header; the one
// header it lets a page fill is Sec-WebSocket-Protocol. On agent routes a
// WebSocket upgrade may therefore carry its token as an offered
// subprotocol "berth.token.TOKEN" (as Kubernetes takes
// "base64url.bearer.authorization.k8s.io.TOKEN"). The proxy removes that
// entry before forwarding, so the agent never sees it and selects one of
// the others (berth.terminal.v1): a browser offers both.
const (
	// TokenProtocolPrefix prefixes a token offered as a WebSocket
	// subprotocol on agent routes.
	TokenProtocolPrefix = "berth.token."
	wsProtocolHeader    = "Sec-WebSocket-Protocol"
)

// wsTokens is what a WebSocket upgrade offered in Sec-WebSocket-Protocol:
// the tokens, and the other subprotocols, to forward.
type wsTokens struct {
	tokens []string
	rest   []string
}

// protocolTokens returns the tokens offered as subprotocols by r, when r
// is a WebSocket upgrade that offers any; ok is false otherwise.
func protocolTokens(r *http.Request) (wt wsTokens, ok bool) {
	if r.Method != http.MethodGet || !isWebSocketUpgrade(r.Header) {
		return wsTokens{}, false
	}
	for _, v := range r.Header.Values(wsProtocolHeader) {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				continue
			}
			if tok, found := strings.CutPrefix(p, TokenProtocolPrefix); found {
				wt.tokens = append(wt.tokens, tok)
				ok = true
				continue
			}
			wt.rest = append(wt.rest, p)
		}
	}
	return wt, ok
}

// isWebSocketUpgrade reports whether h asks for a WebSocket upgrade
// ("Connection: upgrade" and "Upgrade: websocket").
func isWebSocketUpgrade(h http.Header) bool {
	if !strings.EqualFold(strings.TrimSpace(h.Get("Upgrade")), "websocket") {
		return false
	}
	for _, v := range h.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

// checkOrigin refuses an upgrade whose Origin is a page of another host
// than the one it was sent to: a token in the subprotocol is taken only
// from a page of the orchestrator's own origin (or from a client that is
// no browser and sends no Origin), so a token that leaked to a foreign page
// cannot be used from there. The scheme is not compared, so that a TLS
// terminator in front of the orchestrator does not matter; default ports
// are.
func checkOrigin(r *http.Request) *routeError {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		strings.EqualFold(stripDefaultPort(u.Host, u.Scheme), stripDefaultPort(r.Host, u.Scheme)) {
		return nil
	}
	return newRouteError(http.StatusForbidden, errdefs.ErrPermissionDenied,
		"WebSocket from origin %q refused: a token in %s is accepted only from a page of %s", origin, wsProtocolHeader, r.Host)
}

// stripDefaultPort removes scheme's default port from host.
func stripDefaultPort(host, scheme string) string {
	h, port, err := net.SplitHostPort(host)
	if err != nil {
		return host
	}
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		if strings.Contains(h, ":") {
			return "[" + h + "]"
		}
		return h
	}
	return host
}

// forwardProtocols sets the upstream's Sec-WebSocket-Protocol to the
// offered subprotocols without the tokens.
func forwardProtocols(h http.Header, rest []string) {
	h.Del(wsProtocolHeader)
	if len(rest) > 0 {
		h.Set(wsProtocolHeader, strings.Join(rest, ", "))
	}
}
