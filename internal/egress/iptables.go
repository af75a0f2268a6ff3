package egress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/iptables"
)

// Chains of the filter and nat tables that berth's egress rules live in.
const (
	// ForwardChain is jumped to from the top of FORWARD (and DOCKER-USER);
	// it dispatches each sandbox's forwarded traffic to its chain by
	// source address.
	ForwardChain = "BERTH-EGRESS"
	// InputChain is jumped to from the top of INPUT: each sandbox's
	// traffic to the host itself (the resolver included).
	InputChain = "BERTH-EGRESS-IN"
	// RejectChain refuses: TCP with a reset, the rest with ICMP
	// admin-prohibited.
	RejectChain = "BERTH-EGRESS-REJECT"
	// DNSChain (nat table) is jumped to from the top of PREROUTING: it
	// redirects each sandbox's DNS (port 53, any address) to the resolver.
	DNSChain = "BERTH-EGRESS-DNS"
	// SandboxChainPrefix starts the name of a sandbox's FORWARD chain,
	// SandboxInputPrefix that of its INPUT chain.
	SandboxChainPrefix = "BERTH-E-"
	SandboxInputPrefix = "BERTH-EI-"
	// commentPrefix starts the comment of every dispatch rule.
	commentPrefix = "berth-egress"
)

// AlwaysDenied are the destinations no policy opens: link-local (cloud
// metadata services at 169.254.169.254 among them), Alibaba's metadata
// address, "this network", loopback, multicast and reserved ranges.
var AlwaysDenied = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// AlwaysDeniedInterfaces are the output interfaces no policy opens: the
// bridges of sandboxes (berth's Docker network br-*, containerd's berth-*,
// Docker's default docker0).
var AlwaysDeniedInterfaces = []string{"docker0", "br-+", "berth-+"}

// sandboxKey names a sandbox's chains: a hash of the instance and lease ids.
func sandboxKey(instance, lease string) string {
	h := sha256.Sum256([]byte(instance + "\x00" + lease))
	return strings.ToUpper(hex.EncodeToString(h[:6]))
}

// comment is the dispatch rules' comment for a lease.
func comment(instance, lease string) string {
	return commentPrefix + " " + instance + "/" + lease
}

// sandboxRules is what is programmed for one sandbox.
type sandboxRules struct {
	Instance, Lease string
	IP              netip.Addr
	Iface           string
	Subnet          netip.Prefix
	Gateway         netip.Addr
	ResolverPort    int
	Policy          *Compiled
	// Dynamic are addresses the resolver opened (restricted: allowed) or
	// closed (a denied name:port) for this sandbox.
	Dynamic []dynEntry
}

// dynEntry is one resolved address and port (0: every port).
type dynEntry struct {
	Addr  netip.Addr
	Port  int
	Allow bool
}

// portMatches returns the iptables match arguments for port (nil for
// every port): one set for TCP and one for UDP.
func portMatches(port int) [][]string {
	if port == 0 {
		return [][]string{nil}
	}
	p := strconv.Itoa(port)
	return [][]string{{"-p", "tcp", "--dport", p}, {"-p", "udp", "--dport", p}}
}

