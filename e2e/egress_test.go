package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/egress/egresstest"
	"github.com/berth-dev/berth/pkg/orchestrator"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// egressTargets are the servers a sandbox's policy is checked against: a
// network namespace with three addresses serving "ok" on ports 80 and 81,
// and a name server on loopback (the orchestrator's resolver upstream).
type egressTargets struct {
	ns         *egresstest.Netns
	dns        *egresstest.DNS
	a1, a2, a3 netip.Addr
}

func newEgressTargets(t *testing.T) *egressTargets {
	t.Helper()
	egresstest.Require(t)
	ns := egresstest.NewNetns(t, "t", 3)
	ns.Serve(t, 80, 81)
	d := egresstest.NewDNS(t)
	tg := &egressTargets{ns: ns, dns: d, a1: ns.Addrs[0], a2: ns.Addrs[1], a3: ns.Addrs[2]}
	d.Set("allowed.test", tg.a1)
	d.Set("api.svc.test", tg.a2)
	d.Set("bad.svc.test", tg.a2)
	d.Set("other.test", tg.a3)
	return tg
}

// egressBox runs checks inside one lease's sandbox through the proxy.
type egressBox struct {
	t         *testing.T
	a         *api
	id, token string
}

// sh runs a bash script in the sandbox as root (whose capabilities are
// what a sandbox can ever have) and returns its exit code and output.
func (b egressBox) sh(script string) (int, string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, r, err := b.a.proxyExec(ctx, b.id, b.token, map[string]any{"argv": []string{"bash", "-c", script}, "timeout": "20s", "user": "root"})
	if err != nil || code != http.StatusOK {
		b.t.Fatalf("exec %q: HTTP %d, %v: %s", script, code, err, r.Stderr)
	}
	return r.ExitCode, strings.TrimSpace(r.Stdout + r.Stderr)
}

// connect reports whether a TCP connection from the sandbox to addr:port
// gets the server's "ok" (a refused or timed-out one does not; 2 s at most).
func (b egressBox) connect(addr netip.Addr, port int) bool {
	b.t.Helper()
	rc, _ := b.sh(fmt.Sprintf(`timeout 2 bash -c 'exec 3<>/dev/tcp/%s/%d && read -r l <&3 && [ "$l" = ok ]'`, addr, port))
	return rc == 0
}

// resolve returns what getent gives for name in the sandbox ("" when it
// does not resolve).
func (b egressBox) resolve(name string) string {
	b.t.Helper()
	rc, out := b.sh("timeout 5 getent ahostsv4 " + name + " | awk 'NR==1{print $1}'")
	if rc != 0 {
		return ""
	}
	return out
}

func (b egressBox) expect(addr netip.Addr, port int, ok bool) {
	b.t.Helper()
	if got := b.connect(addr, port); got != ok {
		b.t.Errorf("connect %s:%d from the sandbox: answered=%v, want %v", addr, port, got, ok)
	}
}

func (b egressBox) expectName(name string, want netip.Addr) {
	b.t.Helper()
	got := b.resolve(name)
	if (!want.IsValid() && got != "") || (want.IsValid() && got != want.String()) {
		b.t.Errorf("resolve %s in the sandbox: %q, want %q", name, got, want)
	}
}

// setNetwork changes the lease's policy over REST and returns the call's
// duration.
func (b egressBox) setNetwork(policy map[string]any) time.Duration {
	b.t.Helper()
	start := time.Now()
	code, _, body := b.a.mustCall(b.t, http.MethodPost, "/v1/leases/"+b.id+":network", policy)
	took := time.Since(start)
	if code != http.StatusOK {
		b.t.Fatalf("POST :network %v: HTTP %d: %s", policy, code, body)
	}
	var l orchv1.Lease
	if err := decode(body, &l); err != nil {
		b.t.Fatal(err)
	}
	if want, _ := policy["mode"].(string); want != "" && l.GetNetwork().GetMode() != want {
		b.t.Errorf("lease network after the change: %+v, want mode %s", l.GetNetwork(), want)
	}
	return took
}

