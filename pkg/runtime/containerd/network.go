package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/berth-dev/berth/internal/hostfw"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// networkExtension is the container extension that records the sandbox's
// address (set once CNI ADD gave it one), so Get and List need no CNI call.
const networkExtension = "dev.berth.network"

// networkInfoTypeURL is the type URL of the networkExtension value (JSON).
const networkInfoTypeURL = "dev.berth/containerd.NetworkInfo"

// networkInfo is the sandbox's place on the sandbox network.
type networkInfo struct {
	// IP is the sandbox's address on the bridge.
	IP string `json:"ip"`
	// HostVeth is the host side of its veth pair (a bridge port).
	HostVeth string `json:"hostVeth,omitempty"`
	// Netns is the path of its network namespace.
	Netns string `json:"netns"`
}

func (ni networkInfo) endpoint() string {
	return net.JoinHostPort(ni.IP, strconv.Itoa(runtime.AgentPort))
}

// networkInfoOf reads the network extension of c.
func networkInfoOf(c containers.Container) (networkInfo, bool) {
	var ni networkInfo
	ext, ok := c.Extensions[networkExtension]
	if !ok || ext == nil || ext.GetTypeUrl() != networkInfoTypeURL {
		return ni, false
	}
	return ni, json.Unmarshal(ext.GetValue(), &ni) == nil
}

// recordNetwork stores ni in container id's network extension.
func (r *Runtime) recordNetwork(ctx context.Context, id string, ni networkInfo) error {
	b, err := json.Marshal(ni)
	if err != nil {
		return err
	}
	c := containers.Container{ID: id, Extensions: map[string]typeurl.Any{
		networkExtension: &anypb.Any{TypeUrl: networkInfoTypeURL, Value: b},
	}}
	if _, err := r.cli.ContainerService().Update(ctx, c, "extensions."+networkExtension); err != nil {
		return r.mapErr(err, "record network of container", id)
	}
	return nil
}

// cniConfList is the CNI configuration of the sandbox network: a bridge
// that is the sandboxes' gateway, with host-local IPAM over the subnet. IP
// masquerading and isolation are not per-sandbox CNI state: ensureFirewall
// installs them once for the whole subnet.
func (r *Runtime) cniConfList() []byte {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       r.cfg.NetworkName,
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      r.cfg.Bridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": false,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": r.subnet.String(), "gateway": r.gateway.String()}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(r.cfg.CNICacheDir, "networks"),
				},
			},
		},
	}
	b, _ := json.Marshal(conf)
	return b
}

// setupNetwork creates the sandbox's network namespace (with loopback up),
// attaches it to the bridge with CNI ADD and isolates its bridge port. The
// CNI call is not cancelled half-way by ctx (a killed plugin leaves half a
// setup); it is bounded by runtime.CleanupTimeout and ctx is checked
// afterwards.
func (r *Runtime) setupNetwork(ctx context.Context, id string) (networkInfo, error) {
	nsPath := r.netnsPath(id)
	// A namespace of this id can only be a leftover: this Create owns the id
	// since it created the container.
	if err := removeNetns(nsPath); err != nil {
		return networkInfo{}, fmt.Errorf("%w: containerd: remove stale network namespace %s: %w", errdefs.ErrInternal, nsPath, err)
	}
	if err := createNetns(nsPath); err != nil {
		return networkInfo{}, fmt.Errorf("%w: containerd: create network namespace %s: %w", errdefs.ErrInternal, nsPath, err)
	}
	if err := ctx.Err(); err != nil {
		return networkInfo{}, err
	}
	cctx, cancel := runtime.Detached(ctx)
	defer cancel()
	res, err := r.cni.Setup(cctx, id, nsPath)
	if err != nil {
		return networkInfo{}, fmt.Errorf("%w: containerd: CNI ADD for %s on network %s: %w", errdefs.ErrInternal, id, r.cfg.NetworkName, err)
	}
	ni := networkInfo{Netns: nsPath}
	if eth := res.Interfaces["eth0"]; eth != nil {
		for _, ipc := range eth.IPConfigs {
			if ip4 := ipc.IP.To4(); ip4 != nil {
				ni.IP = ip4.String()
				break
			}
		}
	}
	for name, ifc := range res.Interfaces {
		if ifc != nil && ifc.Sandbox == "" && name != r.cfg.Bridge && name != "eth0" {
			ni.HostVeth = name
		}
	}
	if ni.IP == "" {
		return ni, fmt.Errorf("%w: containerd: CNI ADD for %s returned no IPv4 address", errdefs.ErrInternal, id)
	}
	if ni.HostVeth == "" {
		return ni, fmt.Errorf("%w: containerd: CNI ADD for %s returned no host interface to isolate", errdefs.ErrInternal, id)
	}
	// Bridge port isolation: isolated ports cannot exchange frames with
	// each other, only with the bridge itself (the host).
	if err := setPortIsolated(ni.HostVeth); err != nil {
		return ni, fmt.Errorf("%w: containerd: isolate bridge port %s of %s: %w", errdefs.ErrInternal, ni.HostVeth, id, err)
	}
	if err := os.WriteFile(filepath.Join(r.sandboxDir(id), "hosts"), []byte(hostsFile(ni.IP, hostname(id))), 0o644); err != nil {
		return ni, fmt.Errorf("%w: containerd: write hosts file of %s: %w", errdefs.ErrInternal, id, err)
	}
	return ni, ctx.Err()
}