// render returns the filter and nat table lines (iptables-restore syntax,
// without the table headers) that (re)create the sandbox's chains and
// dispatch rules. old are dispatch lines of this lease found in the
// current rules, to delete first.
func (s sandboxRules) render(oldFilter, oldNat []string) (filter, nat []string) {
	k := sandboxKey(s.Instance, s.Lease)
	fc, ic := SandboxChainPrefix+k, SandboxInputPrefix+k
	cm := strconv.Quote(comment(s.Instance, s.Lease))
	src := "-s " + s.IP.String() + "/32 -i " + s.Iface
	rej := "-j " + RejectChain
	gw, port := s.Gateway.String(), strconv.Itoa(s.ResolverPort)
	dispF := []string{
		"-A " + ForwardChain + " " + src + " -m comment --comment " + cm + " -j " + fc,
		"-A " + InputChain + " " + src + " -m comment --comment " + cm + " -j " + ic,
	}
	var dispN []string
	for _, proto := range []string{"udp", "tcp"} {
		dispN = append(dispN, "-A "+DNSChain+" "+src+" -p "+proto+" -m "+proto+" --dport 53 -m comment --comment "+cm+
			" -j DNAT --to-destination "+gw+":"+port)
	}
	// Dispatch rules that are already as wanted stay (deleting and adding
	// them again costs nftables far more than the chains' contents).
	same := func(a, b []string) bool {
		return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
	}
	if same(oldFilter, dispF) {
		dispF = nil
	} else {
		for _, l := range oldFilter {
			filter = append(filter, "-D"+strings.TrimPrefix(l, "-A"))
		}
	}
	if same(oldNat, dispN) {
		dispN = nil
	} else {
		for _, l := range oldNat {
			nat = append(nat, "-D"+strings.TrimPrefix(l, "-A"))
		}
	}
	filter = append(filter, ":"+fc+" - [0:0]", ":"+ic+" - [0:0]")
	add := func(rule string) { filter = append(filter, "-A "+fc+" "+rule) }
	add("-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN")
	for _, p := range AlwaysDenied {
		add("-d " + p.String() + " " + rej)
	}
	for _, o := range AlwaysDeniedInterfaces {
		add("-o " + o + " " + rej)
	}
	if !slices.Contains(AlwaysDeniedInterfaces, s.Iface) {
		add("-o " + s.Iface + " " + rej)
	}
	if s.Subnet.IsValid() {
		add("-d " + s.Subnet.Masked().String() + " " + rej)
	}
	entryRules := func(es []Entry, target string) {
		for _, e := range es {
			if !e.Prefix.IsValid() {
				continue
			}
			for _, pm := range portMatches(e.Port) {
				add(strings.TrimSpace("-d "+e.Prefix.String()+" "+strings.Join(pm, " ")) + " " + target)
			}
		}
	}
	dynRules := func(allow bool, target string) {
		for _, d := range s.Dynamic {
			if d.Allow != allow {
				continue
			}
			for _, pm := range portMatches(d.Port) {
				add(strings.TrimSpace("-d "+d.Addr.String()+"/32 "+strings.Join(pm, " ")) + " " + target)
			}
		}
	}
	entryRules(s.Policy.Deny, rej)
	dynRules(false, rej)
	switch s.Policy.Mode {
	case ModeNone:
		add(rej)
	case ModeRestricted:
		entryRules(s.Policy.Allow, "-j RETURN")
		dynRules(true, "-j RETURN")
		add(rej)
	}
	// The host itself: the resolver, replies to the host's connections
	// (the agent's), nothing else.
	filter = append(filter,
		"-A "+ic+" -d "+gw+"/32 -p udp --dport "+port+" -j ACCEPT",
		"-A "+ic+" -d "+gw+"/32 -p tcp --dport "+port+" -j ACCEPT",
		"-A "+ic+" -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
		"-A "+ic+" "+rej,
	)
	return append(filter, dispF...), append(nat, dispN...)
}

// tables is a snapshot of the filter and nat tables (iptables -S lines).
type tables struct {
	filter, nat []string
}

func (t tables) hasChain(table []string, chain string) bool {
	return slices.Contains(table, "-N "+chain) || slices.ContainsFunc(table, func(l string) bool {
		return strings.HasPrefix(l, "-P "+chain+" ")
	})
}

// rulesOf returns chain's rules (-A lines) in table.
func rulesOf(table []string, chain string) []string {
	var out []string
	for _, l := range table {
		if strings.HasPrefix(l, "-A "+chain+" ") {
			out = append(out, l)
		}
	}
	return out
}

// dispatchOf returns the rules of table (any chain) carrying lease's
// dispatch comment.
func dispatchOf(table []string, instance, lease string) []string {
	q := "--comment " + strconv.Quote(comment(instance, lease))
	q2 := "--comment " + comment(instance, lease) // iptables quotes only with spaces
	var out []string
	for _, l := range table {
		if strings.HasPrefix(l, "-A ") && (strings.Contains(l, q+" ") || strings.HasSuffix(l, q) || strings.Contains(l, q2+" ")) {
			out = append(out, l)
		}
	}
	return out
}

