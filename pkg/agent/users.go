package agent

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"syscall"

	"github.com/berth-dev/berth/pkg/agent/users"
)

// newUsers builds the resolver of the users commands run as: nil when the
// agent is not root and no User is set (commands run as the agent's own
// user, as before users existed). When the default user is not root and the
// agent is, the working directory is given to that user if root owns it,
// so that the default user can write to its workspace.
func newUsers(cfg Config, log *slog.Logger) (*users.Resolver, error) {
	root := os.Geteuid() == 0
	if !root && cfg.User == "" {
		if cfg.DenyRoot {
			return nil, fmt.Errorf("agent: --allow-root=false needs --user (or an agent running as root)")
		}
		return nil, nil
	}
	spec := cfg.User
	if spec == "" {
		spec = strconv.Itoa(os.Geteuid())
	}
	us, err := users.NewResolver(spec, !cfg.DenyRoot)
	if err != nil {
		return nil, fmt.Errorf("agent: user: %w", err)
	}
	id := us.Default
	if !root && (id.UID != uint32(os.Geteuid()) || id.GID != uint32(os.Getegid())) {
		return nil, fmt.Errorf("agent: user %s: the agent runs as uid %d, not root, so it cannot run commands as another user", id, os.Geteuid())
	}
	if root && !id.Root() && cfg.WorkDir != "" && !cfg.KeepWorkDirOwner {
		var st syscall.Stat_t
		if err := syscall.Stat(cfg.WorkDir, &st); err == nil && st.Uid == 0 {
			if err := os.Chown(cfg.WorkDir, int(id.UID), int(id.GID)); err != nil {
				log.Warn("cannot give the working directory to the default user", "work_dir", cfg.WorkDir, "user", id.Name, "err", err)
			}
		}
	}
	log.Info("commands run as", "user", id.Name, "uid", id.UID, "gid", id.GID, "allow_root", us.AllowRoot)
	return us, nil
}