// cniDel releases the sandbox's network with CNI DEL (the IP address, the
// veth pair) when libcni has a cached result for it, i.e. when an ADD ran.
// A missing namespace is fine: host-local still releases the address.
func (r *Runtime) cniDel(ctx context.Context, id, nsPath string) error {
	cache := filepath.Join(r.cfg.CNICacheDir, "results", r.cfg.NetworkName+"-"+id+"-eth0")
	if _, err := os.Stat(cache); os.IsNotExist(err) {
		return nil
	}
	if _, err := os.Stat(nsPath); err != nil {
		nsPath = ""
	}
	cctx, cancel := runtime.Detached(ctx)
	defer cancel()
	if err := r.cni.Remove(cctx, id, nsPath); err != nil {
		return fmt.Errorf("containerd: CNI DEL for %s on network %s: %w", id, r.cfg.NetworkName, err)
	}
	return nil
}

// hostsFile is the sandbox's /etc/hosts.
func hostsFile(ip, name string) string {
	return "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + ip + "\t" + name + "\n"
}

// netnsPath is the bind mount of sandbox id's network namespace.
func (r *Runtime) netnsPath(id string) string { return filepath.Join(r.cfg.NetnsDir, id) }

// sandboxDir is sandbox id's host directory.
func (r *Runtime) sandboxDir(id string) string {
	return filepath.Join(r.cfg.StateDir, "sandboxes", id)
}

// agentStateDir is the directory of a sandbox's host directory mounted at
// runtime.AgentStateDir.
const agentStateDir = "agent-state"

// logPath is the file the shim appends sandbox id's output to.
func (r *Runtime) logPath(id string) string { return filepath.Join(r.sandboxDir(id), "log") }

// writeSandboxFiles lays out sandbox id's host directory:
//
//	berth/sandbox-agent  hard link to the agent copy (0555)  -> /.berth (ro)
//	berth/token          the agent token (0400)
//	agent-state/         the agent's state (0700)            -> /var/lib/berth-agent
//	hostname, hosts, resolv.conf                             -> /etc/...
//	log                  the agent's output (written by the shim)
func (r *Runtime) writeSandboxFiles(id, token string, dns []string) error {
	dir := r.sandboxDir(id)
	_ = os.RemoveAll(dir) // a leftover of an earlier sandbox of this lease
	agentDir := filepath.Join(dir, "berth")
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		return fmt.Errorf("%w: containerd: %w", errdefs.ErrInternal, err)
	}
	if err := os.Chmod(agentDir, 0o755); err != nil {
		return fmt.Errorf("%w: containerd: %w", errdefs.ErrInternal, err)
	}
	r.hostMu.Lock()
	src := r.agentCopy
	r.hostMu.Unlock()
	err := linkOrCopy(src, filepath.Join(agentDir, runtime.AgentFile))
	if errors.Is(err, fs.ErrNotExist) {
		// Another process on this host (an orchestrator or a test with a
		// different agent build) removed our copy as unused between two
		// sandboxes: install it again.
		r.hostMu.Lock()
		agent, ierr := installAgent(r.cfg.AgentBinary, filepath.Join(r.cfg.StateDir, "agents"), r.log)
		if ierr == nil {
			r.agentCopy = agent
		}
		r.hostMu.Unlock()
		if ierr != nil {
			return ierr
		}
		err = linkOrCopy(agent, filepath.Join(agentDir, runtime.AgentFile))
	}
	if err != nil {
		return fmt.Errorf("%w: containerd: place the agent for %s: %w", errdefs.ErrInternal, id, err)
	}
	state := filepath.Join(dir, agentStateDir)
	if err := os.Mkdir(state, 0o700); err != nil {
		return fmt.Errorf("%w: containerd: %w", errdefs.ErrInternal, err)
	}
	// With user namespaces the agent is not the host's root.
	if err := r.chownToSandboxRoot(state); err != nil {
		return fmt.Errorf("%w: containerd: %w", errdefs.ErrInternal, err)
	}
	files := []struct {
		name string
		data string
		mode os.FileMode
	}{
		// Readable by root only: the agent runs as root, the commands as
		// the lease's user, who must not read it (unless that is root).
		{"berth/token", token, 0o400},
		{"hostname", hostname(id) + "\n", 0o644},
		{"hosts", hostsFile("127.0.1.1", hostname(id)), 0o644},
		{"resolv.conf", withNameservers(resolvConf(), dns), 0o644},
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			return fmt.Errorf("%w: containerd: write %s: %w", errdefs.ErrInternal, p, err)
		}
		if err := os.Chmod(p, f.mode); err != nil { // despite the umask
			return fmt.Errorf("%w: containerd: %w", errdefs.ErrInternal, err)
		}
		if f.name == "berth/token" {
			// With user namespaces the agent is not the host's root.
			if err := r.chownToSandboxRoot(p); err != nil {
				return fmt.Errorf("%w: containerd: %w", errdefs.ErrInternal, err)
			}
		}
	}
	return nil
}

