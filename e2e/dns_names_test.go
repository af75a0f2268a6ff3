package e2e

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/orchestrator"
	"github.com/berth-dev/berth/pkg/runtime"
)

// TestNeighbourNamesSayNothingDocker performs the attack of issue 21 item
// 7 on Docker: from inside a sandbox, a tenant asks Docker's embedded DNS
// for the names of its neighbours' addresses (another lease's and an
// unclaimed pool member's) with getent and Python's gethostbyaddr. The
// answers must not hold their lease ids.
func TestNeighbourNamesSayNothingDocker(t *testing.T) {
	requireImage(t, baseImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir, func(c *orchestrator.Config) {
		c.Pools = []orchestrator.Pool{{Name: "dns", Image: minimalImage, Min: 1, Max: 1}}
	})
	waitPool(t, o.srv.Manager(), "dns", 1)
	me := o.mustAcquire(t, "c-dns-me", baseImage, "600s")
	other := o.mustAcquire(t, "c-dns-other", baseImage, "600s")
	defer o.mustRelease(t, me.GetLease().GetId())
	defer o.mustRelease(t, other.GetLease().GetId())

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	boxes, err := dockerRT.List(ctx, runtime.Selector{runtime.LabelInstance: instance})
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]string{} // address → lease id that must not show
	for _, sb := range boxes {
		if sb.LeaseID == me.GetLease().GetId() {
			continue
		}
		host, _, err := net.SplitHostPort(sb.Endpoint)
		if err != nil || sb.LeaseID == "" {
			t.Fatalf("sandbox %+v: endpoint %q, lease %q", sb, sb.Endpoint, sb.LeaseID)
		}
		targets[host] = sb.LeaseID
	}
	if len(targets) != 2 {
		t.Fatalf("neighbours %v, want the other lease and the pool member", targets)
	}
	for ip, lid := range targets {
		out, _ := pexec(t, o.api, me.GetLease().GetId(), me.GetToken(),
			"getent hosts "+ip+"; python3 -c 'import socket,sys; print(socket.gethostbyaddr(sys.argv[1]))' "+ip+" 2>&1; true")
		t.Logf("reverse lookup of %s (lease %s): %q", ip, lid, out)
		if strings.Contains(out, lid) {
			t.Errorf("a reverse lookup of a neighbour's address names its lease %s: %q", lid, out)
		}
	}
}
