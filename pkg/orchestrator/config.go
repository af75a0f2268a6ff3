package orchestrator

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Config is the orchestrator's configuration. Sources, later ones winning:
// built-in defaults, the JSON file named by --config (or BERTH_CONFIG),
// BERTH_* environment variables, command-line flags.
type Config struct {
	// Listen is the address of the single listener. Default "127.0.0.1:7070".
	Listen string `json:"listen"`
	// DataDir holds the lease store (leases.db), the server secret and the
	// instance id. Default "$HOME/.local/share/berth".
	DataDir string `json:"dataDir"`
	// Runtime selects the container backend: "docker" or "containerd".
	// Default "docker".
	Runtime string `json:"runtime"`
	// ContainerdAddress is containerd's socket. Default: auto-detected
	// (/run/containerd/containerd.sock, else Docker's own containerd at
	// /var/run/docker/containerd/containerd.sock).
	ContainerdAddress string `json:"containerdAddress"`
	// ContainerdNamespace is the containerd namespace of sandboxes and
	// imported images. Default "berth".
	ContainerdNamespace string `json:"containerdNamespace"`
	// ContainerdStateDir holds per-sandbox host state (agent bind mount,
	// token). Default "/var/lib/berth/containerd".
	ContainerdStateDir string `json:"containerdStateDir"`
	// CNIBinDir is where the CNI plugins are. Default: /usr/lib/cni, then
	// /opt/cni/bin (Debian's containernetworking-plugins).
	CNIBinDir string `json:"cniBinDir"`
	// SandboxSubnet is the containerd sandboxes' subnet. Default "10.213.0.0/16".
	SandboxSubnet string `json:"sandboxSubnet"`
	// SandboxBridge is the containerd sandboxes' bridge. Default "berth-ctrd0".
	SandboxBridge string `json:"sandboxBridge"`
	// UserNamespaces runs containerd sandboxes in user namespaces: their
	// root is host uid UserNSBase, their uids 0-65535 the host's
	// UserNSBase… (containerd only). Default false.
	UserNamespaces bool `json:"userNamespaces"`
	// UserNSBase is the first host uid/gid of that range. Default 2^30.
	UserNSBase uint32 `json:"userNSBase"`
	// AgentBinary is the static sandbox-agent injected into sandboxes.
	// Default: "sandbox-agent" next to the orchestrator's executable.
	AgentBinary string `json:"agentBinary"`
	// PreviewDomain is the host suffix of preview URLs
	// ({port}-{lease}.{domain}); browsers resolve *.localhost to loopback.
	// Default "sandbox.localhost"; empty disables host routing.
	PreviewDomain string `json:"previewDomain"`
	// Network is the Docker bridge network for sandboxes. Default "berth".
	Network string `json:"network"`
	// AgentInjection is how the agent enters a sandbox: "volume" (copied
	// once per agent version into a read-only named volume mounted at
	// /.berth; the token in the container's environment, which the agent
	// clears for its commands; default, for the faster cold acquire) or
	// "copy" (copied into each container before start, token in a file;
	// about 60-150 ms slower per acquire). Either way the copy goes through
	// the engine's API, so the engine need not share our filesystem.
	AgentInjection string `json:"agentInjection"`
	// DefaultImage is used when an acquire names none. Default "berth/base".
	DefaultImage string `json:"defaultImage"`
	// DefaultTTL is a lease's lifetime when the acquire gives none. Default 10m.
	DefaultTTL Duration `json:"defaultTTL"`
	// MaxTTL bounds requested lifetimes. Default 24h.
	MaxTTL Duration `json:"maxTTL"`
	// DefaultIdleTimeout expires idle leases; 0 disables. Default 0.
	DefaultIdleTimeout Duration `json:"defaultIdleTimeout"`
	// MaxLeases bounds live leases; more acquires get RESOURCE_EXHAUSTED
	// (HTTP 429). Default 100.
	MaxLeases int `json:"maxLeases"`
	// Retention is how long ended lease records are kept. Default 1h.
	Retention Duration `json:"retention"`
	// RestartLimit is how many times a sandbox whose container exited
	// unexpectedly (agent crash, kill from outside, engine restart) is
	// restarted in place, files kept, within RestartWindow; one more exit
	// fails its lease. 0 or negative: never (the first exit fails it).
	// Default 3.
	RestartLimit int `json:"restartLimit"`
	// RestartWindow is the sliding window RestartLimit counts in. Default 10m.
	RestartWindow Duration `json:"restartWindow"`
	// DefaultCPUs is the per-sandbox CPU limit. Default 1.
	DefaultCPUs float64 `json:"defaultCPUs"`
	// DefaultMemoryBytes is the per-sandbox memory limit (no swap). Default 512 MiB.
	DefaultMemoryBytes int64 `json:"defaultMemoryBytes"`
	// DefaultPids is the per-sandbox process limit. Default 512.
	DefaultPids int64 `json:"defaultPids"`
	// DefaultDiskBytes is the per-sandbox disk limit (writable layer and
	// volumes) of an acquire that sets no resources.diskBytes; 0 means no
	// limit. Enforced by the engine where its storage driver can bound a
	// container's size, else by berth (see DiskInterval, DiskGrace).
	// Default 10 GiB.
	DefaultDiskBytes int64 `json:"defaultDiskBytes"`
	// DiskInterval is the base interval between two measurements of a
	// sandbox's disk usage (adapted per lease: more often near the limit,
	// less when far below it and unchanged). Default 15s.
	DiskInterval Duration `json:"diskInterval"`
	// DiskGrace is how long a sandbox may stay over its disk limit (warned,
	// uploads refused) before berth stops it and fails its lease, keeping
	// the stopped container until Retention passes. Default 30s.
	DiskGrace Duration `json:"diskGrace"`
	// MaxCPUs bounds an acquire's resources.cpus. Default 4.
	MaxCPUs float64 `json:"maxCPUs"`
	// MaxMemoryBytes bounds an acquire's resources.memoryBytes. Default 8 GiB.
	MaxMemoryBytes int64 `json:"maxMemoryBytes"`
	// MaxPids bounds an acquire's resources.pids. Default 4096.
	MaxPids int64 `json:"maxPids"`
	// MaxDiskBytes bounds an acquire's resources.diskBytes. Default 100 GiB.
	MaxDiskBytes int64 `json:"maxDiskBytes"`
	// MaxEnvBytes bounds the total size of an acquire's env (every
	// KEY=VALUE plus one byte). Default 64 KiB.
	MaxEnvBytes int `json:"maxEnvBytes"`
	// MaxLabels bounds the labels of an acquire (keys at most 128 bytes,
	// values at most 256). Default 64.
	MaxLabels int `json:"maxLabels"`
	// MaxPublicPorts bounds an acquire's publicPorts. Default 16.
	MaxPublicPorts int `json:"maxPublicPorts"`
	// AllowedImages are the images an acquire may name (the default image is
	// always allowed): "*" allows every local image, an entry ending in "/"
	// every repository under it ("berth/"), another entry that repository
	// with any tag or digest. Other images are PERMISSION_DENIED naming
	// image. Default ["berth/"] (the images berth builds).
	AllowedImages []string `json:"allowedImages"`
	// DefaultUser is the user commands run as (and that owns files created
	// through the agent) in sandboxes of DefaultUserImages when an acquire
	// names no user; sandboxes of other images run commands as the image's
	// own user. "" runs every image's commands as its own user. The agent
	// itself always runs as root. Default "sandbox" (uid 1000 in berth's
	// images).
	DefaultUser string `json:"defaultUser"`
	// DefaultUserImages are the image prefixes DefaultUser applies to ("*"
	// for all). Default ["berth/"].
	DefaultUserImages []string `json:"defaultUserImages"`
	// AllowRootUser lets acquires and commands choose root (uid 0). With
	// false an acquire naming root is PERMISSION_DENIED and the agent
	// refuses commands as uid 0. Default true: with no-new-privileges a
	// non-root user cannot sudo, so root is how a sandbox installs
	// packages.
	AllowRootUser bool `json:"allowRootUser"`
	// HostInput is how the Docker backend keeps sandboxes away from the
	// host's listeners: "auto" (iptables INPUT rules when it can, else a
	// warning), "required" or "off". The containerd backend always installs
	// them. Default "auto".
	HostInput string `json:"hostInput"`
	// MaxLeasesPerOwner bounds one owner's live leases; more acquires get
	// RESOURCE_EXHAUSTED (HTTP 429 with Retry-After). The operator's own
	// acquires are exempt (MaxLeases still applies). Default 20.
	MaxLeasesPerOwner int `json:"maxLeasesPerOwner"`
	// MaxEndedPerOwner bounds the ended lease records kept per owner; older
	// ones are purged before Retention passes. Default 100.
	MaxEndedPerOwner int `json:"maxEndedPerOwner"`
	// MaxWatchesPerPrincipal bounds the concurrent watch streams of one
	// caller (the operator, one client owner, or one lease token); more get
	// RESOURCE_EXHAUSTED. Default 8.
	MaxWatchesPerPrincipal int `json:"maxWatchesPerPrincipal"`
	// MaxConnections bounds the listener's open connections (gRPC and
	// HTTP together); more wait in the kernel's accept queue. Default 1024.
	MaxConnections int `json:"maxConnections"`
	// ReadHeaderTimeout bounds how long an HTTP client may take to send a
	// request's headers. Default 10s.
	ReadHeaderTimeout Duration `json:"readHeaderTimeout"`
	// IdleTimeout closes HTTP keep-alive connections idle this long, and
	// gRPC connections with no call for this long. Default 2m.
	IdleTimeout Duration `json:"idleTimeout"`
	// OperatorToken opens every call and every lease (env BERTH_OPERATOR_TOKEN).
	// Empty disables operator access.
	OperatorToken string `json:"-"`
	// Clients maps client tokens to owners; a client sees only its own
	// leases. From the file ("clients": [{"owner": "o", "token": "t"}]) or
	// BERTH_CLIENT_TOKENS="owner:token,owner2:token2".
	Clients []Client `json:"clients"`
	// LogLevel is debug, info, warn or error. Default "info".
	LogLevel string `json:"logLevel"`
	// LogFormat is text or json. Default "text".
	LogFormat string `json:"logFormat"`
}