// resolvConf is the sandboxes' /etc/resolv.conf: the host's, without
// loopback name servers (unreachable from a sandbox's namespace), or
// systemd-resolved's upstream list when that leaves none.
func resolvConf() string {
	filter := func(b []byte) (string, int) {
		var out []string
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "nameserver" {
				if ip := net.ParseIP(f[1]); ip == nil || ip.IsLoopback() {
					continue
				}
				n++
			}
			out = append(out, line)
		}
		return strings.TrimRight(strings.Join(out, "\n"), "\n") + "\n", n
	}
	b, _ := os.ReadFile("/etc/resolv.conf")
	text, n := filter(b)
	if n == 0 {
		if b2, err := os.ReadFile("/run/systemd/resolve/resolv.conf"); err == nil {
			if t2, n2 := filter(b2); n2 > 0 {
				return t2
			}
		}
	}
	return text
}

// withNameservers replaces conf's name servers with dns (Spec.DNS; conf
// unchanged when dns is empty), keeping its other lines (search, options).
func withNameservers(conf string, dns []string) string {
	if len(dns) == 0 {
		return conf
	}
	var out []string
	for _, ns := range dns {
		out = append(out, "nameserver "+ns)
	}
	for _, line := range strings.Split(strings.TrimRight(conf, "\n"), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "nameserver" {
			continue
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n") + "\n"
}

// linkOrCopy hard-links src to dst, copying it when they are on different
// file systems.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o555)
}

// ensureHost prepares the host once per Runtime (again after a failure):
// root, the state directory, the agent copy, the CNI plugins, the subnet,
// the firewall rules and the netns directory.
func (r *Runtime) ensureHost(ctx context.Context) error {
	r.hostMu.Lock()
	defer r.hostMu.Unlock()
	if r.hostReady {
		return nil
	}
	if os.Geteuid() != 0 {
		return errdefs.FailedPrecondition("containerd: the containerd backend needs root (network namespaces, CNI, mounts)")
	}
	for _, d := range []string{r.cfg.StateDir, filepath.Join(r.cfg.StateDir, "sandboxes"), filepath.Join(r.cfg.StateDir, "agents")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("%w: containerd: create %s: %w", errdefs.ErrInternal, d, err)
		}
	}
	agent, err := installAgent(r.cfg.AgentBinary, filepath.Join(r.cfg.StateDir, "agents"), r.log)
	if err != nil {
		return err
	}
	for _, p := range []string{"bridge", "host-local"} {
		if _, err := findPlugin(r.cfg.CNIBinDirs, p); err != nil {
			return errdefs.FailedPrecondition("containerd: CNI plugin %q not found in %s; install the CNI plugins (Debian: apt-get install containernetworking-plugins)",
				p, strings.Join(r.cfg.CNIBinDirs, ", "))
		}
	}
	if err := r.checkSubnet(); err != nil {
		return err
	}
	if err := r.ensureFirewall(ctx); err != nil {
		return err
	}
	if err := r.ensureTraversable(); err != nil {
		return err
	}
	if err := prepareNetnsDir(r.cfg.NetnsDir); err != nil {
		return fmt.Errorf("%w: containerd: prepare %s: %w", errdefs.ErrInternal, r.cfg.NetnsDir, err)
	}
	r.agentCopy = agent
	r.hostReady = true
	return nil
}

func findPlugin(dirs []string, name string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}

// checkSubnet refuses a subnet that overlaps an address of another
// interface (Docker's bridges, the host's LAN): sandboxes would shadow it.
func (r *Runtime) checkSubnet() error {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil // cannot tell; CNI will complain if it matters
	}
	for _, ifc := range ifaces {
		if ifc.Name == r.cfg.Bridge {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.To4() == nil {
				continue
			}
			if r.subnet.Contains(ipn.IP) || ipn.Contains(r.subnet.IP) {
				return errdefs.FailedPrecondition("containerd: sandbox subnet %s overlaps %s on interface %s; choose another subnet (Config.Subnet)",
					r.subnet, ipn, ifc.Name)
			}
		}
	}
	return nil
}

