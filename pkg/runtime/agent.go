package runtime

import (
	"debug/elf"
	"encoding/json"
	"os"
	"strconv"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Where the agent lives inside every sandbox, whatever the backend. The
// backend only chooses how the files get there (copied, a volume, a bind
// mount).
const (
	// AgentDir is the directory holding the agent and its token.
	AgentDir = "/.berth"
	// AgentFile is the agent binary's name in AgentDir.
	AgentFile = "sandbox-agent"
	// TokenFile is the token file's name in AgentDir.
	TokenFile = "token"
	// AgentPath is the agent binary (mode 0755 or 0555, owned by root).
	AgentPath = AgentDir + "/" + AgentFile
	// TokenPath is the token file (mode 0400, owned by root, so the
	// commands the agent runs as the lease's user cannot read it).
	TokenPath = AgentDir + "/" + TokenFile
	// AgentStateDir holds the agent's own state: what ConfigService.Configure
	// gave it (the env and secrets of the lease that claimed a pooled
	// sandbox), kept for a restart of the sandbox. Every backend mounts a
	// directory of the sandbox's own here, outside the image's file system
	// (Docker: an anonymous volume, without the image's content; containerd:
	// a bind mount of a host directory; Kubernetes: an emptyDir), so a
	// snapshot never captures it and a fork starts without it. The agent's
	// default --state-file is configure.json in it.
	AgentStateDir = "/var/lib/berth-agent"
	// DefaultWorkDir is the agent's working directory when the image sets none.
	DefaultWorkDir = "/workspace"
	// HealthPath is the agent's unauthenticated readiness endpoint
	// (GET, 200 when ready).
	HealthPath = "/healthz"
	// AgentEnvPrefix is the prefix of the environment variables reserved
	// for the agent; a Spec may not set them.
	AgentEnvPrefix = "BERTH_AGENT_"
	// AgentTokenEnv carries the agent's token when it is not in TokenPath;
	// the agent removes it from the environment of the commands it runs.
	AgentTokenEnv = AgentEnvPrefix + "TOKEN"
	// AgentSecretsEnv names, comma-separated, the variables of the
	// environment that are secrets (Spec.Secrets): the agent masks their
	// values in its output and removes this variable (not the secrets) from
	// the environment of the commands it runs.
	AgentSecretsEnv = AgentEnvPrefix + "SECRETS"
	// AgentAppKeyEnv carries the key of the sandbox's app (App.Key); the
	// agent removes it from its environment and gives it to the app only.
	AgentAppKeyEnv = AgentEnvPrefix + "APP_KEY"
)

// AgentCommand is how a backend starts the agent as a sandbox's PID 1.
type AgentCommand struct {
	// WorkDir is the working directory of the commands the agent runs.
	WorkDir string
	// KeepWorkDirOwner makes the agent give WorkDir to the default user
	// only when it creates it (--own-workdir=false): set for a directory
	// the lease chose (Spec.WorkDir), which may be a system one such as
	// /etc. Default false: a root-owned WorkDir (the backend's workspace,
	// the image's working directory) is given to the default user.
	KeepWorkDirOwner bool
	// User is the default user of those commands ("" for the agent's
	// default: root).
	User string
	// DenyRootUser makes the agent refuse commands as uid 0.
	DenyRootUser bool
	// TokenInEnv says the token comes in AgentTokenEnv (the backend sets
	// it) rather than in the file TokenPath.
	TokenInEnv bool
	// App is the app the agent runs as a supervised child (Spec.App); nil
	// for none.
	App *App
}

// Args returns the agent's command line: AgentPath listening on AgentPort
// (its own API) and EnvdPort (E2B's envd protocol) on every interface,
// with the working directory, the user, the root policy and the token
// file.
func (c AgentCommand) Args() []string {
	args := []string{AgentPath,
		"--listen", "0.0.0.0:" + strconv.Itoa(AgentPort),
		"--envd-listen", "0.0.0.0:" + strconv.Itoa(EnvdPort),
		"--workdir", c.WorkDir}
	if c.KeepWorkDirOwner {
		args = append(args, "--own-workdir=false")
	}
	if c.User != "" {
		args = append(args, "--user", c.User)
	}
	if c.DenyRootUser {
		args = append(args, "--allow-root=false")
	}
	if !c.TokenInEnv {
		args = append(args, "--token-file", TokenPath)
	}
	if c.App != nil && len(c.App.Command) > 0 {
		argv, _ := json.Marshal(c.App.Command) // strings always marshal
		args = append(args, "--app", string(argv), "--app-port", strconv.Itoa(c.App.Port))
		if c.App.WorkDir != "" {
			args = append(args, "--app-dir", c.App.WorkDir)
		}
	}
	return args
}

// CheckAgentBinary verifies that path (a backend's configured agent binary)
// is given and is a regular, non-empty, statically linked ELF file — images
// may have no libc at all — and returns its size. Errors are
// errdefs.ErrInvalidArgument naming agent_binary.
func CheckAgentBinary(path string) (int64, error) {
	if path == "" {
		return 0, errdefs.InvalidArgument("agent_binary", "the host path of the static sandbox-agent binary is required")
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, errdefs.InvalidArgument("agent_binary", "%v (build it with: CGO_ENABLED=0 go build -o %s ./cmd/sandbox-agent)", err, path)
	}
	if !st.Mode().IsRegular() || st.Size() == 0 {
		return 0, errdefs.InvalidArgument("agent_binary", "%s is not a regular non-empty file", path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return 0, errdefs.InvalidArgument("agent_binary", "%s is not an ELF executable: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return 0, errdefs.InvalidArgument("agent_binary", "%s is dynamically linked; images may have no libc, build it with CGO_ENABLED=0", path)
		}
	}
	return st.Size(), nil
}
