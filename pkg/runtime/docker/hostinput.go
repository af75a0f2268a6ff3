package docker

import (
	"context"
	"net"
	"os"

	"github.com/docker/docker/api/types/network"

	"github.com/berth-dev/berth/internal/hostfw"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// HostInputMode says whether the backend keeps sandboxes away from the
// host's own listeners (see Config.HostInput).
type HostInputMode string

const (
	// HostInputAuto installs the host-input filter when it can (root,
	// iptables, the network's bridge on this host) and logs a warning once
	// when it cannot (e.g. a remote DOCKER_HOST or a non-root orchestrator).
	HostInputAuto HostInputMode = "auto"
	// HostInputRequired fails Create when the filter cannot be installed.
	HostInputRequired HostInputMode = "required"
	// HostInputOff installs nothing: sandboxes can reach any host listener
	// bound to 0.0.0.0 or to the bridge's gateway address.
	HostInputOff HostInputMode = "off"
)

// optBridgeName is the bridge driver option naming the host interface.
const optBridgeName = "com.docker.network.bridge.name"

// bridgeName is the host interface of bridge network nw.
func bridgeName(nw network.Summary) string {
	if n := nw.Options[optBridgeName]; n != "" {
		return n
	}
	if len(nw.ID) >= 12 {
		return "br-" + nw.ID[:12]
	}
	return ""
}

// ensureHostInput installs the host-input filter for the sandbox network's
// bridge according to Config.HostInput (see package hostfw): everything a
// sandbox sends to a host address is dropped on INPUT except replies to
// connections the host opened, which is how the orchestrator talks to the
// agents.
func (r *Runtime) ensureHostInput(ctx context.Context, nw network.Summary) error {
	if r.cfg.HostInput == HostInputOff {
		return nil
	}
	iface := bridgeName(nw)
	var problem string
	switch _, err := net.InterfaceByName(iface); {
	case iface == "":
		problem = "cannot tell the network's bridge interface"
	case err != nil:
		problem = "bridge " + iface + " is not on this host (remote engine?)"
	case os.Geteuid() != 0:
		problem = "the orchestrator is not root, so it cannot add iptables rules"
	default:
		err := hostfw.Ensure(ctx, iface)
		if err == nil {
			r.log.Debug("host input filter in place", "network", nw.Name, "bridge", iface, "chain", hostfw.InputChain)
			// Rules of removed networks' bridges (br-<id>) are dropped.
			hostfw.PruneMissing(ctx, "br-")
			return nil
		}
		problem = err.Error()
	}
	if r.cfg.HostInput == HostInputRequired {
		return errdefs.FailedPrecondition("docker: cannot keep sandboxes on network %s away from the host's listeners: %s", nw.Name, problem)
	}
	r.hostInputWarn.Do(func() {
		r.log.Warn("sandboxes can reach services listening on this host's addresses (host input filter not installed); bind host services to 127.0.0.1",
			"network", nw.Name, "bridge", iface, "reason", problem)
	})
	return nil
}