// changeLatency opens addr:port by a policy change and measures from the
// API call until a connection from inside the sandbox (retrying every
// 5 ms) gets an answer, using the one clock sandbox and host share.
func (b egressBox) changeLatency(addr netip.Addr, port int, policy map[string]any) (total, api time.Duration) {
	b.t.Helper()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	script := fmt.Sprintf(`import socket, time
print("started", flush=True)
end = time.time() + 8
while time.time() < end:
    try:
        s = socket.create_connection(("%s", %d), timeout=0.2)
        if s.recv(3) == b"ok\n":
            print("%%.6f" %% time.time()); break
    except OSError:
        pass
    time.sleep(0.005)
`, addr, port)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		code, r, err := b.a.proxyExec(ctx, b.id, b.token, map[string]any{"argv": []string{"python3", "-c", script}, "timeout": "20s"})
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("HTTP %d: %s", code, r.Stderr)
		}
		done <- result{r.Stdout, err}
	}()
	time.Sleep(700 * time.Millisecond) // the loop is running and failing
	start := time.Now()
	api = b.setNetwork(policy)
	r := <-done
	if r.err != nil {
		b.t.Fatalf("latency probe: %v", r.err)
	}
	lines := strings.Fields(r.out)
	if len(lines) != 2 {
		b.t.Fatalf("latency probe: no connection within 8s: %q", r.out)
	}
	sec, err := strconv.ParseFloat(lines[1], 64)
	if err != nil {
		b.t.Fatal(err)
	}
	return time.Unix(0, int64(sec*1e9)).Sub(start), api
}

// checkEgress is the policy scenario shared by both backends.
func checkEgress(t *testing.T, a *api, tg *egressTargets, backend string) egressBox {
	r := a.acquireBody(t, map[string]any{
		"conversationId": "egress-" + backend + "-" + randHex(4), "image": baseImage, "ttl": "600s",
		"network": map[string]any{"mode": "restricted",
			"allow": []string{"allowed.test", "*.svc.test:80", tg.a3.String() + ":80"},
			"deny":  []string{"bad.svc.test"}},
	})
	b := egressBox{t: t, a: a, id: r.GetLease().GetId(), token: r.GetToken()}
	t.Cleanup(func() { _, _, _, _ = a.call(http.MethodDelete, "/v1/leases/"+b.id, nil) })
	if n := r.GetLease().GetNetwork(); n.GetMode() != "restricted" || len(n.GetAllow()) != 3 {
		t.Errorf("acquired lease network: %+v", n)
	}
	_, conf := b.sh("cat /etc/resolv.conf")
	t.Logf("%s sandbox resolv.conf:\n%s", backend, conf)

	// The static host:port allow; nothing else before names resolve.
	b.expect(tg.a3, 80, true)
	b.expect(tg.a3, 81, false)
	b.expect(tg.a1, 80, false)
	// Allowed names resolve and open exactly their addresses (and port).
	b.expectName("allowed.test", tg.a1)
	b.expect(tg.a1, 80, true)
	b.expect(tg.a1, 81, true)
	b.expectName("api.svc.test", tg.a2)
	b.expect(tg.a2, 80, true)
	b.expect(tg.a2, 81, false)
	// Denied and unlisted names do not resolve.
	b.expectName("bad.svc.test", netip.Addr{})
	b.expectName("other.test", netip.Addr{})
	// Even a name server of its own choosing answers through berth's resolver.
	if rc, out := b.sh("python3 - <<'EOF'\nimport socket\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)\nq=bytes.fromhex('abcd01000001000000000000')+b'\\x05other\\x04test\\x00\\x00\\x01\\x00\\x01'\ns.sendto(q, ('" + tg.ns.HostAddr.String() + "', 53)); r=s.recv(512); print(r[3] & 15)\nEOF"); rc != 0 || out != "3" {
		t.Errorf("a DNS query to another server for a denied name: exit %d, rcode %q (want 3, NXDOMAIN)", rc, out)
	}
	// Always denied: cloud metadata and link-local.
	if rc, out := b.sh(`timeout 2 bash -c 'exec 3<>/dev/tcp/169.254.169.254/80' && echo reached`); rc == 0 || strings.Contains(out, "reached") {
		t.Errorf("metadata address reached: %q", out)
	}
	// The sandbox cannot touch its rules: no CAP_NET_ADMIN nor CAP_NET_RAW,
	// even as root.
	rc, out := b.sh(`python3 -c "
import socket
eff = int([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0], 16)
print('net_admin', bool(eff >> 12 & 1), 'net_raw', bool(eff >> 13 & 1))
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print('raw socket opened')
except PermissionError:
    print('raw socket refused')
"`)
	if rc != 0 || out != "net_admin False net_raw False\nraw socket refused" {
		t.Errorf("capabilities in the sandbox: exit %d: %q", rc, out)
	}

	// A change applies to new connections at once.
	total, api := b.changeLatency(tg.a2, 81, map[string]any{"mode": "restricted", "allow": []string{tg.a2.String() + ":81"}})
	t.Logf("EGRESS-LATENCY %s: policy change → first new connection answered in the sandbox: %s (the API call took %s)",
		backend, total.Round(time.Microsecond), api.Round(time.Microsecond))
	if total > time.Second {
		t.Errorf("policy change took %s to apply, want < 1s", total)
	}
	b.expect(tg.a3, 80, false) // no longer allowed
	b.expect(tg.a1, 80, false) // what the resolver opened is closed again
	b.setNetwork(map[string]any{"mode": "none"})
	b.expect(tg.a2, 81, false)
	b.expectName("allowed.test", netip.Addr{})
	b.setNetwork(map[string]any{"mode": "open", "deny": []string{tg.a1.String()}})
	b.expect(tg.a1, 80, false)
	b.expect(tg.a2, 80, true)
	b.expectName("other.test", tg.a3)
	if rc, _ := b.sh(`timeout 2 bash -c 'exec 3<>/dev/tcp/169.254.169.254/80'`); rc == 0 {
		t.Error("metadata address reached in open mode")
	}
	// Bad policies name the field; a lease token cannot change its policy.
	if code, _, body := a.mustCall(t, http.MethodPost, "/v1/leases/"+b.id+":network", map[string]any{"mode": "restricted", "allow": []string{"10.0.0.0/33"}}); code != http.StatusBadRequest || !strings.Contains(string(body), "network.allow[0]") {
		t.Errorf("bad allow: HTTP %d: %s", code, body)
	}
	if code, _, body := a.mustCall(t, http.MethodPost, "/v1/leases/"+b.id+":network", map[string]any{"mode": "open"}, b.token); code != http.StatusForbidden {
		t.Errorf("change with the lease's own token: HTTP %d: %s", code, body)
	}
	return b
}

