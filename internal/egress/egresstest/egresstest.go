// Package egresstest builds network targets on this machine for egress
// tests: network namespaces joined to the host by a veth pair, with TCP
// servers inside, and a DNS server on loopback that answers test names.
// Everything is removed in t.Cleanup, also when the test fails.
package egresstest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

// Require skips (or, in CI, fails) unless the machine can run these tests:
// root, ip (iproute2) and iptables.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root (network namespaces, iptables)")
	}
	for _, c := range []string{"ip", "iptables", "iptables-restore"} {
		if _, err := exec.LookPath(c); err != nil {
			testenv.SkipOrFail(t, c+" not found (make deps)")
		}
	}
}

func run(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freeSubnet returns a /24 in 10.200.0.0/13 that no local address is in.
func freeSubnet(t testing.TB) netip.Prefix {
	t.Helper()
	addrs, _ := net.InterfaceAddrs()
	for i := 0; i < 64; i++ {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200 + b[0]%8, b[1], 0}), 24)
		clash := false
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok && p.Contains(ip) {
					clash = true
				}
			}
		}
		if !clash {
			return p
		}
	}
	t.Fatal("no free 10.200.0.0/13 subnet")
	return netip.Prefix{}
}

// Netns is a network namespace joined to the host by a veth pair: the
// host side is HostIface with HostAddr, the namespace side has Addrs (the
// first is its primary) and a default route through the host.
type Netns struct {
	Name      string
	HostIface string
	HostAddr  netip.Addr
	Addrs     []netip.Addr
	Subnet    netip.Prefix
}

// NewNetns creates a namespace with n addresses (n >= 1). kind goes into
// the names ("s" for a sandbox-like namespace, "t" for a target).
func NewNetns(t testing.TB, kind string, n int) *Netns {
	t.Helper()
	id := randHex(3)
	sub := freeSubnet(t)
	base := sub.Addr().As4()
	ns := &Netns{Name: "berth-egt-" + kind + id, HostIface: "begt" + kind + id, Subnet: sub}
	base[3] = 1
	ns.HostAddr = netip.AddrFrom4(base)
	for i := 0; i < n; i++ {
		base[3] = byte(2 + i)
		ns.Addrs = append(ns.Addrs, netip.AddrFrom4(base))
	}
	peer := "begp" + kind + id
	run(t, "ip", "netns", "add", ns.Name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", ns.HostIface).Run()
		_ = exec.Command("ip", "netns", "del", ns.Name).Run()
		_ = os.RemoveAll("/etc/netns/" + ns.Name)
	})
	run(t, "ip", "link", "add", ns.HostIface, "type", "veth", "peer", "name", peer, "netns", ns.Name)
	run(t, "ip", "addr", "add", ns.HostAddr.String()+"/24", "dev", ns.HostIface)
	run(t, "ip", "link", "set", ns.HostIface, "up")
	run(t, "ip", "netns", "exec", ns.Name, "ip", "link", "set", "lo", "up")
	for _, a := range ns.Addrs {
		run(t, "ip", "netns", "exec", ns.Name, "ip", "addr", "add", a.String()+"/24", "dev", peer)
	}
	run(t, "ip", "netns", "exec", ns.Name, "ip", "link", "set", peer, "up")
	run(t, "ip", "netns", "exec", ns.Name, "ip", "route", "add", "default", "via", ns.HostAddr.String())
	return ns
}

