package egress

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// DNSAddress is the name server sandboxes are given (their resolv.conf, or
// Docker's --dns): a link-local address that no network owns. Nothing
// answers there: the sandbox's DNS packets (to any address, port 53) are
// redirected to berth's resolver on the host before they are routed.
const DNSAddress = "169.254.53.53"

// HostUpstreams returns the name servers of the host's /etc/resolv.conf as
// host:53 (the resolver runs in the host's network namespace, so loopback
// servers such as systemd-resolved's 127.0.0.53 work).
func HostUpstreams() []string {
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) >= 2 && fl[0] == "nameserver" {
			if a, err := netip.ParseAddr(fl[1]); err == nil {
				out = append(out, net.JoinHostPort(a.String(), "53"))
			}
		}
	}
	return out
}

// listener is the resolver's UDP and TCP servers on one gateway address.
type listener struct {
	port     int
	udp, tcp *dns.Server
}

// listen starts the resolver on addr, on port when it is free (0: any).
func listen(addr netip.Addr, port int, h dns.Handler) (*listener, error) {
	var lastErr error
	for try := 0; try < 8; try++ {
		pc, err := net.ListenPacket("udp4", net.JoinHostPort(addr.String(), fmt.Sprint(port)))
		if err != nil {
			if port != 0 {
				port = 0 // taken on this address: any other
				continue
			}
			return nil, err
		}
		p := pc.LocalAddr().(*net.UDPAddr).Port
		tl, err := net.Listen("tcp4", net.JoinHostPort(addr.String(), fmt.Sprint(p)))
		if err != nil {
			pc.Close()
			lastErr, port = err, 0
			continue
		}
		l := &listener{port: p,
			udp: &dns.Server{PacketConn: pc, Handler: h},
			tcp: &dns.Server{Listener: tl, Handler: h, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second},
		}
		var wg sync.WaitGroup
		wg.Add(2)
		l.udp.NotifyStartedFunc, l.tcp.NotifyStartedFunc = wg.Done, wg.Done
		go func() { _ = l.udp.ActivateAndServe() }()
		go func() { _ = l.tcp.ActivateAndServe() }()
		wg.Wait()
		return l, nil
	}
	return nil, lastErr
}

func (l *listener) close() {
	_ = l.udp.Shutdown()
	_ = l.tcp.Shutdown()
}

// ServeDNS answers a sandbox's query according to its policy.
func (e *Enforcer) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	reply := func(m *dns.Msg) { _ = w.WriteMsg(m) }
	fail := func(rcode int) {
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		m.RecursionAvailable = true
		reply(m)
	}
	met := e.cfg.Metrics
	if len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		met.query(dnsRefused)
		fail(dns.RcodeRefused)
		return
	}
	src := remoteAddr(w.RemoteAddr())
	e.mu.Lock()
	sb := e.byIP[src]
	var pol *Compiled
	lease := ""
	if sb != nil {
		pol, lease = sb.policy, sb.lease
	}
	e.mu.Unlock()
	if sb == nil {
		met.query(dnsRefused)
		fail(dns.RcodeRefused)
		return
	}
	q := req.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	v := pol.Name(name)
	if !v.Resolve {
		e.log.Debug("egress: name refused", "lease_id", lease, "name", name)
		met.query(dnsDenied)
		fail(dns.RcodeNameError)
		return
	}
	restricted := pol.Mode == ModeRestricted
	if restricted && q.Qtype != dns.TypeA && q.Qtype != dns.TypeCNAME {
		// Sandboxes have IPv4 only: nothing else is opened for them.
		m := new(dns.Msg)
		m.SetReply(req)
		m.RecursionAvailable = true
		met.query(dnsAnswered)
		reply(m)
		return
	}
	up, err := e.forward(req)
	if err != nil {
		e.log.Debug("egress: upstream failed", "lease_id", lease, "name", name, "err", err)
		met.query(dnsFailed)
		fail(dns.RcodeServerFailure)
		return
	}
	up.Id = req.Id
	var addrs []netip.Addr
	var ttl uint32
	for _, rr := range up.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				addrs = append(addrs, ip)
				if ttl == 0 || a.Hdr.Ttl < ttl {
					ttl = a.Hdr.Ttl
				}
			}
		}
	}
	if restricted {
		// Only A records reach a restricted sandbox.
		kept := up.Answer[:0]
		for _, rr := range up.Answer {
			if t := rr.Header().Rrtype; t == dns.TypeA || t == dns.TypeCNAME {
				kept = append(kept, rr)
			}
		}
		up.Answer = kept
	}
	if len(addrs) > 0 && (restricted && len(v.AllowPorts) > 0 || len(v.DenyPorts) > 0) {
		if err := e.open(lease, addrs, v, time.Duration(ttl)*time.Second); err != nil {
			e.log.Warn("egress: open resolved addresses", "lease_id", lease, "name", name, "err", err)
			met.query(dnsFailed)
			fail(dns.RcodeServerFailure)
			return
		}
	}
	met.query(dnsAnswered)
	reply(up)
}

// forward asks the upstream servers in turn.
func (e *Enforcer) forward(req *dns.Msg) (*dns.Msg, error) {
	var lastErr error = fmt.Errorf("no upstream name server")
	for _, up := range e.cfg.Upstreams {
		c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
		m, _, err := c.Exchange(req, up)
		if err == nil && m.Truncated {
			c.Net = "tcp"
			m, _, err = c.Exchange(req, up)
		}
		if err != nil {
			lastErr = err
			continue
		}
		return m, nil
	}
	return nil, lastErr
}

func remoteAddr(a net.Addr) netip.Addr {
	var ip net.IP
	switch a := a.(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.TCPAddr:
		ip = a.IP
	}
	addr, _ := netip.AddrFromSlice(ip.To4())
	return addr
}

var _ dns.Handler = (*Enforcer)(nil)