// egressRules counts the iptables rules (filter and nat) naming lease id.
func egressRules(t *testing.T, id string) int {
	t.Helper()
	n := 0
	for _, table := range []string{"filter", "nat"} {
		out, err := exec.Command("iptables", "-w", "10", "-t", table, "-S").Output()
		if err != nil {
			t.Fatal(err)
		}
		n += strings.Count(string(out), "/"+id+"\"")
	}
	return n
}

// TestEgressDocker: network policies on the Docker backend through the
// real orchestrator process — enforcement, live changes (latency
// measured), re-application after an in-place restart and after an
// orchestrator restart, and the rules' removal with the sandbox.
func TestEgressDocker(t *testing.T) {
	requireImage(t, baseImage)
	tg := newEgressTargets(t)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	env := []string{"BERTH_EGRESS=required", "BERTH_EGRESS_UPSTREAMS=" + tg.dns.Addr}
	p := startProc(t, dir, addr, env...)
	a := newAPI(addr)
	defer a.close()
	b := checkEgress(t, a, tg, "docker")

	// The CLI changes it too (-o json).
	out, errs, code := cliRun(t, addr, "lease", "network", b.id, "--mode", "restricted", "--allow", tg.a3.String()+":80,allowed.test", "-o", "json")
	var l orchv1.Lease
	if code != 0 || decode([]byte(out), &l) != nil || l.GetNetwork().GetMode() != "restricted" {
		t.Fatalf("orchestrator lease network: exit %d: %s %s", code, out, errs)
	}
	b.expect(tg.a3, 80, true)
	b.expect(tg.a2, 80, false)

	// An in-place restart (the address may change) keeps the policy.
	lease := a.mustGet(t, b.id)
	mustDocker(t, "kill", lease.GetContainerId())
	waitRestarted(t, a, b.id, 1, 30*time.Second)
	b.expect(tg.a3, 80, true)
	b.expect(tg.a2, 80, false)
	b.expectName("allowed.test", tg.a1)
	b.expect(tg.a1, 80, true)
	if rc, _ := b.sh(`timeout 2 bash -c 'exec 3<>/dev/tcp/169.254.169.254/80'`); rc == 0 {
		t.Error("metadata address reached after restart")
	}

	// An orchestrator restart (a new resolver port) re-applies it: names
	// resolve through the new resolver.
	p.stop()
	p = startProc(t, dir, addr, env...)
	b.expectName("allowed.test", tg.a1)
	b.expect(tg.a1, 80, true)
	b.expect(tg.a3, 80, true)
	b.expect(tg.a2, 80, false)
	b.expectName("other.test", netip.Addr{})

	// Always denied in open mode too: another sandbox, and the host itself
	// (a listener on all of the host's addresses, reached through the
	// sandbox's gateway).
	b.setNetwork(map[string]any{"mode": "open"})
	other := a.acquireBody(t, map[string]any{"conversationId": "egress-other-" + randHex(4), "image": baseImage, "ttl": "600s"})
	t.Cleanup(func() { _, _, _, _ = a.call(http.MethodDelete, "/v1/leases/"+other.GetLease().GetId(), nil) })
	otherIP := netip.MustParseAddrPort(other.GetLease().GetEndpoint()).Addr()
	b.expect(tg.a2, 80, true)
	if rc, _ := b.sh(fmt.Sprintf(`timeout 2 bash -c 'exec 3<>/dev/tcp/%s/7000'`, otherIP)); rc == 0 {
		t.Errorf("another sandbox's agent (%s:7000) reached", otherIP)
	}
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, gw := b.sh(`python3 -c "import socket,struct
for l in open('/proc/net/route').readlines()[1:]:
    f=l.split()
    if f[1]=='00000000': print(socket.inet_ntoa(struct.pack('<L', int(f[2],16))))"`)
	if _, err := netip.ParseAddr(gw); err != nil {
		t.Fatalf("the sandbox's gateway: %q", gw)
	}
	t.Logf("checking the host through the sandbox's gateway %s", gw)
	if rc, _ := b.sh(fmt.Sprintf(`timeout 2 bash -c 'exec 3<>/dev/tcp/%s/%d'`, gw, ln.Addr().(*net.TCPAddr).Port)); rc == 0 {
		t.Errorf("the host (%s:%d) reached from the sandbox", gw, ln.Addr().(*net.TCPAddr).Port)
	}

	// Releasing the lease removes its rules.
	if n := egressRules(t, b.id); n == 0 {
		t.Fatal("no rules for the lease while it runs")
	}
	a.mustRelease(t, b.id)
	if !eventually(10*time.Second, 50*time.Millisecond, func() bool { return egressRules(t, b.id) == 0 }) {
		t.Errorf("%d rules of lease %s left after release", egressRules(t, b.id), b.id)
	}
	_ = p
}

