package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// MinHold is the least time an address the resolver opened stays open
// (longer when the answer's TTL is longer); a name resolved again renews it.
const MinHold = 5 * time.Minute

// Config configures an Enforcer.
type Config struct {
	// InstanceID tells this orchestrator's rules from others' on the same
	// host (Prune only touches its own). Default "default".
	InstanceID string
	// Upstreams are the name servers (host:port) the resolver asks.
	// Default: the host's (HostUpstreams).
	Upstreams []string
	// Logger receives the enforcer's logs. Default: discard.
	Logger *slog.Logger
	// MinHold overrides MinHold (tests).
	MinHold time.Duration
	// Metrics receives the enforcer's figures (metrics.go). Default: its
	// own, unregistered.
	Metrics *Metrics
}

// Enforcer programs sandboxes' policies on this host and runs their
// resolver. It is safe for concurrent use.
type Enforcer struct {
	cfg Config
	log *slog.Logger
	ipt ipt

	// prog serialises programming in this process (the flock does across
	// processes) so that a sandbox's rules are written in order.
	prog sync.Mutex

	mu        sync.Mutex
	sandboxes map[string]*sandbox // by lease id
	byIP      map[netip.Addr]*sandbox
	listeners map[netip.Addr]*listener
	closed    bool
	stop      chan struct{}
	done      chan struct{}
}

// sandbox is one lease's enforced state.
type sandbox struct {
	lease   string
	ip      netip.Addr
	iface   string
	subnet  netip.Prefix
	gateway netip.Addr
	policy  *Compiled
	// dyn maps a resolved address and port to when it expires.
	dyn map[dynEntry]time.Time
	// programmed: the rules for these fields (and resolverPort) are in
	// place, as far as this enforcer knows (the repair loop checks).
	programmed   bool
	resolverPort int
}

// same reports whether sb was programmed with exactly these fields.
// Called with e.mu held.
func (sb *sandbox) same(ip netip.Addr, iface string, gw netip.Addr, subnet netip.Prefix, c *Compiled, port int) bool {
	return sb.programmed && sb.ip == ip && sb.iface == iface && sb.gateway == gw && sb.subnet == subnet &&
		sb.resolverPort == port && sb.policy != nil && sb.policy.Mode == c.Mode &&
		slices.Equal(sb.policy.Allow, c.Allow) && slices.Equal(sb.policy.Deny, c.Deny)
}

// Available reports why enforcement cannot work on this host (nil when it
// can): it needs root and iptables with iptables-restore.
func Available() error {
	if os.Geteuid() != 0 {
		return errdefs.FailedPrecondition("egress: network policies need root (CAP_NET_ADMIN) to program iptables")
	}
	for _, c := range []string{"iptables", "iptables-restore"} {
		if _, err := exec.LookPath(c); err != nil {
			return errdefs.FailedPrecondition("egress: %s not found (Debian: apt-get install iptables)", c)
		}
	}
	return nil
}

// New returns an Enforcer; errdefs.ErrFailedPrecondition when this host
// cannot enforce (see Available).
func New(cfg Config) (*Enforcer, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	return newEnforcer(cfg, execIPT{}), nil
}

func newEnforcer(cfg Config, x ipt) *Enforcer {
	if cfg.InstanceID == "" {
		cfg.InstanceID = "default"
	}
	if cfg.Upstreams == nil {
		cfg.Upstreams = HostUpstreams()
	}
	if cfg.MinHold == 0 {
		cfg.MinHold = MinHold
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Enforcer{cfg: cfg, log: log, ipt: x,
		sandboxes: map[string]*sandbox{}, byIP: map[netip.Addr]*sandbox{}, listeners: map[netip.Addr]*listener{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go e.expireLoop()
	return e
}

// Close stops the resolver and forgets the sandboxes; their rules stay
// (the next orchestrator re-applies or prunes them).
func (e *Enforcer) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	ls := e.listeners
	e.listeners = map[netip.Addr]*listener{}
	e.mu.Unlock()
	close(e.stop)
	<-e.done
	for _, l := range ls {
		l.close()
	}
	return nil
}

// DNS returns the name servers to give a sandbox (DNSAddress).
func (e *Enforcer) DNS() []string { return []string{DNSAddress} }

// hostNet finds the local interface whose network holds ip: its name, the
// host's address there (the sandbox's gateway) and the network.
func hostNet(ip netip.Addr) (string, netip.Addr, netip.Prefix, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", netip.Addr{}, netip.Prefix{}, err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ga, ok := netip.AddrFromSlice(n.IP.To4())
			if !ok {
				continue
			}
			ones, _ := n.Mask.Size()
			pfx := netip.PrefixFrom(ga, ones)
			if pfx.Contains(ip) && ga != ip {
				return ifc.Name, ga, pfx.Masked(), nil
			}
		}
	}
	return "", netip.Addr{}, netip.Prefix{}, fmt.Errorf("no local network holds %s", ip)
}

