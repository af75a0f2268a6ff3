// Package egress enforces a sandbox's network policy on the host, outside
// the sandbox's reach: what it may connect to (mode none, restricted or
// open, with allow and deny lists of CIDRs, host:port and domain names) and
// which names it may resolve.
//
// Addresses are enforced with iptables chains per sandbox, keyed on the
// sandbox's address and jumped to from the top of FORWARD (and DOCKER-USER);
// domain names through a small DNS resolver that berth runs on the host: it
// answers only the names the policy allows and opens exactly the addresses
// it resolved, for that sandbox, for a while. Every DNS packet a sandbox
// sends (to any address, port 53) is redirected to that resolver, so a
// sandbox cannot ask another server; it has neither CAP_NET_ADMIN nor
// CAP_NET_RAW, so it cannot change the rules or take another address.
//
// See docs/network-policy.md for the rule set and what is always denied.
package egress

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Mode is a policy's base: what a sandbox may reach before the lists apply.
type Mode string

// Modes.
const (
	// ModeOpen: everything but what is always denied and the deny list.
	ModeOpen Mode = "open"
	// ModeRestricted: only the allow list (minus the deny list).
	ModeRestricted Mode = "restricted"
	// ModeNone: nothing; the host still reaches the agent's port.
	ModeNone Mode = "none"
)

// MaxEntries bounds each of a policy's lists.
const MaxEntries = 256

// Policy is a sandbox's network policy as the user writes it.
type Policy struct {
	// Mode is "none", "restricted" or "open"; "" means open.
	Mode Mode
	// Allow lists what restricted mode lets through: CIDRs ("10.0.0.0/8",
	// an address alone is /32), host:port ("10.0.0.5:443",
	// "api.example.com:443", "*.example.com:443"; the port holds for TCP
	// and UDP) and domain names ("example.com", "*.example.com" for every
	// name under example.com but not example.com itself). Ignored in
	// other modes.
	Allow []string
	// Deny lists what is refused in every mode, in the same forms; a deny
	// wins over an allow. A denied name does not resolve (NXDOMAIN); a
	// denied name:port resolves but that port of its addresses is refused.
	Deny []string
}

// Open reports whether p lets everything through but what is always
// denied (open mode without a deny list).
func (p Policy) Open() bool {
	return (p.Mode == "" || p.Mode == ModeOpen) && len(p.Deny) == 0
}

// Entry is one parsed allow or deny entry. Exactly one of Prefix and
// Domain is set.
type Entry struct {
	// Prefix is the address range (CIDR, or one address).
	Prefix netip.Prefix
	// Domain is the lower-case name without trailing dot; with Wildcard
	// it is the suffix ("example.com" for "*.example.com").
	Domain   string
	Wildcard bool
	// Port limits the entry to one port (TCP and UDP); 0 means every port.
	Port int
}

// String returns e in the form it was written (normalised).
func (e Entry) String() string {
	var s string
	switch {
	case e.Domain != "" && e.Wildcard:
		s = "*." + e.Domain
	case e.Domain != "":
		s = e.Domain
	case e.Prefix.IsSingleIP():
		s = e.Prefix.Addr().String()
	default:
		s = e.Prefix.String()
	}
	if e.Port != 0 {
		s += ":" + strconv.Itoa(e.Port)
	}
	return s
}

// MatchName reports whether domain entry e covers name (lower case, no
// trailing dot).
func (e Entry) MatchName(name string) bool {
	if e.Domain == "" {
		return false
	}
	if e.Wildcard {
		return strings.HasSuffix(name, "."+e.Domain)
	}
	return name == e.Domain
}

// Compiled is a validated policy.
type Compiled struct {
	Mode  Mode
	Allow []Entry
	Deny  []Entry
}

// Compile validates p; errors are errdefs.ErrInvalidArgument naming the
// field (network.mode, network.allow[i], network.deny[i]).
func Compile(p Policy) (*Compiled, error) {
	c := &Compiled{Mode: p.Mode}
	switch p.Mode {
	case "":
		c.Mode = ModeOpen
	case ModeOpen, ModeRestricted, ModeNone:
	default:
		return nil, errdefs.InvalidArgument("network.mode", "%q: want none, restricted or open", string(p.Mode))
	}
	var err error
	if c.Allow, err = parseList("network.allow", p.Allow); err != nil {
		return nil, err
	}
	if c.Deny, err = parseList("network.deny", p.Deny); err != nil {
		return nil, err
	}
	return c, nil
}