// Forward lets the host forward between the two namespaces (FORWARD's
// policy may be DROP, as with Docker), with rules appended at the end of
// FORWARD — below berth's jump at the top, as a bridge's own accept rules
// are — and NAT on the way to to.
func Forward(t testing.TB, from, to *Netns) {
	t.Helper()
	rules := [][]string{
		{"FORWARD", "-i", from.HostIface, "-o", to.HostIface, "-j", "ACCEPT"},
		{"FORWARD", "-i", to.HostIface, "-o", from.HostIface, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
	}
	for _, r := range rules {
		run(t, append([]string{"iptables", "-w", "10", "-A"}, r...)...)
	}
	t.Cleanup(func() {
		for _, r := range rules {
			_ = exec.Command("iptables", append([]string{"-w", "10", "-D"}, r...)...).Run()
		}
	})
	if b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(string(b)) != "1" {
		run(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	}
}

// Do runs fn on a thread inside the namespace (sockets it creates belong
// to the namespace for their lifetime).
func (ns *Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := unix.Open("/var/run/netns/"+ns.Name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Serve starts TCP servers in the namespace on every address and each of
// ports: each connection gets "ok\n". They stop in t.Cleanup.
func (ns *Netns) Serve(t testing.TB, ports ...int) {
	t.Helper()
	var ls []net.Listener
	err := ns.Do(func() error {
		for _, a := range ns.Addrs {
			for _, p := range ports {
				l, err := net.Listen("tcp4", net.JoinHostPort(a.String(), fmt.Sprint(p)))
				if err != nil {
					return err
				}
				ls = append(ls, l)
			}
		}
		return nil
	})
	for _, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte("ok\n"))
				_ = c.Close()
			}
		}()
	}
	t.Cleanup(func() {
		for _, l := range ls {
			l.Close()
		}
	})
	if err != nil {
		t.Fatalf("serve in %s: %v", ns.Name, err)
	}
}

// Dial connects from the namespace to addr (host:port) and reads the
// server's "ok": nil when it answered.
func (ns *Netns) Dial(addr string, timeout time.Duration) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp4", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if line != "ok\n" {
			return fmt.Errorf("unexpected answer %q", line)
		}
		return nil
	})
}

// Lookup asks server (host:port) for name's A records from the namespace.
func (ns *Netns) Lookup(server, name string, timeout time.Duration) ([]netip.Addr, int, error) {
	var addrs []netip.Addr
	rcode := -1
	err := ns.Do(func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		c := &dns.Client{Timeout: timeout}
		r, _, err := c.Exchange(m, server)
		if err != nil {
			return err
		}
		rcode = r.Rcode
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				ip, _ := netip.AddrFromSlice(a.A.To4())
				addrs = append(addrs, ip)
			}
		}
		return nil
	})
	return addrs, rcode, err
}

// DNS is an authoritative test name server on 127.0.0.1.
type DNS struct {
	// Addr is host:port.
	Addr string
	mu   sync.Mutex
	recs map[string][]netip.Addr
}

// Set makes name (without trailing dot) answer addrs.
func (d *DNS) Set(name string, addrs ...netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.recs[dns.Fqdn(strings.ToLower(name))] = addrs
}

// NewDNS starts a name server on 127.0.0.1 (UDP and TCP, one port)
// answering the names given to Set with TTL 5, others NXDOMAIN.
func NewDNS(t testing.TB) *DNS {
	t.Helper()
	d := &DNS{recs: map[string][]netip.Addr{}}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		d.mu.Lock()
		addrs, ok := d.recs[strings.ToLower(r.Question[0].Name)]
		d.mu.Unlock()
		if !ok {
			m.Rcode = dns.RcodeNameError
		} else if r.Question[0].Qtype == dns.TypeA {
			for _, a := range addrs {
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
					A:   a.AsSlice(),
				})
			}
		}
		_ = w.WriteMsg(m)
	})
	// One port for UDP and TCP: the kernel picks a free UDP port, whose
	// TCP twin may be taken by another process; then try another.
	var pc net.PacketConn
	var tl net.Listener
	for attempt := 0; ; attempt++ {
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if tl, err = net.Listen("tcp4", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if attempt == 20 {
			t.Fatal(err)
		}
	}
	us := &dns.Server{PacketConn: pc, Handler: h}
	ts := &dns.Server{Listener: tl, Handler: h}
	go func() { _ = us.ActivateAndServe() }()
	go func() { _ = ts.ActivateAndServe() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = us.ShutdownContext(ctx)
		_ = ts.ShutdownContext(ctx)
	})
	d.Addr = pc.LocalAddr().String()
	return d
}