// Apply enforces p for lease's sandbox, whose agent endpoint (host:port
// on the sandbox's network) is endpoint, replacing what the lease had
// (its address may have changed). Connections opened before stay open;
// new ones follow p at once.
func (e *Enforcer) Apply(ctx context.Context, lease, endpoint string, p Policy) (err error) {
	start := time.Now()
	defer func() { e.cfg.Metrics.applied(start, err) }()
	c, err := Compile(p)
	if err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		host = endpoint
	}
	ip, err := netip.ParseAddr(host)
	if (err != nil || !ip.Is4()) && c.Mode == ModeOpen && len(c.Deny) == 0 {
		return nil
	}
	if err != nil || !ip.Is4() {
		return errdefs.FailedPrecondition("egress: lease %s: sandbox endpoint %q has no IPv4 address", lease, endpoint)
	}
	iface, gw, subnet, err := hostNet(ip)
	if err != nil && c.Mode == ModeOpen && len(c.Deny) == 0 {
		// Not a sandbox on a network of this host (an engine elsewhere, an
		// agent on loopback): an open policy has nothing to enforce here.
		e.log.Debug("egress: sandbox not on a local network; open policy not enforced", "lease_id", lease, "endpoint", endpoint)
		return nil
	}
	if err != nil {
		return errdefs.FailedPrecondition("egress: lease %s: the sandbox is not on a network of this host (%v): cannot enforce its policy", lease, err)
	}
	port, err := e.listenOn(gw)
	if err != nil {
		return fmt.Errorf("%w: egress: lease %s: start the resolver on %s: %w", errdefs.ErrInternal, lease, gw, err)
	}
	e.prog.Lock()
	defer e.prog.Unlock()
	e.mu.Lock()
	sb := e.sandboxes[lease]
	if sb != nil && e.byIP[ip] == sb && sb.same(ip, iface, gw, subnet, c, port) {
		// Programmed so already (a wake from hibernate at the same
		// address, a restart in place): iptables-restore's cost grows
		// with every sandbox's rules, so it is not run for nothing.
		e.mu.Unlock()
		return nil
	}
	if sb == nil {
		sb = &sandbox{lease: lease, dyn: map[dynEntry]time.Time{}}
		e.sandboxes[lease] = sb
	}
	if sb.ip.IsValid() && e.byIP[sb.ip] == sb {
		delete(e.byIP, sb.ip)
	}
	sb.ip, sb.iface, sb.gateway, sb.subnet, sb.policy = ip, iface, gw, subnet, c
	sb.programmed, sb.resolverPort = false, port
	e.byIP[ip] = sb
	// Resolved addresses stay only as far as the new policy allows them:
	// dropped at once; the next resolution opens what is allowed again.
	if len(sb.dyn) > 0 {
		sb.dyn = map[dynEntry]time.Time{}
	}
	rules := e.rulesLocked(sb, port)
	e.mu.Unlock()
	unlock := flock()
	defer unlock()
	if err := program(ctx, e.ipt, rules); err != nil {
		return fmt.Errorf("%w: egress: lease %s: program rules: %w", errdefs.ErrInternal, lease, err)
	}
	e.mu.Lock()
	if e.sandboxes[lease] == sb {
		sb.programmed = true
	}
	e.mu.Unlock()
	e.log.Debug("egress policy applied", "lease_id", lease, "address", ip, "bridge", iface, "mode", c.Mode,
		"allow", len(c.Allow), "deny", len(c.Deny))
	return nil
}

