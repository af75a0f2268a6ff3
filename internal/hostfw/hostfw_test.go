package hostfw_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/hostfw"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

func rulesFor(t *testing.T, cmd, iface string) []string {
	t.Helper()
	out, err := exec.Command(cmd, "-w", "10", "-S", hostfw.InputChain).Output()
	if err != nil {
		t.Fatalf("%s -S %s: %v", cmd, hostfw.InputChain, err)
	}
	var got []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, " -i "+iface+" ") {
			got = append(got, l)
		}
	}
	return got
}

// TestEnsureIdempotent installs the rules of a (nonexistent) interface
// twice, checks they are there once and in order, and removes them.
func TestEnsureIdempotent(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root (iptables)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		testenv.SkipOrFail(t, "no iptables (make deps)")
	}
	ctx := context.Background()
	const iface = "berth-fwtest0"
	t.Cleanup(func() { hostfw.Remove(ctx, iface) })
	for i := 0; i < 2; i++ {
		if err := hostfw.Ensure(ctx, iface); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := rulesFor(t, "iptables", iface), hostfw.Rules(iface); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rules after two Ensure:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !hostfw.Installed(ctx, iface) {
		t.Error("Installed = false after Ensure")
	}
	hostfw.Remove(ctx, iface)
	if got := rulesFor(t, "iptables", iface); len(got) != 0 {
		t.Errorf("rules after Remove: %q", got)
	}
	if err := hostfw.Ensure(ctx, "bad name"); err == nil {
		t.Error("Ensure accepted an interface name with a space")
	}
}