// baseLines returns the lines that create the shared chains and put the
// jumps to them at the top of their parents, given the current tables.
func baseLines(t tables) (filter, nat []string) {
	if !t.hasChain(t.filter, RejectChain) {
		filter = append(filter, ":"+RejectChain+" - [0:0]",
			"-A "+RejectChain+" -p tcp -j REJECT --reject-with tcp-reset",
			"-A "+RejectChain+" -j REJECT --reject-with icmp-admin-prohibited")
	}
	for _, c := range []string{ForwardChain, InputChain} {
		if !t.hasChain(t.filter, c) {
			filter = append(filter, ":"+c+" - [0:0]")
		}
	}
	if !t.hasChain(t.nat, DNSChain) {
		nat = append(nat, ":"+DNSChain+" - [0:0]")
	}
	top := func(table []string, parent, chain string) []string {
		rules := rulesOf(table, parent)
		jump := "-A " + parent + " -j " + chain
		if len(rules) > 0 && rules[0] == jump && !slices.Contains(rules[1:], jump) {
			return nil
		}
		var out []string
		for _, r := range rules {
			if r == jump {
				out = append(out, "-D"+strings.TrimPrefix(r, "-A"))
			}
		}
		return append(out, "-I "+parent+" 1 -j "+chain)
	}
	filter = append(filter, top(t.filter, "FORWARD", ForwardChain)...)
	if t.hasChain(t.filter, "DOCKER-USER") {
		filter = append(filter, top(t.filter, "DOCKER-USER", ForwardChain)...)
	}
	filter = append(filter, top(t.filter, "INPUT", InputChain)...)
	nat = append(nat, top(t.nat, "PREROUTING", DNSChain)...)
	return filter, nat
}

// ipt runs the iptables commands; a fake in tests.
type ipt interface {
	// save returns the filter and nat tables in `iptables -S` form.
	save(ctx context.Context) (tables, error)
	// restore applies lines per table with iptables-restore --noflush.
	restore(ctx context.Context, filter, nat []string) error
}

// execIPT runs the real iptables.
type execIPT struct{}

func (execIPT) save(ctx context.Context) (tables, error) {
	// One iptables-save for both tables: much cheaper than two
	// `iptables -S` (which every Apply would pay).
	out, err := iptables.Run(ctx, nil, "iptables-save")
	if err != nil {
		return tables{}, err
	}
	t := parseSave(out)
	return tables{filter: t["filter"], nat: t["nat"]}, nil
}

// parseSave turns iptables-save output into `iptables -S` lines per table
// (the "*TABLE" sections): ":CHAIN - [..]" becomes "-N CHAIN", ":BUILTIN
// POLICY [..]" becomes "-P BUILTIN POLICY", rules stay as they are. One
// pass over the output: a host's rules grow with its sandboxes, and every
// Apply and Remove reads them all.
func parseSave(out string) map[string][]string {
	t := map[string][]string{}
	name := ""
	for l := range strings.Lines(out) {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "*"):
			name = strings.TrimSpace(l[1:])
		case l == "" || strings.HasPrefix(l, "#") || l == "COMMIT":
		case strings.HasPrefix(l, ":"):
			f := strings.Fields(l[1:])
			if len(f) >= 2 && f[1] == "-" {
				t[name] = append(t[name], "-N "+f[0])
			} else if len(f) >= 2 {
				t[name] = append(t[name], "-P "+f[0]+" "+f[1])
			}
		default:
			t[name] = append(t[name], l)
		}
	}
	return t
}