// rulesLocked returns what to program for sb. Called with e.mu held.
func (e *Enforcer) rulesLocked(sb *sandbox, port int) sandboxRules {
	r := sandboxRules{Instance: e.cfg.InstanceID, Lease: sb.lease, IP: sb.ip, Iface: sb.iface, Subnet: sb.subnet,
		Gateway: sb.gateway, ResolverPort: port, Policy: sb.policy}
	for d := range sb.dyn {
		r.Dynamic = append(r.Dynamic, d)
	}
	slices.SortFunc(r.Dynamic, func(a, b dynEntry) int {
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		return a.Port - b.Port
	})
	return r
}

// listenOn starts the resolver on gw (once) and returns its port.
func (e *Enforcer) listenOn(gw netip.Addr) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, errors.New("enforcer closed")
	}
	if l := e.listeners[gw]; l != nil {
		return l.port, nil
	}
	want := 0
	for _, l := range e.listeners {
		want = l.port
		break
	}
	l, err := listen(gw, want, e)
	if err != nil {
		return 0, err
	}
	e.listeners[gw] = l
	return l.port, nil
}

// open records addrs (resolved for a name with verdict v) for lease and
// reprograms its rules when that adds an entry.
func (e *Enforcer) open(lease string, addrs []netip.Addr, v Verdict, ttl time.Duration) error {
	hold := max(ttl, e.cfg.MinHold)
	e.prog.Lock()
	defer e.prog.Unlock()
	e.mu.Lock()
	sb := e.sandboxes[lease]
	if sb == nil {
		e.mu.Unlock()
		return nil
	}
	l := e.listeners[sb.gateway]
	until := time.Now().Add(hold)
	changed := false
	add := func(d dynEntry) {
		if _, ok := sb.dyn[d]; !ok {
			changed = true
		}
		if sb.dyn[d].Before(until) {
			sb.dyn[d] = until
		}
	}
	for _, a := range addrs {
		if sb.policy.Mode == ModeRestricted {
			for _, p := range v.AllowPorts {
				add(dynEntry{Addr: a, Port: p, Allow: true})
			}
		}
		for _, p := range v.DenyPorts {
			add(dynEntry{Addr: a, Port: p})
		}
	}
	if !changed || l == nil {
		e.mu.Unlock()
		return nil
	}
	rules := e.rulesLocked(sb, l.port)
	e.mu.Unlock()
	unlock := flock()
	defer unlock()
	err := program(context.Background(), e.ipt, rules)
	if err != nil {
		e.unprogrammed(lease)
	}
	return err
}

// unprogrammed notes that lease's rules may not be what its policy says
// (programming them failed), so that the next Apply programs them again.
func (e *Enforcer) unprogrammed(lease string) {
	e.mu.Lock()
	if sb := e.sandboxes[lease]; sb != nil {
		sb.programmed = false
	}
	e.mu.Unlock()
}

// expireLoop closes resolved addresses whose time is up.
func (e *Enforcer) expireLoop() {
	defer close(e.done)
	t := time.NewTicker(min(e.cfg.MinHold/4, 15*time.Second))
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.expire(time.Now())
			e.repair()
		}
	}
}

func (e *Enforcer) expire(now time.Time) {
	e.prog.Lock()
	defer e.prog.Unlock()
	e.mu.Lock()
	var todo []sandboxRules
	for _, sb := range e.sandboxes {
		n := len(sb.dyn)
		for d, until := range sb.dyn {
			if now.After(until) {
				delete(sb.dyn, d)
			}
		}
		if len(sb.dyn) != n {
			if l := e.listeners[sb.gateway]; l != nil {
				todo = append(todo, e.rulesLocked(sb, l.port))
			}
		}
	}
	e.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	unlock := flock()
	defer unlock()
	for _, r := range todo {
		if err := program(context.Background(), e.ipt, r); err != nil {
			e.log.Warn("egress: close expired addresses", "lease_id", r.Lease, "err", err)
			e.unprogrammed(r.Lease)
		}
	}
}

