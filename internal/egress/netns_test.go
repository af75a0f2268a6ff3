package egress_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-dev/berth/internal/egress"
	"github.com/berth-dev/berth/internal/egress/egresstest"
)

const short = 700 * time.Millisecond

// TestEnforcerNetns programs a policy for a sandbox-like namespace and
// checks it against servers in a target namespace: allowed targets answer,
// denied ones are refused, denied names do not resolve, a change applies to
// the next connection, and Remove leaves nothing behind.
func TestEnforcerNetns(t *testing.T) {
	egresstest.Require(t)
	ctx := context.Background()
	sb := egresstest.NewNetns(t, "s", 1)
	tg := egresstest.NewNetns(t, "t", 3)
	egresstest.Forward(t, sb, tg)
	tg.Serve(t, 80, 81)
	up := egresstest.NewDNS(t)
	a1, a2, a3 := tg.Addrs[0], tg.Addrs[1], tg.Addrs[2]
	up.Set("allowed.test", a1)
	up.Set("api.svc.test", a2)
	up.Set("other.test", a3)
	up.Set("svc.test", a3)

	instance := "egtest-" + sb.Name
	met := egress.NewMetrics()
	e := newEnforcer(t, instance, up.Addr, met)
	lease := "lease-1"
	t.Cleanup(func() { _ = e.Remove(context.Background(), lease) })
	endpoint := net.JoinHostPort(sb.Addrs[0].String(), "7000")
	at := func(a netip.Addr, port string) string { return net.JoinHostPort(a.String(), port) }
	dnsAddr := egress.DNSAddress + ":53"

	// Before any policy: everything answers (the test's own forwarding).
	if err := sb.Dial(at(a3, "80"), short); err != nil {
		t.Fatalf("before any policy: %v", err)
	}

	apply := func(p egress.Policy) {
		t.Helper()
		if err := e.Apply(ctx, lease, endpoint, p); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	apply(egress.Policy{Mode: egress.ModeRestricted, Allow: []string{"allowed.test", "*.svc.test:81", a3.String() + ":80"},
		Deny: []string{"other.test"}})
	t.Logf("EGRESS-LATENCY first Apply of a sandbox (what an acquire waits for): %s", time.Since(began).Round(time.Microsecond))
	expectDial := func(addr string, ok bool) {
		t.Helper()
		start := time.Now()
		err := sb.Dial(addr, short)
		switch {
		case ok && err != nil:
			t.Errorf("dial %s: %v, want an answer", addr, err)
		case !ok && err == nil:
			t.Errorf("dial %s answered, want refused", addr)
		case !ok && time.Since(start) > short/2 && !strings.Contains(err.Error(), "refused"):
			t.Logf("dial %s: %v (after %s)", addr, err, time.Since(start))
		}
	}
	expectName := func(name string, want netip.Addr) {
		t.Helper()
		addrs, rcode, err := sb.Lookup(dnsAddr, name, 2*time.Second)
		if err != nil {
			t.Fatalf("lookup %s: %v", name, err)
		}
		if !want.IsValid() {
			if rcode != dns.RcodeNameError || len(addrs) != 0 {
				t.Errorf("lookup %s: rcode %s, %v; want NXDOMAIN", name, dns.RcodeToString[rcode], addrs)
			}
			return
		}
		if len(addrs) != 1 || addrs[0] != want {
			t.Errorf("lookup %s: rcode %s, %v; want %s", name, dns.RcodeToString[rcode], addrs, want)
		}
	}
	// Not resolved yet: a1 is closed.
	expectDial(at(a1, "80"), false)
	// The static host:port allow.
	expectDial(at(a3, "80"), true)
	expectDial(at(a3, "81"), false)
	// Names: allowed ones resolve and open exactly their addresses (and port).
	expectName("allowed.test", a1)
	expectDial(at(a1, "80"), true)
	expectDial(at(a1, "81"), true)
	expectName("api.svc.test", a2)
	expectDial(at(a2, "81"), true)
	expectDial(at(a2, "80"), false)
	expectName("svc.test", netip.Addr{})   // *.svc.test is not svc.test
	expectName("other.test", netip.Addr{}) // denied
	expectName("unknown.test", netip.Addr{})
	// Always denied: metadata; the host itself (its address on the link).
	expectDial("169.254.169.254:80", false)
	expectDial(at(sb.HostAddr, "22"), false)

	// A change applies to the next connection: measure it.
	start := time.Now()
	apply(egress.Policy{Mode: egress.ModeRestricted, Allow: []string{a3.String() + ":80"}})
	deadline := start.Add(time.Second)
	for sb.Dial(at(a3, "80"), short) != nil {
		if time.Now().After(deadline) {
			t.Fatal("a3:80 still closed 1s after it was allowed")
		}
	}
	t.Logf("EGRESS-LATENCY apply(allow) + first answered connection in %s", time.Since(start).Round(time.Microsecond))
	// The addresses the resolver opened under the old policy are closed.
	expectDial(at(a1, "80"), false)
	start = time.Now()
	apply(egress.Policy{Mode: egress.ModeNone})
	expectDial(at(a3, "80"), false)
	t.Logf("EGRESS-LATENCY apply(none) + refused connection in %s", time.Since(start).Round(time.Microsecond))
	expectName("allowed.test", netip.Addr{})
	apply(egress.Policy{Mode: egress.ModeOpen, Deny: []string{a2.String() + "/32", "other.test"}})
	expectDial(at(a1, "81"), true)
	expectDial(at(a2, "80"), false)
	expectDial("169.254.169.254:80", false)
	expectName("allowed.test", a1)
	expectName("other.test", netip.Addr{})

	// Apply is idempotent: the same rules once.
	apply(egress.Policy{Mode: egress.ModeOpen})
	apply(egress.Policy{Mode: egress.ModeOpen})
	if n := countLines(t, "filter", "berth-egress "+instance+"/"+lease); n != 2 {
		t.Errorf("%d filter dispatch rules after two applies, want 2", n)
	}

	// Repair: a rule inserted above berth's jump, and the sandbox's dispatch
	// rules deleted (a firewall reload), are put right.
	apply(egress.Policy{Mode: egress.ModeNone})
	above := []string{"FORWARD", "-i", "lo", "-o", "lo", "-j", "ACCEPT"}
	ipt(t, append([]string{"-I"}, above...)...)
	t.Cleanup(func() { _ = exec.Command("iptables", append([]string{"-w", "10", "-D"}, above...)...).Run() })
	for _, line := range strings.Split(strings.TrimSpace(iptS(t, "filter")), "\n") {
		if strings.Contains(line, "berth-egress "+instance+"/"+lease) {
			if out, err := exec.Command("sh", "-c", "iptables -w 10 "+strings.Replace(line, "-A", "-D", 1)).CombinedOutput(); err != nil {
				t.Fatalf("delete %q: %v: %s", line, err, out)
			}
		}
	}
	expectDial(at(a3, "80"), true) // no rules: the test's own forwarding
	e.Repair()
	if first := strings.Split(iptS(t, "filter", "FORWARD"), "\n")[1]; first != "-A FORWARD -j "+egress.ForwardChain {
		t.Errorf("first FORWARD rule after Repair: %q", first)
	}
	expectDial(at(a3, "80"), false)
	if err := e.Remove(ctx, lease); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"filter", "nat"} {
		if n := countLines(t, table, instance); n != 0 {
			t.Errorf("%d %s rules of the instance left after Remove", n, table)
		}
	}
	if err := e.Remove(ctx, lease); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	expectDial(at(a2, "80"), true)

	// The figures (metrics.go): every Apply above succeeded; names were
	// answered and denied.
	got := gather(t, met)
	if got[`berth_egress_policy_applications_total{result="ok"}`] < 5 || got[`berth_egress_policy_applications_total{result="error"}`] != 0 ||
		got["berth_egress_apply_duration_seconds_count"] != got[`berth_egress_policy_applications_total{result="ok"}`] ||
		got[`berth_egress_dns_queries_total{result="answered"}`] < 3 || got[`berth_egress_dns_queries_total{result="denied"}`] < 4 {
		t.Errorf("metrics: %v", got)
	}
	t.Logf("metrics: %v", got)
}