func (execIPT) restore(ctx context.Context, filter, nat []string) error {
	if len(filter) == 0 && len(nat) == 0 {
		return nil
	}
	var b bytes.Buffer
	for _, t := range []struct {
		name  string
		lines []string
	}{{"filter", filter}, {"nat", nat}} {
		if len(t.lines) == 0 {
			continue
		}
		b.WriteString("*" + t.name + "\n")
		for _, l := range t.lines {
			b.WriteString(l + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	if _, err := iptables.Run(ctx, b.Bytes(), "iptables-restore", "-w", "10", "--noflush"); err != nil {
		return fmt.Errorf("%w\ninput:\n%s", err, b.String())
	}
	return nil
}

// flock serialises the programming of berth's egress rules across
// processes on this host (an flock on a file in the temp dir).
func flock() func() { return iptables.Lock("berth-egress.lock") }

// snapshot reads the filter and nat tables.
func snapshot(ctx context.Context, x ipt) (tables, error) {
	return x.save(ctx)
}

// program installs s's rules (and the shared chains), replacing what the
// lease had, in one iptables-restore. Called with the flock held.
func program(ctx context.Context, x ipt, s sandboxRules) error {
	t, err := snapshot(ctx, x)
	if err != nil {
		return err
	}
	bf, bn := baseLines(t)
	sf, sn := stale(t, s)
	f, n := s.render(append(dispatchOf(t.filter, s.Instance, s.Lease), sf...), append(dispatchOf(t.nat, s.Instance, s.Lease), sn...))
	f = append(f, staleChains(t, sf)...)
	return x.restore(ctx, append(bf, f...), append(bn, n...))
}

// stale returns the dispatch rules of other leases (of any instance) for
// s's address on s's interface: left by a sandbox that went without its
// rules being removed (an orchestrator that crashed), they would shadow
// s's own, since one address is one sandbox.
func stale(t tables, s sandboxRules) (filter, nat []string) {
	src := "-s " + s.IP.String() + "/32 -i " + s.Iface + " "
	mine := "--comment " + strconv.Quote(comment(s.Instance, s.Lease))
	pick := func(table []string, chains ...string) []string {
		var out []string
		for _, c := range chains {
			for _, l := range rulesOf(table, c) {
				if strings.Contains(l, src) && !strings.Contains(l, mine) {
					out = append(out, l)
				}
			}
		}
		return out
	}
	return pick(t.filter, ForwardChain, InputChain), pick(t.nat, DNSChain)
}

// staleChains returns the lines deleting the sandbox chains the stale
// dispatch rules jump to.
func staleChains(t tables, rules []string) []string {
	var out []string
	for _, l := range rules {
		i := strings.LastIndex(l, " -j ")
		if i < 0 {
			continue
		}
		c := l[i+4:]
		if (strings.HasPrefix(c, SandboxChainPrefix) || strings.HasPrefix(c, SandboxInputPrefix)) && t.hasChain(t.filter, c) &&
			!slices.Contains(out, "-X "+c) {
			out = append(out, "-F "+c, "-X "+c)
		}
	}
	return out
}

// unprogram deletes a lease's dispatch rules and chains in one
// iptables-restore; what is missing is skipped. Called with the flock held.
func unprogram(ctx context.Context, x ipt, t tables, instance, lease string) error {
	k := sandboxKey(instance, lease)
	var f, n []string
	for _, l := range dispatchOf(t.filter, instance, lease) {
		f = append(f, "-D"+strings.TrimPrefix(l, "-A"))
	}
	for _, l := range dispatchOf(t.nat, instance, lease) {
		n = append(n, "-D"+strings.TrimPrefix(l, "-A"))
	}
	for _, c := range []string{SandboxChainPrefix + k, SandboxInputPrefix + k} {
		if t.hasChain(t.filter, c) {
			f = append(f, "-F "+c, "-X "+c)
		}
	}
	return x.restore(ctx, f, n)
}

// leasesOf returns the leases of instance that have dispatch rules.
func leasesOf(t tables, instance string) []string {
	var out []string
	pfx := commentPrefix + " " + instance + "/"
	for _, l := range append(slices.Clone(t.filter), t.nat...) {
		i := strings.Index(l, "--comment ")
		if i < 0 {
			continue
		}
		c := strings.TrimPrefix(l[i:], "--comment ")
		if strings.HasPrefix(c, "\"") {
			if j := strings.Index(c[1:], "\""); j >= 0 {
				c = c[1 : j+1]
			}
		} else if j := strings.IndexByte(c, ' '); j >= 0 {
			c = c[:j]
		}
		if lease, ok := strings.CutPrefix(c, pfx); ok && !slices.Contains(out, lease) {
			out = append(out, lease)
		}
	}
	return out
}