// repair puts the jumps to berth's chains back at the top of their parents
// (a firewall reload, Docker or another tool inserting above them) and
// reprograms the sandboxes whose rules went missing (a flush).
func (e *Enforcer) repair() {
	ctx := context.Background()
	e.prog.Lock()
	defer e.prog.Unlock()
	e.mu.Lock()
	n := len(e.sandboxes)
	e.mu.Unlock()
	if n == 0 {
		return
	}
	unlock := flock()
	defer unlock()
	t, err := snapshot(ctx, e.ipt)
	if err != nil {
		e.log.Warn("egress: read the rules", "err", err)
		return
	}
	if bf, bn := baseLines(t); len(bf) > 0 || len(bn) > 0 {
		e.log.Warn("egress: berth's chains were not first in FORWARD, INPUT or PREROUTING; putting them back")
		if err := e.ipt.restore(ctx, bf, bn); err != nil {
			e.log.Warn("egress: repair the jumps", "err", err)
		}
	}
	e.mu.Lock()
	var todo []sandboxRules
	for _, sb := range e.sandboxes {
		// Not when another lease's rules hold the address now: a newer
		// sandbox has it (ours died and awaits its restart or removal).
		others, _ := stale(t, sandboxRules{Instance: e.cfg.InstanceID, Lease: sb.lease, IP: sb.ip, Iface: sb.iface})
		taken := len(others) > 0
		if l := e.listeners[sb.gateway]; l != nil && !taken && len(dispatchOf(t.filter, e.cfg.InstanceID, sb.lease)) < 2 {
			todo = append(todo, e.rulesLocked(sb, l.port))
		}
	}
	e.mu.Unlock()
	for _, r := range todo {
		e.log.Warn("egress: a sandbox's rules were missing; programming them again", "lease_id", r.Lease)
		if err := program(ctx, e.ipt, r); err != nil {
			e.log.Warn("egress: reprogram", "lease_id", r.Lease, "err", err)
			e.unprogrammed(r.Lease)
		}
	}
}

// Remove deletes lease's rules (nothing to delete is success).
func (e *Enforcer) Remove(ctx context.Context, lease string) error {
	e.prog.Lock()
	defer e.prog.Unlock()
	e.mu.Lock()
	if sb := e.sandboxes[lease]; sb != nil {
		if e.byIP[sb.ip] == sb {
			delete(e.byIP, sb.ip)
		}
		delete(e.sandboxes, lease)
	}
	e.mu.Unlock()
	unlock := flock()
	defer unlock()
	t, err := snapshot(ctx, e.ipt)
	if err != nil {
		return fmt.Errorf("egress: lease %s: %w", lease, err)
	}
	if err := unprogram(ctx, e.ipt, t, e.cfg.InstanceID, lease); err != nil {
		return fmt.Errorf("egress: lease %s: remove rules: %w", lease, err)
	}
	return nil
}

// Prune removes the rules of this instance's leases for which keep is
// false (leases that ended while no orchestrator ran).
func (e *Enforcer) Prune(ctx context.Context, keep func(lease string) bool) error {
	unlock := flock()
	t, err := snapshot(ctx, e.ipt)
	unlock()
	if err != nil {
		return fmt.Errorf("egress: prune: %w", err)
	}
	var errs []error
	for _, lease := range leasesOf(t, e.cfg.InstanceID) {
		if !keep(lease) {
			errs = append(errs, e.Remove(ctx, lease))
		}
	}
	return errors.Join(errs...)
}

// Leases returns the leases this instance has rules for on the host.
func (e *Enforcer) Leases(ctx context.Context) ([]string, error) {
	t, err := snapshot(ctx, e.ipt)
	if err != nil {
		return nil, err
	}
	return leasesOf(t, e.cfg.InstanceID), nil
}

// RemoveInstance deletes every rule of instance's leases on this host (a
// test's cleanup after removing its sandboxes behind the orchestrator's
// back; an orchestrator prunes its own at start). Without iptables or root
// there is nothing to remove.
func RemoveInstance(ctx context.Context, instance string) error {
	if Available() != nil {
		return nil
	}
	unlock := flock()
	defer unlock()
	x := execIPT{}
	t, err := snapshot(ctx, x)
	if err != nil {
		return err
	}
	var errs []error
	for _, lease := range leasesOf(t, instance) {
		errs = append(errs, unprogram(ctx, x, t, instance, lease))
	}
	return errors.Join(errs...)
}
