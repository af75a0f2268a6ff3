// Command sandbox-agent is berth's in-sandbox agent: a static binary that
// serves command, file and git endpoints over gRPC and JSON/REST on one port.
//
//	sandbox-agent [--listen ADDR] [--envd-listen ADDR] [--workdir DIR [--own-workdir=false]] [--user USER] [--allow-root=false] [--init] [--app JSON [--app-port N] [--app-dir DIR]] [-- ENTRYPOINT ARGS...]
//
// With --envd-listen the agent also serves E2B's envd protocol (package
// pkg/agent/envd) on that address.
// Commands run as --user (default: the agent's own user); a request may
// name another user when the agent runs as root, and --allow-root=false
// refuses uid 0.
// The bearer token comes from BERTH_AGENT_TOKEN (preferred: not visible in
// ps), --token-file or --token. As PID 1 (or with --init) the agent runs as a
// small supervisor that reaps orphans, forwards signals and runs the server
// (and the optional entrypoint after --) as children.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/internal/logx"
	"github.com/berth-dev/berth/internal/version"
	"github.com/berth-dev/berth/pkg/agent"
	"github.com/berth-dev/berth/pkg/agent/supervisor"
	"github.com/berth-dev/berth/pkg/runtime/containerd/shimlog"
)

func main() {
	// On a containerd host the same binary is each task's logging binary
	// (started by the task's shim, outside the sandbox).
	if ok, code := shimlog.Main(os.Args[1:]); ok {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("sandbox-agent", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7000", "address to serve gRPC and REST on")
	envdListen := fs.String("envd-listen", "", "address to serve E2B's envd protocol on (E2B's SDKs use port 49983; docs/agent.md); default: off")
	workDir := fs.String("workdir", "/workspace", "default working directory (created if missing)")
	ownWorkDir := fs.Bool("own-workdir", true, "give a root-owned --workdir to the default user; false: only one the agent creates")
	token := fs.String("token", "", "bearer token (prefer BERTH_AGENT_TOKEN or --token-file)")
	tokenFile := fs.String("token-file", "", "file holding the bearer token")
	noAuth := fs.Bool("no-auth", false, "serve without authentication (local development only)")
	initMode := fs.Bool("init", false, "run as init supervisor even when not PID 1 (child subreaper)")
	maxProcs := fs.Int("max-processes", 256, "maximum concurrently running commands")
	user := fs.String("user", "", "default user of commands and of files created through the agent: NAME, UID, NAME:GROUP or UID:GID (default: the agent's own user)")
	allowRoot := fs.Bool("allow-root", true, "allow commands to run as root (uid 0); false refuses them with PERMISSION_DENIED")
	stateFile := fs.String("state-file", agent.DefaultStateFile, "where the lease configuration given by the orchestrator (a warm pool's sandbox) is kept for restarts; empty: memory only")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	appJSON := fs.String("app", "", `an app to run as a supervised child, as the default user, and to forward the routes the agent does not serve to: its command line as a JSON array ("[\"/usr/local/bin/openhands-agent-server\"]"); its key comes from BERTH_AGENT_APP_KEY`)
	appPort := fs.Int("app-port", 8000, "the port the --app listens on")
	appDir := fs.String("app-dir", "", "the --app's working directory (default: --workdir)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Println(version.Version)
		return 0
	}
	log, err := logx.New(os.Stderr, *logLevel, *logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-agent:", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if (os.Getpid() == 1 || *initMode) && os.Getenv(supervisor.ChildEnv) == "" {
		stop() // the supervisor handles signals itself
		self, err := os.Executable()
		if err != nil {
			self = "/proc/self/exe"
		}
		serverArgs := args
		var entry []string
		for i, a := range args {
			if a == "--" {
				serverArgs, entry = args[:i], args[i+1:]
				break
			}
		}
		code, err := supervisor.Run(context.Background(), supervisor.Config{
			Server:     append([]string{self}, serverArgs...),
			Entrypoint: entry,
			Subreaper:  os.Getpid() != 1,
			Logger:     log.With("component", "supervisor"),
		})
		if err != nil {
			log.Error("supervisor failed", "err", err)
		}
		return code
	}

	tok, err := readToken(*token, *tokenFile)
	if err != nil {
		log.Error("cannot read token", "err", err)
		return 2
	}
	// Commands run by the agent must not inherit the token.
	_ = os.Unsetenv("BERTH_AGENT_TOKEN")
	appKey := os.Getenv(appKeyEnv)
	_ = os.Unsetenv(appKeyEnv)
	secrets := readSecrets()
	var appCfg *agent.AppConfig
	if *appJSON != "" {
		var argv []string
		if err := json.Unmarshal([]byte(*appJSON), &argv); err != nil || len(argv) == 0 {
			log.Error("--app: want a non-empty JSON array of strings", "app", *appJSON, "err", err)
			return 2
		}
		appCfg = &agent.AppConfig{Argv: argv, Port: *appPort, Dir: *appDir, Key: appKey}
	}
	_, statErr := os.Stat(*workDir)
	created := errors.Is(statErr, os.ErrNotExist)
	if err := os.MkdirAll(*workDir, 0o755); err != nil {
		log.Error("cannot create workdir", "workdir", *workDir, "err", err)
		return 1
	}
	srv, err := agent.New(agent.Config{Token: tok, NoAuth: *noAuth, WorkDir: *workDir, KeepWorkDirOwner: !*ownWorkDir && !created, MaxProcesses: *maxProcs,
		User: *user, DenyRoot: !*allowRoot, Secrets: secrets, StateFile: *stateFile, App: appCfg, Logger: log})
	if err != nil {
		log.Error("cannot start", "err", err)
		return 2
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("cannot listen", "addr", *listen, "err", err)
		return 1
	}
	envdDone := make(chan error, 1)
	if *envdListen != "" {
		eln, err := net.Listen("tcp", *envdListen)
		if err != nil {
			ln.Close()
			log.Error("cannot listen", "envd_addr", *envdListen, "err", err)
			return 1
		}
		go func() {
			err := srv.ServeEnvd(ctx, eln)
			if err != nil {
				log.Error("envd serve failed", "err", err)
			}
			envdDone <- err
		}()
	} else {
		envdDone <- nil
	}
	rc := 0
	if err := srv.Serve(ctx, ln); err != nil {
		log.Error("serve failed", "err", err)
		rc = 1
	}
	stop() // the envd listener ends with the main one
	if err := <-envdDone; err != nil {
		rc = 1
	}
	return rc
}

// secretsEnv names, comma-separated, the environment variables whose
// values are secrets the agent masks in its output
// (runtime.AgentSecretsEnv). The variables themselves stay in the
// commands' environment; the list does not.
const secretsEnv = "BERTH_AGENT_SECRETS"

// appKeyEnv carries the key of the --app (runtime.AgentAppKeyEnv); the
// agent removes it from its environment and gives it to the app only.
const appKeyEnv = "BERTH_AGENT_APP_KEY"

// readSecrets returns the secrets named by secretsEnv with their values
// from the environment, and removes secretsEnv from it.
func readSecrets() map[string]string {
	names := os.Getenv(secretsEnv)
	_ = os.Unsetenv(secretsEnv)
	secrets := make(map[string]string)
	for _, n := range strings.Split(names, ",") {
		if v, ok := os.LookupEnv(n); ok && n != "" {
			secrets[n] = v
		}
	}
	return secrets
}

// readToken picks the token from --token, --token-file or BERTH_AGENT_TOKEN.
func readToken(flagVal, file string) (string, error) {
	switch {
	case flagVal != "":
		return flagVal, nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(b)), nil
	default:
		return os.Getenv("BERTH_AGENT_TOKEN"), nil
	}
}