// gather returns c's series as name{label="value"} → value (histograms:
// their _count).
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += fmt.Sprintf("{%s=%q}", l.GetName(), l.GetValue())
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestEnforcerPrune removes the rules of leases that are gone, and only
// this instance's; a new sandbox at an address takes it over from stale
// rules of another lease.
func TestEnforcerPrune(t *testing.T) {
	egresstest.Require(t)
	ctx := context.Background()
	sb := egresstest.NewNetns(t, "s", 4)
	up := egresstest.NewDNS(t)
	e1 := newEnforcer(t, "egtest-a-"+sb.Name, up.Addr)
	e2 := newEnforcer(t, "egtest-b-"+sb.Name, up.Addr)
	ep := func(i int) string { return net.JoinHostPort(sb.Addrs[i].String(), "7000") }
	for i, l := range []string{"keep", "gone", "stale"} {
		t.Cleanup(func() { _ = e1.Remove(context.Background(), l) })
		if err := e1.Apply(ctx, l, ep(i), egress.Policy{Mode: egress.ModeNone}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = e2.Remove(context.Background(), "gone") })
	if err := e2.Apply(ctx, "gone", ep(3), egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	// Another instance's sandbox now has the address of "stale".
	t.Cleanup(func() { _ = e2.Remove(context.Background(), "thief") })
	if err := e2.Apply(ctx, "thief", ep(2), egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	if n := countLines(t, "filter", "egtest-a-"+sb.Name+"/stale"); n != 0 {
		t.Errorf("%d rules of the stale lease at a taken address", n)
	}
	if err := e1.Prune(ctx, func(l string) bool { return l == "keep" }); err != nil {
		t.Fatal(err)
	}
	got, err := e1.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "keep" {
		t.Errorf("leases after prune: %v, want [keep]", got)
	}
	if got, _ := e2.Leases(ctx); len(got) != 2 {
		t.Errorf("the other instance's leases after prune: %v, want [gone thief]", got)
	}
}

func newEnforcer(t *testing.T, instance, upstream string, met ...*egress.Metrics) *egress.Enforcer {
	t.Helper()
	cfg := egress.Config{InstanceID: instance, Upstreams: []string{upstream}}
	if len(met) > 0 {
		cfg.Metrics = met[0]
	}
	e, err := egress.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func ipt(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("iptables", append([]string{"-w", "10"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables %v: %v: %s", args, err, out)
	}
}

func iptS(t *testing.T, table string, chain ...string) string {
	t.Helper()
	out, err := exec.Command("iptables", append([]string{"-w", "10", "-t", table, "-S"}, chain...)...).Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func countLines(t *testing.T, table, substr string) int {
	t.Helper()
	out, err := exec.Command("iptables", "-w", "10", "-t", table, "-S").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(out), substr)
}

// TestEnforcerSkipsUnchangedApply: applying the policy a sandbox already
// has, at the address it already has (a wake from hibernate), runs no
// iptables-restore; a changed policy does, and is enforced.
func TestEnforcerSkipsUnchangedApply(t *testing.T) {
	egresstest.Require(t)
	ctx := context.Background()
	sb := egresstest.NewNetns(t, "u", 1)
	tg := egresstest.NewNetns(t, "v", 1)
	egresstest.Forward(t, sb, tg)
	tg.Serve(t, 80)
	up := egresstest.NewDNS(t)
	e, restores := egress.NewCounting(egress.Config{InstanceID: "egtest-" + sb.Name, Upstreams: []string{up.Addr}})
	t.Cleanup(func() { _ = e.Close() })
	lease := "lease-skip"
	t.Cleanup(func() { _ = e.Remove(context.Background(), lease) })
	endpoint := net.JoinHostPort(sb.Addrs[0].String(), "7000")
	target := net.JoinHostPort(tg.Addrs[0].String(), "80")

	none := egress.Policy{Mode: egress.ModeNone}
	if err := e.Apply(ctx, lease, endpoint, none); err != nil {
		t.Fatal(err)
	}
	first := restores.Load()
	if first == 0 {
		t.Fatal("the first Apply ran no iptables-restore")
	}
	if err := e.Apply(ctx, lease, endpoint, none); err != nil {
		t.Fatal(err)
	}
	if n := restores.Load(); n != first {
		t.Fatalf("an unchanged Apply ran iptables-restore %d times", n-first)
	}
	if err := sb.Dial(target, short); err == nil {
		t.Fatal("mode none: the connection was answered")
	}
	if err := e.Apply(ctx, lease, endpoint, egress.Policy{Mode: egress.ModeOpen}); err != nil {
		t.Fatal(err)
	}
	if restores.Load() == first {
		t.Fatal("a changed policy ran no iptables-restore")
	}
	if err := sb.Dial(target, short); err != nil {
		t.Fatalf("mode open: %v", err)
	}
}