// TestEgressContainerd: the same policy scenario on the containerd
// backend, then re-application after an in-place restart (task killed)
// and after an orchestrator restart.
func TestEgressContainerd(t *testing.T) {
	requireContainerd(t)
	requireCtrdImage(t, baseImage)
	tg := newEgressTargets(t)
	env := newCtrdEnv(t)
	o := startCtrdOrch(t, env, func(c *orchestrator.Config) {
		c.Egress = "required"
		c.EgressUpstreams = []string{tg.dns.Addr}
		c.Admission.AllowedImages = []string{"berth/"}
	})
	b := checkEgress(t, o.api, tg, "containerd")
	ctr := o.mustGet(t, b.id).GetContainerId()
	env.track(ctr)
	b.setNetwork(map[string]any{"mode": "restricted", "allow": []string{tg.a3.String() + ":80", "allowed.test"}})
	b.expect(tg.a3, 80, true)
	b.expect(tg.a2, 80, false)

	// An in-place restart (the task SIGKILLed behind berth's back: a new
	// task, a new network namespace, perhaps a new address) keeps the
	// policy and the DNS redirection.
	killCtrdTask(t, ctrd.rt, ctr)
	waitRestarted(t, o.api, b.id, 1, 30*time.Second)
	b.expect(tg.a3, 80, true)
	b.expect(tg.a2, 80, false)
	b.expectName("allowed.test", tg.a1)
	b.expect(tg.a1, 80, true)
	b.expectName("other.test", netip.Addr{})

	// An orchestrator restart (a new resolver port) re-applies it.
	o.stop(t)
	o = startCtrdOrch(t, env, func(c *orchestrator.Config) {
		c.Egress = "required"
		c.EgressUpstreams = []string{tg.dns.Addr}
		c.Admission.AllowedImages = []string{"berth/"}
	})
	b.a = o.api
	b.expectName("allowed.test", tg.a1)
	b.expect(tg.a1, 80, true)
	b.expect(tg.a3, 80, true)
	b.expect(tg.a2, 80, false)
	b.expectName("other.test", netip.Addr{})
	if n := egressRules(t, b.id); n == 0 {
		t.Fatal("no rules for the lease after the orchestrator restart")
	}
	o.mustRelease(t, b.id)
	if !eventually(10*time.Second, 50*time.Millisecond, func() bool { return egressRules(t, b.id) == 0 }) {
		t.Errorf("%d rules of lease %s left after release", egressRules(t, b.id), b.id)
	}
}