// Client is one API client: a token bound to an owner.
type Client struct {
	Owner string `json:"owner"`
	Token string `json:"token"`
}

// Duration is a time.Duration that reads "10m" from JSON.
type Duration time.Duration

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string like \"10m\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Defaults returns the built-in configuration.
func Defaults() Config {
	home, _ := os.UserHomeDir()
	agent := "sandbox-agent"
	if exe, err := os.Executable(); err == nil {
		agent = filepath.Join(filepath.Dir(exe), "sandbox-agent")
	}
	return Config{
		Listen:                 "127.0.0.1:7070",
		DataDir:                filepath.Join(home, ".local", "share", "berth"),
		Runtime:                "docker",
		AgentBinary:            agent,
		Network:                "berth",
		PreviewDomain:          "sandbox.localhost",
		AgentInjection:         "volume",
		DefaultImage:           "berth/base",
		DefaultTTL:             Duration(10 * time.Minute),
		MaxTTL:                 Duration(24 * time.Hour),
		MaxLeases:              100,
		Retention:              Duration(time.Hour),
		RestartLimit:           3,
		RestartWindow:          Duration(10 * time.Minute),
		DefaultCPUs:            1,
		DefaultMemoryBytes:     512 << 20,
		DefaultPids:            512,
		DefaultDiskBytes:       10 << 30,
		DiskInterval:           Duration(15 * time.Second),
		DiskGrace:              Duration(30 * time.Second),
		MaxCPUs:                4,
		MaxMemoryBytes:         8 << 30,
		MaxPids:                4096,
		MaxDiskBytes:           100 << 30,
		MaxEnvBytes:            64 << 10,
		MaxLabels:              64,
		MaxPublicPorts:         16,
		AllowedImages:          []string{"berth/"},
		DefaultUser:            "sandbox",
		DefaultUserImages:      []string{"berth/"},
		AllowRootUser:          true,
		HostInput:              "auto",
		MaxLeasesPerOwner:      20,
		MaxEndedPerOwner:       100,
		MaxWatchesPerPrincipal: 8,
		MaxConnections:         1024,
		ReadHeaderTimeout:      Duration(10 * time.Second),
		IdleTimeout:            Duration(2 * time.Minute),
		LogLevel:               "info",
		LogFormat:              "text",
	}
}

