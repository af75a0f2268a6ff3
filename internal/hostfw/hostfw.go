// Package hostfw keeps sandboxes away from the host's own listeners: for
// each sandbox bridge it installs iptables (and ip6tables) rules that drop
// what arrives on the bridge for the host itself (the INPUT chain: the
// bridge's gateway address and every other address of the host), except
// replies to connections the host opened. The host still reaches its
// sandboxes (OUTPUT, and their replies are ESTABLISHED); sandboxes still
// reach the outside world (FORWARD, filtered elsewhere).
//
// The rules live in one chain, InputChain, jumped to from the top of INPUT;
// each bridge has two rules there:
//
//	-A BERTH-INPUT -i BRIDGE -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
//	-A BERTH-INPUT -i BRIDGE -j DROP
//
// Ensure is idempotent and serialised across processes on the host.
package hostfw

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"

	"github.com/berth-dev/berth/internal/iptables"
)

// InputChain is the iptables chain (filter table) holding the host-input
// rules of every sandbox bridge.
const InputChain = "BERTH-INPUT"

// ErrNoIptables is returned (wrapped) when the iptables command is missing.
var ErrNoIptables = errors.New("iptables not found (Debian: apt-get install iptables)")

// Rules returns the rules of InputChain for bridge iface, in `iptables -S`
// form.
func Rules(iface string) []string {
	return []string{
		"-A " + InputChain + " -i " + iface + " -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
		"-A " + InputChain + " -i " + iface + " -j DROP",
	}
}

// Ensure installs the host-input filter for bridge iface with iptables and,
// when ip6tables exists and works, with ip6tables too (an IPv6 link-local
// address of the host is on every bridge). It needs root (CAP_NET_ADMIN).
func Ensure(ctx context.Context, iface string) error {
	if iface == "" || strings.ContainsAny(iface, " \t\n") || len(iface) > 15 {
		return fmt.Errorf("hostfw: invalid interface name %q", iface)
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return fmt.Errorf("hostfw: %w", ErrNoIptables)
	}
	unlock := lock()
	defer unlock()
	if err := ensure(ctx, "iptables", iface); err != nil {
		return err
	}
	// IPv6: when ip6tables works at all (a host without IPv6 netfilter
	// support has nothing to filter, and its sandboxes no IPv6 to use).
	if _, err := exec.LookPath("ip6tables"); err == nil {
		if _, err := run(ctx, "ip6tables", "-S", "INPUT"); err == nil {
			if err := ensure(ctx, "ip6tables", iface); err != nil {
				return err
			}
		}
	}
	return nil
}

// Remove deletes bridge iface's rules (the chain and the jump stay, since
// other bridges may use them). Missing rules are not an error.
func Remove(ctx context.Context, iface string) {
	unlock := lock()
	defer unlock()
	for _, cmd := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(cmd); err != nil {
			continue
		}
		for _, rule := range Rules(iface) {
			args := strings.Fields(rule)
			args[0] = "-D"
			for {
				if _, err := run(ctx, cmd, args...); err != nil {
					break
				}
			}
		}
	}
}

// PruneMissing deletes the rules of bridges whose name starts with prefix
// and that no longer exist on this host, so that rules do not pile up in
// InputChain (every packet a sandbox sends to the host walks the chain) as
// networks come and go. Only prefixes whose names never come back are safe
// to prune: Docker names a network's bridge br-<network id>, and a removed
// network's id is never reused. Errors are ignored: pruning is hygiene.
func PruneMissing(ctx context.Context, prefix string) {
	if prefix == "" {
		return
	}
	unlock := lock()
	defer unlock()
	for _, cmd := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(cmd); err != nil {
			continue
		}
		out, err := run(ctx, cmd, "-S", InputChain)
		if err != nil {
			continue
		}
		for _, iface := range staleIfaces(out, prefix, ifaceExists) {
			for _, rule := range Rules(iface) {
				args := strings.Fields(rule)
				args[0] = "-D"
				_, _ = run(ctx, cmd, args...)
			}
		}
	}
}

// staleIfaces returns the interfaces named in the `iptables -S` output of
// InputChain that start with prefix and do not exist, each once.
func staleIfaces(rules, prefix string, exists func(string) bool) []string {
	seen := map[string]bool{}
	var stale []string
	for _, line := range strings.Split(rules, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] != "-i" {
				continue
			}
			iface := f[i+1]
			if strings.HasPrefix(iface, prefix) && !seen[iface] {
				seen[iface] = true
				if !exists(iface) {
					stale = append(stale, iface)
				}
			}
		}
	}
	return stale
}

func ifaceExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// Installed reports whether iface's rules are in InputChain and INPUT jumps
// to it (iptables only).
func Installed(ctx context.Context, iface string) bool {
	if _, err := run(ctx, "iptables", "-C", "INPUT", "-j", InputChain); err != nil {
		return false
	}
	for _, rule := range Rules(iface) {
		args := strings.Fields(rule)
		args[0] = "-C"
		if _, err := run(ctx, "iptables", args...); err != nil {
			return false
		}
	}
	return true
}

func ensure(ctx context.Context, cmd, iface string) error {
	fail := func(err error) error {
		return fmt.Errorf("hostfw: %s: filter host input from %s: %w", cmd, iface, err)
	}
	if _, err := run(ctx, cmd, "-S", InputChain); err != nil {
		if _, err := run(ctx, cmd, "-N", InputChain); err != nil {
			return fail(err)
		}
	}
	// The reply rule must precede the drop: insert it at the top when it is
	// missing, append the drop when that is.
	rules := Rules(iface)
	accept, drop := strings.Fields(rules[0]), strings.Fields(rules[1])
	check := func(r []string) bool {
		a := append([]string{"-C"}, r[1:]...)
		_, err := run(ctx, cmd, a...)
		return err == nil
	}
	if !check(accept) {
		if _, err := run(ctx, cmd, append([]string{"-I", InputChain, "1"}, accept[2:]...)...); err != nil {
			return fail(err)
		}
	}
	if !check(drop) {
		if _, err := run(ctx, cmd, append([]string{"-A"}, drop[1:]...)...); err != nil {
			return fail(err)
		}
	}
	if _, err := run(ctx, cmd, "-C", "INPUT", "-j", InputChain); err != nil {
		if _, err := run(ctx, cmd, "-I", "INPUT", "1", "-j", InputChain); err != nil {
			return fail(err)
		}
	}
	return nil
}

// run runs iptables or ip6tables (cmd), waiting up to 10 s for the xtables
// lock.
func run(ctx context.Context, cmd string, args ...string) (string, error) {
	return iptables.Run(ctx, nil, cmd, append([]string{"-w", "10"}, args...)...)
}

// lock serialises Ensure and Remove across processes on this host (best
// effort: an flock on a file in the temp dir).
func lock() func() { return iptables.Lock("berth-hostfw.lock") }
