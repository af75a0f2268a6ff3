package hostfw

import (
	"strings"
	"testing"
)

func TestStaleIfaces(t *testing.T) {
	rules := strings.Join([]string{
		"-N BERTH-INPUT",
		"-A BERTH-INPUT -i br-aaaaaaaaaaaa -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
		"-A BERTH-INPUT -i br-bbbbbbbbbbbb -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
		"-A BERTH-INPUT -i berth-ctrd0 -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
		"-A BERTH-INPUT -i br-aaaaaaaaaaaa -j DROP",
		"-A BERTH-INPUT -i br-bbbbbbbbbbbb -j DROP",
		"-A BERTH-INPUT -i berth-ctrd0 -j DROP",
	}, "\n")
	live := map[string]bool{"br-aaaaaaaaaaaa": true}
	got := staleIfaces(rules, "br-", func(n string) bool { return live[n] })
	if len(got) != 1 || got[0] != "br-bbbbbbbbbbbb" {
		t.Fatalf("staleIfaces = %v, want [br-bbbbbbbbbbbb] (berth-ctrd0 has another prefix; br-aaaa… exists)", got)
	}
}