// LoadConfig builds the configuration from defaults, the optional file,
// the environment (getenv) and args (flags of `orchestrator serve`).
func LoadConfig(args []string, getenv func(string) string) (Config, error) {
	cfg := Defaults()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	file := fs.String("config", getenv("BERTH_CONFIG"), "JSON config file (env BERTH_CONFIG)")
	listen := fs.String("listen", "", "listen address (env BERTH_LISTEN; default 127.0.0.1:7070)")
	dataDir := fs.String("data-dir", "", "data directory (env BERTH_DATA_DIR)")
	rt := fs.String("runtime", "", "container runtime: docker or containerd (env BERTH_RUNTIME)")
	ctrdAddr := fs.String("containerd-address", "", "containerd socket (env BERTH_CONTAINERD_ADDRESS; default auto)")
	ctrdNS := fs.String("containerd-namespace", "", "containerd namespace (env BERTH_CONTAINERD_NAMESPACE; default berth)")
	agentBin := fs.String("agent-binary", "", "sandbox-agent to inject (env BERTH_AGENT_BINARY)")
	injection := fs.String("agent-injection", "", "volume or copy (env BERTH_AGENT_INJECTION; default volume)")
	domain := fs.String("preview-domain", "", "preview host suffix (env BERTH_PREVIEW_DOMAIN; default sandbox.localhost)")
	image := fs.String("default-image", "", "default image (env BERTH_DEFAULT_IMAGE)")
	maxLeases := fs.Int("max-leases", 0, "maximum live leases (env BERTH_MAX_LEASES)")
	ttl := fs.Duration("default-ttl", 0, "default lease TTL (env BERTH_DEFAULT_TTL)")
	idle := fs.Duration("default-idle-timeout", 0, "default idle timeout (env BERTH_DEFAULT_IDLE_TIMEOUT)")
	restartLimit := fs.Int("restart-limit", 0, "in-place restarts of an exited sandbox within the restart window, -1 for none (env BERTH_RESTART_LIMIT; default 3)")
	restartWindow := fs.Duration("restart-window", 0, "window the restart limit counts in (env BERTH_RESTART_WINDOW; default 10m)")
	maxPerOwner := fs.Int("max-leases-per-owner", 0, "maximum live leases of one owner (env BERTH_MAX_LEASES_PER_OWNER; default 20)")
	maxCPUs := fs.Float64("max-cpus", 0, "maximum resources.cpus of an acquire (env BERTH_MAX_CPUS; default 4)")
	maxMem := fs.Int64("max-memory-bytes", 0, "maximum resources.memoryBytes (env BERTH_MAX_MEMORY_BYTES; default 8 GiB)")
	maxPids := fs.Int64("max-pids", 0, "maximum resources.pids (env BERTH_MAX_PIDS; default 4096)")
	maxDisk := fs.Int64("max-disk-bytes", 0, "maximum resources.diskBytes (env BERTH_MAX_DISK_BYTES; default 100 GiB)")
	maxEnv := fs.Int("max-env-bytes", 0, "maximum total env size of an acquire (env BERTH_MAX_ENV_BYTES; default 65536)")
	maxLabels := fs.Int("max-labels", 0, "maximum labels of an acquire (env BERTH_MAX_LABELS; default 64)")
	maxPorts := fs.Int("max-public-ports", 0, "maximum public ports of an acquire (env BERTH_MAX_PUBLIC_PORTS; default 16)")
	maxEnded := fs.Int("max-ended-per-owner", 0, "ended lease records kept per owner (env BERTH_MAX_ENDED_PER_OWNER; default 100)")
	maxWatches := fs.Int("max-watches-per-principal", 0, "concurrent watch streams per caller (env BERTH_MAX_WATCHES_PER_PRINCIPAL; default 8)")
	maxConns := fs.Int("max-connections", 0, "maximum open connections (env BERTH_MAX_CONNECTIONS; default 1024)")
	allowed := fs.String("allowed-images", "", "comma-separated image prefixes acquires may use, * for all (env BERTH_ALLOWED_IMAGES; default berth/)")
	defDisk := fs.Int64("default-disk-bytes", -1, "disk limit of a sandbox whose acquire sets none, 0 for none (env BERTH_DEFAULT_DISK_BYTES; default 10 GiB)")
	diskInterval := fs.Duration("disk-interval", 0, "base interval of disk usage measurements (env BERTH_DISK_INTERVAL; default 15s)")
	diskGrace := fs.Duration("disk-grace", 0, "time over the disk limit before the sandbox is stopped (env BERTH_DISK_GRACE; default 30s)")
	defUser := fs.String("default-user", "", "user of commands in sandboxes of berth's images when an acquire names none; 'image' for each image's own (env BERTH_DEFAULT_USER; default sandbox)")
	allowRoot := fs.String("allow-root-user", "", "true or false: whether acquires and commands may run as root (env BERTH_ALLOW_ROOT_USER; default true)")
	userns := fs.Bool("userns", false, "containerd: run sandboxes in user namespaces, root mapped to an unprivileged host uid (env BERTH_USERNS=1)")
	hostInput := fs.String("host-input", "", "docker backend: auto, required or off: drop sandbox traffic to the host's own addresses (env BERTH_HOST_INPUT; default auto)")
	logLevel := fs.String("log-level", "", "log level (env BERTH_LOG_LEVEL)")
	logFormat := fs.String("log-format", "", "log format text|json (env BERTH_LOG_FORMAT)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	if *file != "" {
		b, err := os.ReadFile(*file)
		if err != nil {
			return cfg, fmt.Errorf("config file: %w", err)
		}
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return cfg, fmt.Errorf("config file %s: %w", *file, err)
		}
	}
	var errs []error
	str := func(dst *string, env, flagVal string) {
		if v := getenv(env); v != "" {
			*dst = v
		}
		if flagVal != "" {
			*dst = flagVal
		}
	}
	dur := func(dst *Duration, env string, flagVal time.Duration) {
		if v := getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
			*dst = Duration(d)
		}
		if flagVal != 0 {
			*dst = Duration(flagVal)
		}
	}
	str(&cfg.Listen, "BERTH_LISTEN", *listen)
	str(&cfg.DataDir, "BERTH_DATA_DIR", *dataDir)
	str(&cfg.Runtime, "BERTH_RUNTIME", *rt)
	str(&cfg.ContainerdAddress, "BERTH_CONTAINERD_ADDRESS", *ctrdAddr)
	str(&cfg.ContainerdNamespace, "BERTH_CONTAINERD_NAMESPACE", *ctrdNS)
	str(&cfg.ContainerdStateDir, "BERTH_CONTAINERD_STATE_DIR", "")
	str(&cfg.CNIBinDir, "BERTH_CNI_BIN_DIR", "")
	str(&cfg.SandboxSubnet, "BERTH_SANDBOX_SUBNET", "")
	str(&cfg.SandboxBridge, "BERTH_SANDBOX_BRIDGE", "")
	str(&cfg.AgentBinary, "BERTH_AGENT_BINARY", *agentBin)
	str(&cfg.AgentInjection, "BERTH_AGENT_INJECTION", *injection)
	str(&cfg.DefaultImage, "BERTH_DEFAULT_IMAGE", *image)
	str(&cfg.PreviewDomain, "BERTH_PREVIEW_DOMAIN", *domain)
	str(&cfg.LogLevel, "BERTH_LOG_LEVEL", *logLevel)
	str(&cfg.LogFormat, "BERTH_LOG_FORMAT", *logFormat)
	dur(&cfg.DefaultTTL, "BERTH_DEFAULT_TTL", *ttl)
	dur(&cfg.DefaultIdleTimeout, "BERTH_DEFAULT_IDLE_TIMEOUT", *idle)
	if v := getenv("BERTH_MAX_LEASES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("BERTH_MAX_LEASES: %w", err))
		}
		cfg.MaxLeases = n
	}
	if *maxLeases != 0 {
		cfg.MaxLeases = *maxLeases
	}
	intVar := func(dst *int, env string, flagVal int) {
		if v := getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
			*dst = n
		}
		if flagVal != 0 {
			*dst = flagVal
		}
	}
	int64Var := func(dst *int64, env string, flagVal int64) {
		if v := getenv(env); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
			*dst = n
		}
		if flagVal != 0 {
			*dst = flagVal
		}
	}
	intVar(&cfg.MaxLeasesPerOwner, "BERTH_MAX_LEASES_PER_OWNER", *maxPerOwner)
	intVar(&cfg.MaxEnvBytes, "BERTH_MAX_ENV_BYTES", *maxEnv)
	intVar(&cfg.MaxLabels, "BERTH_MAX_LABELS", *maxLabels)
	intVar(&cfg.MaxPublicPorts, "BERTH_MAX_PUBLIC_PORTS", *maxPorts)
	intVar(&cfg.MaxEndedPerOwner, "BERTH_MAX_ENDED_PER_OWNER", *maxEnded)
	intVar(&cfg.MaxWatchesPerPrincipal, "BERTH_MAX_WATCHES_PER_PRINCIPAL", *maxWatches)
	intVar(&cfg.MaxConnections, "BERTH_MAX_CONNECTIONS", *maxConns)
	intVar(&cfg.RestartLimit, "BERTH_RESTART_LIMIT", *restartLimit)
	dur(&cfg.RestartWindow, "BERTH_RESTART_WINDOW", *restartWindow)
	int64Var(&cfg.MaxMemoryBytes, "BERTH_MAX_MEMORY_BYTES", *maxMem)
	int64Var(&cfg.MaxPids, "BERTH_MAX_PIDS", *maxPids)
	int64Var(&cfg.DefaultDiskBytes, "BERTH_DEFAULT_DISK_BYTES", 0)
	if *defDisk >= 0 { // 0 is a value here: no limit
		cfg.DefaultDiskBytes = *defDisk
	}
	dur(&cfg.DiskInterval, "BERTH_DISK_INTERVAL", *diskInterval)
	dur(&cfg.DiskGrace, "BERTH_DISK_GRACE", *diskGrace)
	int64Var(&cfg.MaxDiskBytes, "BERTH_MAX_DISK_BYTES", *maxDisk)
	if v := getenv("BERTH_MAX_CPUS"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("BERTH_MAX_CPUS: %w", err))
		}
		cfg.MaxCPUs = f
	}
	if *maxCPUs != 0 {
		cfg.MaxCPUs = *maxCPUs
	}
	imgs := getenv("BERTH_ALLOWED_IMAGES")
	if *allowed != "" {
		imgs = *allowed
	}
	if imgs != "" {
		cfg.AllowedImages = nil
		for _, p := range strings.Split(imgs, ",") {
			if p = strings.TrimSpace(p); p != "" {
				cfg.AllowedImages = append(cfg.AllowedImages, p)
			}
		}
	}
	str(&cfg.DefaultUser, "BERTH_DEFAULT_USER", *defUser)
	if cfg.DefaultUser == "image" {
		cfg.DefaultUser = ""
	}
	str(&cfg.HostInput, "BERTH_HOST_INPUT", *hostInput)
	if v := getenv("BERTH_USERNS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("BERTH_USERNS: %w", err))
		}
		cfg.UserNamespaces = b
	}
	if *userns {
		cfg.UserNamespaces = true
	}
	if v := getenv("BERTH_USERNS_BASE"); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			errs = append(errs, fmt.Errorf("BERTH_USERNS_BASE: %w", err))
		}
		cfg.UserNSBase = uint32(n)
	}
	rootVal := getenv("BERTH_ALLOW_ROOT_USER")
	if *allowRoot != "" {
		rootVal = *allowRoot
	}
	if rootVal != "" {
		b, err := strconv.ParseBool(rootVal)
		if err != nil {
			errs = append(errs, fmt.Errorf("allow-root-user: %w", err))
		}
		cfg.AllowRootUser = b
	}
	cfg.OperatorToken = getenv("BERTH_OPERATOR_TOKEN")
	if v := getenv("BERTH_CLIENT_TOKENS"); v != "" {
		for _, pair := range strings.Split(v, ",") {
			owner, tok, ok := strings.Cut(strings.TrimSpace(pair), ":")
			if !ok || owner == "" || tok == "" {
				errs = append(errs, errors.New("BERTH_CLIENT_TOKENS: want owner:token[,owner:token]"))
				continue
			}
			cfg.Clients = append(cfg.Clients, Client{Owner: owner, Token: tok})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// restartLimit maps Config.RestartLimit to lease.Config.RestartLimit,
// where 0 means the default: here 0 means no restarts.
func restartLimit(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// Validate checks the configuration for values that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Runtime != "docker" && c.Runtime != "containerd":
		return fmt.Errorf("runtime %q is not supported (supported: docker, containerd)", c.Runtime)
	case c.Runtime == "docker" && c.AgentInjection != "copy" && c.AgentInjection != "volume":
		return fmt.Errorf("agent injection must be copy or volume, got %q", c.AgentInjection)
	case c.MaxLeases <= 0:
		return fmt.Errorf("max leases must be positive, got %d", c.MaxLeases)
	case c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL:
		return fmt.Errorf("default ttl must be positive and at most max ttl")
	case c.DataDir == "":
		return errors.New("data dir must be set")
	case math.IsNaN(c.MaxCPUs) || math.IsInf(c.MaxCPUs, 0) || c.MaxCPUs <= 0 || c.MaxCPUs > 1e6:
		return fmt.Errorf("max cpus must be a positive number (at most 1e6), got %v", c.MaxCPUs)
	case c.MaxMemoryBytes <= 0 || c.MaxPids <= 0 || c.MaxDiskBytes <= 0:
		return errors.New("max memory bytes, max pids and max disk bytes must be positive")
	case c.DefaultCPUs > c.MaxCPUs || c.DefaultMemoryBytes > c.MaxMemoryBytes || c.DefaultPids > c.MaxPids || c.DefaultDiskBytes > c.MaxDiskBytes:
		return errors.New("default cpus, memory bytes, pids and disk bytes must not exceed their maximums")
	case c.DefaultDiskBytes < 0 || (c.DefaultDiskBytes > 0 && c.DefaultDiskBytes < 1<<20) || c.DefaultDiskBytes > c.MaxDiskBytes:
		return fmt.Errorf("default disk bytes must be 0 (no limit) or between 1 MiB and max disk bytes (%d), got %d", c.MaxDiskBytes, c.DefaultDiskBytes)
	case c.DiskInterval <= 0 || c.DiskGrace <= 0:
		return errors.New("disk interval and disk grace must be positive")
	case c.MaxEnvBytes <= 0 || c.MaxLabels <= 0 || c.MaxPublicPorts <= 0:
		return errors.New("max env bytes, max labels and max public ports must be positive")
	case c.MaxLeasesPerOwner <= 0 || c.MaxEndedPerOwner <= 0 || c.MaxWatchesPerPrincipal <= 0 || c.MaxConnections <= 0:
		return errors.New("max leases per owner, max ended per owner, max watches per principal and max connections must be positive")
	case c.RestartWindow <= 0:
		return errors.New("restart window must be positive")
	case c.ReadHeaderTimeout <= 0 || c.IdleTimeout <= 0:
		return errors.New("read header timeout and idle timeout must be positive")
	}
	seen := map[string]bool{}
	for _, cl := range c.Clients {
		if cl.Owner == "" || len(cl.Token) < 16 {
			return fmt.Errorf("client %q: owner required and token at least 16 characters", cl.Owner)
		}
		if seen[cl.Token] || cl.Token == c.OperatorToken {
			return fmt.Errorf("client %q: token reused", cl.Owner)
		}
		seen[cl.Token] = true
	}
	return nil
}
