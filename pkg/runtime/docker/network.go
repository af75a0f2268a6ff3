package docker

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// optICC is the bridge driver option that controls inter-container
// communication; berth's network sets it to "false".
const optICC = "com.docker.network.bridge.enable_icc"

// ensureNetwork makes sure the sandbox bridge network exists with
// inter-container communication disabled and returns its id. It is
// idempotent and race-safe across processes: engines before API 1.44 (e.g.
// 20.10) check duplicate names non-atomically, so two orchestrators starting
// together can both create "berth". Every creator then lists the networks of
// that name, keeps the oldest and removes its own if it lost, so all of them
// settle on the same network. A network of that name that allows
// inter-container communication is refused: sandboxes could reach each other.
func (r *Runtime) ensureNetwork(ctx context.Context) (string, error) {
	r.netMu.Lock()
	defer r.netMu.Unlock()
	if r.netID != "" {
		return r.netID, nil
	}
	name := r.cfg.Network
	// Creators on this host take turns (in-process and across processes),
	// so only creators on different hosts sharing an engine can race.
	unlock := lockNetwork(name)
	defer unlock()
	nets, err := r.networksNamed(ctx, name)
	if err != nil {
		return "", err
	}
	if len(nets) == 0 {
		resp, cerr := r.cli.NetworkCreate(ctx, name, network.CreateOptions{
			Driver:  "bridge",
			Options: map[string]string{optICC: "false"},
			Labels:  map[string]string{runtime.LabelManaged: "true"},
		})
		mine := resp.ID
		if cerr != nil {
			mapped := r.mapErr(cerr, "create network", name)
			// A concurrent creator won: use what it made.
			if !errdefs.IsFailedPrecondition(mapped) && !errdefs.IsAlreadyExists(mapped) {
				return "", mapped
			}
		}
		if nets, err = r.networksNamed(ctx, name); err != nil {
			return "", err
		}
		if len(nets) == 0 {
			return "", errdefs.Unavailable("docker: network %s vanished right after it was created", name)
		}
		if mine != "" {
			if nets[0].ID == mine {
				r.log.Info("created sandbox network", "network", name, "network_id", mine, "icc", false)
			} else {
				// Lost a creation race: remove ours, use the oldest.
				if err := r.cli.NetworkRemove(ctx, mine); err != nil {
					r.log.Warn("cannot remove duplicate network", "network", name, "network_id", mine, "err", err)
				}
			}
		}
	}
	nw := nets[0]
	if nw.Driver != "bridge" {
		return "", errdefs.FailedPrecondition("docker: network %s uses driver %q; berth needs a bridge network with %s=false (remove it: docker network rm %s)", name, nw.Driver, optICC, name)
	}
	if nw.Options[optICC] != "false" {
		return "", errdefs.FailedPrecondition("docker: network %s allows inter-container communication, so sandboxes could reach each other; remove it (docker network rm %s) and berth recreates it with %s=false", name, name, optICC)
	}
	if err := r.ensureHostInput(ctx, nw); err != nil {
		return "", err
	}
	r.netID = nw.ID
	return nw.ID, nil
}

// networksNamed returns the networks named exactly name, oldest first (the
// engine's name filter matches substrings).
func (r *Runtime) networksNamed(ctx context.Context, name string) ([]network.Summary, error) {
	list, err := r.cli.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(filters.Arg("name", name))})
	if err != nil {
		return nil, r.mapErr(err, "list networks", name)
	}
	out := list[:0]
	for _, n := range list {
		if n.Name == name {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// forgetNetwork makes the next Create look the network up (and recreate it)
// again, e.g. after someone removed it behind our back.
func (r *Runtime) forgetNetwork() {
	r.netMu.Lock()
	r.netID = ""
	r.netMu.Unlock()
}

// netLocks serialize network creation by name within this process.
var netLocks sync.Map // name -> *sync.Mutex

// lockNetwork serializes creators of network name: a mutex within the
// process and, best effort, an flock on a file in the temp dir across
// processes. It returns the unlock function.
func lockNetwork(name string) func() {
	mu, _ := netLocks.LoadOrStore(name, &sync.Mutex{})
	m := mu.(*sync.Mutex)
	m.Lock()
	path := filepath.Join(os.TempDir(), "berth-network-"+name+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return m.Unlock
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return m.Unlock
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		m.Unlock()
	}
}