// Normalize returns p validated, with its mode spelled out and its entries
// normalised (lower-case names, canonical CIDRs), duplicates dropped.
func Normalize(p Policy) (Policy, error) {
	c, err := Compile(p)
	if err != nil {
		return Policy{}, err
	}
	return c.Policy(), nil
}

// Policy returns c in the user's form.
func (c *Compiled) Policy() Policy {
	str := func(es []Entry) []string {
		var out []string
		for _, e := range es {
			if s := e.String(); !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
		return out
	}
	return Policy{Mode: c.Mode, Allow: str(c.Allow), Deny: str(c.Deny)}
}

func parseList(field string, list []string) ([]Entry, error) {
	if len(list) > MaxEntries {
		return nil, errdefs.InvalidArgument(field, "%d entries, at most %d", len(list), MaxEntries)
	}
	out := make([]Entry, 0, len(list))
	for i, s := range list {
		e, err := ParseEntry(s)
		if err != nil {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("%s[%d]", field, i), "%v", err)
		}
		out = append(out, e)
	}
	return out, nil
}

// ParseEntry parses one allow or deny entry: a CIDR or address, a domain
// name or *.suffix, either of them with :port (IPv6 in brackets).
func ParseEntry(s string) (Entry, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Entry{}, fmt.Errorf("empty entry")
	}
	if len(s) > 300 {
		return Entry{}, fmt.Errorf("%d bytes, at most 300", len(s))
	}
	host, port := s, 0
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Entry{}, fmt.Errorf("%q: port %q is not in 1-65535", s, p)
		}
		host, port = h, n
	} else if strings.Count(s, ":") == 1 {
		return Entry{}, fmt.Errorf("%q: %v", s, err)
	}
	if pfx, err := netip.ParsePrefix(host); err == nil {
		if !pfx.Addr().Is4() {
			return Entry{}, fmt.Errorf("%q: IPv6 is not supported (sandboxes have IPv4 only)", s)
		}
		return Entry{Prefix: pfx.Masked(), Port: port}, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return Entry{}, fmt.Errorf("%q: IPv6 is not supported (sandboxes have IPv4 only)", s)
		}
		return Entry{Prefix: netip.PrefixFrom(a, 32), Port: port}, nil
	}
	if strings.Contains(host, "/") {
		return Entry{}, fmt.Errorf("%q is not a CIDR", host)
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	wild := false
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		name, wild = rest, true
	}
	if err := validName(name); err != nil {
		return Entry{}, fmt.Errorf("%q: %v", s, err)
	}
	if wild && !strings.Contains(name, ".") {
		return Entry{}, fmt.Errorf("%q: a wildcard needs a suffix with a dot (*.example.com)", s)
	}
	return Entry{Domain: name, Wildcard: wild, Port: port}, nil
}

// validName checks a lower-case DNS name (letters, digits, '-', '_', dots
// between labels of 1-63 bytes, at most 253 bytes).
func validName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("not a domain name, CIDR or address")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("not a domain name, CIDR or address (empty or long label)")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("not a domain name, CIDR or address (character %q)", c)
			}
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("not a domain name, CIDR or address (label starts or ends with '-')")
		}
	}
	return nil
}

// Verdict is what the resolver does with a name.
type Verdict struct {
	// Resolve is false when the name must not resolve (NXDOMAIN).
	Resolve bool
	// AllowPorts are the ports (0: every port) the name's addresses are
	// opened for (restricted mode).
	AllowPorts []int
	// DenyPorts are the ports of the name's addresses that are refused.
	DenyPorts []int
}

// Name decides what a sandbox with policy c may do with name (lower case,
// no trailing dot).
func (c *Compiled) Name(name string) Verdict {
	if c.Mode == ModeNone {
		return Verdict{}
	}
	var v Verdict
	for _, e := range c.Deny {
		if e.MatchName(name) {
			if e.Port == 0 {
				return Verdict{}
			}
			v.DenyPorts = appendPort(v.DenyPorts, e.Port)
		}
	}
	if c.Mode == ModeOpen {
		v.Resolve = true
		return v
	}
	for _, e := range c.Allow {
		if e.MatchName(name) {
			v.AllowPorts = appendPort(v.AllowPorts, e.Port)
		}
	}
	if slices.Contains(v.AllowPorts, 0) {
		v.AllowPorts = []int{0}
	}
	// Every allowed port denied by name: nothing is left to reach.
	left := slices.DeleteFunc(slices.Clone(v.AllowPorts), func(p int) bool { return p != 0 && slices.Contains(v.DenyPorts, p) })
	v.Resolve = len(left) > 0
	return v
}

func appendPort(ps []int, p int) []int {
	if slices.Contains(ps, p) {
		return ps
	}
	return append(ps, p)
}