// firewallChain is the iptables chain holding the sandbox network's rules.
func (r *Runtime) firewallChain() string { return "BERTH-" + r.cfg.Bridge }

// firewallRules are the rules of firewallChain (in `iptables -S` form),
// evaluated first for every forwarded packet:
//
//   - sandbox to sandbox through the host: dropped (bridged frames between
//     sandboxes are already stopped by port isolation, and by this rule too
//     when br_netfilter is loaded);
//   - into the sandbox network: only replies to the sandboxes' own
//     connections, so no other host, container (Docker's included) or VM can
//     reach a sandbox; the orchestrator's host reaches them directly (OUTPUT,
//     not FORWARD);
//   - from the sandbox network to Docker's bridges (docker0, br-*): dropped,
//     so a sandbox cannot reach Docker sandboxes' agents either;
//   - anything else from the sandboxes (the outside world): accepted, NATed
//     by the MASQUERADE rule.
func (r *Runtime) firewallRules() []string {
	c, b := r.firewallChain(), r.cfg.Bridge
	return []string{
		"-A " + c + " -i " + b + " -o " + b + " -j DROP",
		"-A " + c + " -o " + b + " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A " + c + " -o " + b + " -j DROP",
		"-A " + c + " -i " + b + " -o docker0 -j DROP",
		"-A " + c + " -i " + b + " -o br-+ -j DROP",
		"-A " + c + " -i " + b + " -j ACCEPT",
	}
}

// ensureFirewall installs the sandbox network's iptables rules, idempotently
// (the host-input filter of package hostfw included):
// the chain's rules (rewritten when they differ), a jump to it at the top of
// FORWARD and, when Docker's DOCKER-USER chain exists, at the top of that
// too (Docker re-inserts its own rules above ours when it restarts, but
// always evaluates DOCKER-USER first), and a MASQUERADE rule for traffic
// leaving the subnet.
func (r *Runtime) ensureFirewall(ctx context.Context) error {
	if _, err := exec.LookPath("iptables"); err != nil {
		return errdefs.FailedPrecondition("containerd: iptables not found; install it (Debian: apt-get install iptables)")
	}
	ipt := func(args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		var stdout, stderr strings.Builder
		cmd := exec.CommandContext(cctx, "iptables", append([]string{"-w", "10"}, args...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return stdout.String(), fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return stdout.String(), nil
	}
	fail := func(err error) error {
		return fmt.Errorf("%w: containerd: set up the sandbox network's firewall: %w", errdefs.ErrInternal, err)
	}
	chain := r.firewallChain()
	if _, err := ipt("-S", chain); err != nil {
		if _, err := ipt("-N", chain); err != nil {
			return fail(err)
		}
	}
	out, err := ipt("-S", chain)
	if err != nil {
		return fail(err)
	}
	var have []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line != "" && !strings.HasPrefix(line, "-N ") && !strings.HasPrefix(line, "#") {
			have = append(have, line)
		}
	}
	want := r.firewallRules()
	if strings.Join(have, "\n") != strings.Join(want, "\n") {
		if _, err := ipt("-F", chain); err != nil {
			return fail(err)
		}
		for _, rule := range want {
			if _, err := ipt(strings.Fields(rule)...); err != nil {
				return fail(err)
			}
		}
	}
	for _, parent := range []string{"FORWARD", "DOCKER-USER"} {
		if parent == "DOCKER-USER" {
			if _, err := ipt("-S", parent); err != nil {
				continue // no Docker
			}
		}
		if _, err := ipt("-C", parent, "-j", chain); err != nil {
			if _, err := ipt("-I", parent, "1", "-j", chain); err != nil {
				return fail(err)
			}
		}
	}
	masq := []string{"POSTROUTING", "-s", r.subnet.String(), "!", "-o", r.cfg.Bridge, "-j", "MASQUERADE"}
	if _, err := ipt(append([]string{"-t", "nat", "-C"}, masq...)...); err != nil {
		if _, err := ipt(append([]string{"-t", "nat", "-A"}, masq...)...); err != nil {
			return fail(err)
		}
	}
	// What the sandboxes send to the host itself (the gateway address or
	// any other address of the host) is INPUT, not FORWARD: dropped there
	// too, except replies to the host's own connections (the agents').
	if err := hostfw.Ensure(ctx, r.cfg.Bridge); err != nil {
		return fail(err)
	}
	return nil
}

// nextIP returns ip + 1.
func nextIP(ip net.IP) net.IP {
	out := make(net.IP, len(ip.To4()))
	copy(out, ip.To4())
	for i := len(out) - 1; i >= 0; i-- {
		out[i]++
		if out[i] != 0 {
			break
		}
	}
	return out
}
