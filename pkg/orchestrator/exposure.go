package orchestrator

import (
	"log/slog"
	"net"
)

// LoopbackOnly reports whether addr (a listener's address) is reachable
// from this host only: a loopback IP. The unspecified address (0.0.0.0, ::)
// and every other IP are reachable from elsewhere.
func LoopbackOnly(addr net.Addr) bool {
	var ip net.IP
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip = a.IP
	default:
		host, _, err := net.SplitHostPort(addr.String())
		if err != nil {
			return false
		}
		ip = net.ParseIP(host)
	}
	return ip != nil && ip.IsLoopback()
}

// WarnExposure logs a warning when the orchestrator's listener is reachable
// from other hosts: it serves plain HTTP and gRPC (no TLS), so bearer tokens
// and sandbox traffic cross the network in clear text.
func WarnExposure(log *slog.Logger, addr net.Addr) {
	if LoopbackOnly(addr) {
		return
	}
	log.Warn("listening on a non-loopback address without TLS: tokens and sandbox traffic travel in clear text; "+
		"listen on 127.0.0.1 behind a TLS-terminating proxy, or restrict the network", "addr", addr.String())
}