// TestEgressCeilingDocker: the operator's ceiling (max-network-mode,
// network-always-deny, network-allow-ceiling) through the real
// orchestrator process: requests above it are refused with 403 naming the
// field and the ceiling (the operator token included), the always-denied
// address stays refused whatever the client's lists say, and the egress
// metrics count what happened.
func TestEgressCeilingDocker(t *testing.T) {
	requireImage(t, baseImage)
	tg := newEgressTargets(t)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	p := startProc(t, dir, addr, "BERTH_EGRESS=required", "BERTH_EGRESS_UPSTREAMS="+tg.dns.Addr,
		"BERTH_DEFAULT_NETWORK_MODE=none", "BERTH_MAX_NETWORK_MODE=restricted",
		"BERTH_NETWORK_ALWAYS_DENY="+tg.a1.String(),
		"BERTH_NETWORK_ALLOW_CEILING=*.svc.test,allowed.test,"+tg.a1.String()+","+tg.a3.String()+":80")
	defer p.stop()
	a := newAPI(addr)
	defer a.close()

	conv := "egress-ceiling-" + randHex(4)
	for _, c := range []struct {
		network     map[string]any
		field, ceil string
	}{
		{map[string]any{"mode": "open"}, "network.mode", "max-network-mode restricted"},
		{map[string]any{"mode": "restricted", "allow": []string{"api.svc.test", "other.test"}}, "network.allow[1]", "network-allow-ceiling"},
		{map[string]any{"mode": "restricted", "allow": []string{tg.a3.String()}}, "network.allow[0]", "network-allow-ceiling"},
	} {
		code, _, body := a.mustCall(t, http.MethodPost, "/v1/leases", map[string]any{"conversationId": conv, "image": baseImage, "network": c.network})
		if code != http.StatusForbidden || !strings.Contains(string(body), c.field) || !strings.Contains(string(body), c.ceil) {
			t.Errorf("acquire with %v: HTTP %d: %s; want 403 naming %s and %s", c.network, code, body, c.field, c.ceil)
		}
	}
	r := a.acquireBody(t, map[string]any{"conversationId": conv, "image": baseImage, "ttl": "600s",
		"network": map[string]any{"mode": "restricted", "allow": []string{tg.a1.String(), tg.a3.String() + ":80", "api.svc.test:80", "allowed.test"}}})
	b := egressBox{t: t, a: a, id: r.GetLease().GetId(), token: r.GetToken()}
	t.Cleanup(func() { _, _, _, _ = a.call(http.MethodDelete, "/v1/leases/"+b.id, nil) })
	if d := r.GetLease().GetNetwork().GetDeny(); len(d) != 0 {
		t.Errorf("the operator's deny list shows in the lease: %v", d)
	}
	b.expect(tg.a3, 80, true)
	b.expect(tg.a1, 80, false) // allowed by the client, always denied by the operator
	b.expectName("api.svc.test", tg.a2)
	b.expect(tg.a2, 80, true)
	b.expectName("allowed.test", tg.a1)
	b.expect(tg.a1, 80, false)
	// A change cannot drop the operator's deny list nor exceed the ceiling.
	b.setNetwork(map[string]any{"mode": "restricted", "allow": []string{tg.a1.String()}, "deny": []string{}})
	b.expect(tg.a1, 80, false)
	if code, _, body := a.mustCall(t, http.MethodPost, "/v1/leases/"+b.id+":network", map[string]any{"mode": "open"}); code != http.StatusForbidden || !strings.Contains(string(body), "network.mode") {
		t.Errorf("change to open with the operator token: HTTP %d: %s", code, body)
	}
	// The default (none) is under the ceiling.
	def := a.acquireBody(t, map[string]any{"conversationId": conv + "-default", "image": baseImage, "ttl": "600s"})
	t.Cleanup(func() { _, _, _, _ = a.call(http.MethodDelete, "/v1/leases/"+def.GetLease().GetId(), nil) })
	if m := def.GetLease().GetNetwork().GetMode(); m != "none" {
		t.Errorf("default lease mode %q, want none", m)
	}

	code, _, m := a.mustCall(t, http.MethodGet, "/metrics", nil)
	if code != http.StatusOK {
		t.Fatalf("metrics: HTTP %d", code)
	}
	for _, want := range []string{`berth_egress_policy_applications_total{result="error"} 0`, `berth_egress_dns_queries_total{result="answered"} `,
		"berth_egress_apply_duration_seconds_count "} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	for _, line := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(line, "berth_egress_") && !strings.Contains(line, "_bucket") {
			t.Log(line)
		}
		if strings.HasPrefix(line, `berth_egress_policy_applications_total{result="ok"} `) && strings.HasSuffix(line, " 0") {
			t.Errorf("no successful application counted: %s", line)
		}
	}
	a.mustRelease(t, b.id)
}
