package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	ctd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	gocni "github.com/containerd/go-cni"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultAddress is the socket of a stand-alone containerd (the
	// containerd package's systemd unit).
	DefaultAddress = "/run/containerd/containerd.sock"
	// DockerAddress is the socket of the containerd that the Docker Engine
	// starts for itself when no stand-alone one runs (Debian's docker.io
	// 20.10). New uses it when DefaultAddress does not exist.
	DockerAddress = "/var/run/docker/containerd/containerd.sock"
	// DefaultNamespace is the containerd namespace berth's images and
	// containers live in.
	DefaultNamespace = "berth"
	// DefaultSnapshotter is the snapshotter images are unpacked with.
	DefaultSnapshotter = "overlayfs"
	// DefaultRuntimeName is the containerd runtime (shim) of every task.
	DefaultRuntimeName = "io.containerd.runc.v2"
	// DefaultStateDir holds the per-sandbox host files (token, hosts,
	// resolv.conf, log) and one copy of the agent per version.
	DefaultStateDir = "/var/lib/berth/containerd"
	// DefaultNetnsDir is where the per-sandbox network namespaces are
	// bind-mounted (the directory `ip netns` uses, so `ip netns` lists them).
	DefaultNetnsDir = "/var/run/netns"
	// DefaultNetworkName is the CNI network name (host-local IPAM keeps its
	// allocations in /var/lib/cni/networks/NAME).
	DefaultNetworkName = "berth-ctrd"
	// DefaultBridge is the Linux bridge sandboxes are attached to.
	DefaultBridge = "berth-ctrd0"
	// DefaultSubnet is the sandbox subnet; the bridge takes its first
	// address. It must not overlap Docker's (172.17.0.0/16, and the berth
	// network, typically 172.18.0.0/16) or any other route of the host.
	DefaultSubnet = "10.213.0.0/16"
)

// DefaultCNIBinDirs are searched for the CNI plugins (bridge, host-local):
// Debian's containernetworking-plugins package installs them in
// /usr/lib/cni, upstream releases in /opt/cni/bin.
var DefaultCNIBinDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// cleanupTimeout bounds cleanup that runs even when the caller's context is
// done (runtime.CleanupTimeout), and the wait for a task to exit after
// SIGKILL.
const cleanupTimeout = runtime.CleanupTimeout

// Config configures a containerd Runtime. Zero fields take the defaults
// stated.
type Config struct {
	// AgentBinary is the host path of the static sandbox-agent binary.
	// Required. It must be statically linked (CGO_ENABLED=0) since images
	// may have no libc at all. It is copied once per version into StateDir
	// and bind-mounted read-only into every sandbox.
	AgentBinary string
	// Address is containerd's gRPC socket. Default: DefaultAddress
	// (/run/containerd/containerd.sock) when it exists, else DockerAddress
	// (/var/run/docker/containerd/containerd.sock, the containerd the Docker
	// Engine runs), else DefaultAddress.
	Address string
	// Namespace is the containerd namespace of berth's images and
	// containers. Default "berth".
	Namespace string
	// Snapshotter unpacks images and holds the sandboxes' root filesystems.
	// Default "overlayfs".
	Snapshotter string
	// RuntimeName is the containerd runtime of the tasks. Default
	// "io.containerd.runc.v2".
	RuntimeName string
	// StateDir holds per-sandbox host files under sandboxes/ID and the
	// agent copies under agents/. Created with mode 0700. Default
	// "/var/lib/berth/containerd".
	StateDir string
	// NetnsDir is where sandbox network namespaces are bind-mounted, one
	// file per sandbox named after its container id. Default
	// "/var/run/netns".
	NetnsDir string
	// CNIBinDirs are searched for the CNI plugins. Default
	// ["/usr/lib/cni", "/opt/cni/bin"].
	CNIBinDirs []string
	// CNICacheDir is libcni's cache directory (results/) and the parent of
	// host-local's allocations (networks/NAME). Default "/var/lib/cni".
	CNICacheDir string
	// NetworkName is the CNI network name. Default "berth-ctrd".
	NetworkName string
	// Bridge is the Linux bridge of the sandbox network (at most 15
	// characters). Default "berth-ctrd0".
	Bridge string
	// Subnet is the sandbox subnet in CIDR form. Default "10.213.0.0/16".
	Subnet string
	// InstanceID identifies this orchestrator; it becomes the instance label
	// of sandboxes whose Spec leaves InstanceID empty. Default "".
	InstanceID string
	// DefaultResources apply to zero fields of Spec.Resources. Its zero
	// fields take runtime.DefaultResources(): 1 CPU, 512 MiB memory without
	// swap, 512 pids, no disk limit.
	DefaultResources runtime.Resources
	// Output bounds each sandbox's output kept on the host (rotated
	// files); zero fields take runtime.OutputLimit's defaults.
	Output runtime.OutputLimit
	// ReadyTimeout applies when Spec.ReadyTimeout is zero. Default
	// runtime.DefaultReadyTimeout (30s).
	ReadyTimeout time.Duration
	// UserNamespaces runs every sandbox in a user namespace: the sandbox's
	// uids 0-65535 are the host's UserNSBase…UserNSBase+65535, so its root
	// (the agent) is an unprivileged uid on the host. The image's files are
	// chowned into that range once per image (a remapped snapshot, kept as
	// the parent of later sandboxes' snapshots). Default false.
	UserNamespaces bool
	// UserNSBase is the first host uid and gid of the sandboxes' range with
	// UserNamespaces (at least 65536, so it never overlaps the host's own
	// users; the range is shared by all sandboxes, which are isolated from
	// each other by their other namespaces). Default DefaultUserNSBase.
	UserNSBase uint32
	// Logger receives the backend's logs (keys container_id, lease_id,
	// image). Default slog.Default().
	Logger *slog.Logger
	// Client is the containerd client. Default: one connected to Address;
	// Close closes it. A given client is left open by Close.
	Client *ctd.Client
}

// Runtime is the containerd backend. It is safe for concurrent use.
type Runtime struct {
	cfg       Config
	cli       *ctd.Client
	ownClient bool
	log       *slog.Logger
	health    runtime.HealthProber
	cni       gocni.CNI
	subnet    *net.IPNet
	gateway   net.IP

	hostMu    sync.Mutex
	hostReady bool   // ensureHost succeeded
	agentCopy string // the agent under StateDir/agents/SUM/

	imgMu    sync.Mutex
	imgInfos map[string]imageInfo // by manifest digest
	unpackMu keyedMutex           // by manifest digest
	createMu keyedMutex           // by container id

	lastWords runtime.LastWords // output of removed containers that had exited (logs.go)
}

// Runtime is a runtime.Freezer: Pause and Resume use the cgroup freezer.
var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Freezer = (*Runtime)(nil)
)

// New returns a containerd backend. It checks the configuration and that the
// agent binary exists and is statically linked. It does not contact
// containerd (use Ping) and prepares the host (state directory, agent copy,
// firewall rules) on the first Create.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	_ = ctx
	if _, err := runtime.CheckAgentBinary(cfg.AgentBinary); err != nil {
		return nil, err
	}
	if cfg.Address == "" {
		cfg.Address = defaultAddress()
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if err := namespaceValid(cfg.Namespace); err != nil {
		return nil, err
	}
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = DefaultSnapshotter
	}
	if cfg.UserNamespaces {
		if cfg.UserNSBase == 0 {
			cfg.UserNSBase = DefaultUserNSBase
		}
		if cfg.UserNSBase < userNSSize || cfg.UserNSBase > 1<<31 {
			return nil, errdefs.InvalidArgument("userns_base", "%d: want at least %d (above the host's own users) and below 2^31", cfg.UserNSBase, userNSSize)
		}
	}
	if cfg.RuntimeName == "" {
		cfg.RuntimeName = DefaultRuntimeName
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.NetnsDir == "" {
		cfg.NetnsDir = DefaultNetnsDir
	}
	if !filepath.IsAbs(cfg.StateDir) || !filepath.IsAbs(cfg.NetnsDir) {
		return nil, errdefs.InvalidArgument("state_dir", "state and netns directories must be absolute paths, got %q and %q", cfg.StateDir, cfg.NetnsDir)
	}
	if len(cfg.CNIBinDirs) == 0 {
		cfg.CNIBinDirs = append([]string(nil), DefaultCNIBinDirs...)
	}
	if cfg.CNICacheDir == "" {
		cfg.CNICacheDir = "/var/lib/cni"
	}
	if cfg.NetworkName == "" {
		cfg.NetworkName = DefaultNetworkName
	}
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if len(cfg.Bridge) > 15 || strings.ContainsAny(cfg.Bridge, "/ \t\n") {
		return nil, errdefs.InvalidArgument("bridge", "%q is not a valid interface name (at most 15 characters)", cfg.Bridge)
	}
	if cfg.Subnet == "" {
		cfg.Subnet = DefaultSubnet
	}
	ip, subnet, err := net.ParseCIDR(cfg.Subnet)
	if err != nil || ip.To4() == nil || !ip.Equal(subnet.IP) {
		return nil, errdefs.InvalidArgument("subnet", "%q is not an IPv4 network in CIDR form (e.g. %s)", cfg.Subnet, DefaultSubnet)
	}
	if ones, _ := subnet.Mask.Size(); ones > 28 {
		return nil, errdefs.InvalidArgument("subnet", "%s is too small; use a /28 or larger", cfg.Subnet)
	}
	cfg.DefaultResources = cfg.DefaultResources.WithDefaults(runtime.DefaultResources())
	if err := cfg.DefaultResources.Validate("default_resources"); err != nil {
		return nil, err
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = runtime.DefaultReadyTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Runtime{cfg: cfg, cli: cfg.Client, log: cfg.Logger, subnet: subnet, imgInfos: map[string]imageInfo{}}
	r.gateway = nextIP(subnet.IP)
	cni, err := gocni.New(
		gocni.WithPluginDir(cfg.CNIBinDirs),
		gocni.WithInterfacePrefix("eth"),
		gocni.WithConfListBytes(r.cniConfList()),
	)
	if err != nil {
		return nil, errdefs.InvalidArgument("cni", "%v", err)
	}
	r.cni = cni
	if r.cli == nil {
		c, err := ctd.New(cfg.Address, ctd.WithDefaultNamespace(cfg.Namespace))
		if err != nil {
			return nil, errdefs.Unavailable("containerd: create client for %s: %v", cfg.Address, err)
		}
		r.cli, r.ownClient = c, true
	}
	r.health = runtime.NewHealthProber()
	return r, nil
}

// defaultAddress picks the socket to use when Config.Address is empty.
func defaultAddress() string {
	for _, a := range []string{DefaultAddress, DockerAddress} {
		if st, err := os.Stat(a); err == nil && st.Mode()&os.ModeSocket != 0 {
			return a
		}
	}
	return DefaultAddress
}

// Close releases the containerd client when New created it. Sandboxes keep
// running.
func (r *Runtime) Close() error {
	r.health.Close()
	if r.ownClient {
		return r.cli.Close()
	}
	return nil
}

// Client returns the containerd client (for tools and tests; calls need the
// namespace in their context, see Namespace).
func (r *Runtime) Client() *ctd.Client { return r.cli }

// Address returns the containerd socket in use.
func (r *Runtime) Address() string { return r.cfg.Address }

// Namespace returns the containerd namespace berth uses.
func (r *Runtime) Namespace() string { return r.cfg.Namespace }

// withNS returns ctx carrying the runtime's containerd namespace.
func (r *Runtime) withNS(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.cfg.Namespace)
}

// namespaceValid checks a containerd namespace name.
func namespaceValid(ns string) error {
	if !containerIDRE.MatchString(ns) || len(ns) > 76 {
		return errdefs.InvalidArgument("namespace", "%q is not a valid containerd namespace (letters, digits and single '.', '_' or '-' between them)", ns)
	}
	return nil
}

// Get returns the berth-managed sandbox with container id id. A container
// that does not exist or is not managed by berth is NotFound.
func (r *Runtime) Get(ctx context.Context, id string) (runtime.Sandbox, error) {
	if id == "" {
		return runtime.Sandbox{}, errdefs.InvalidArgument("id", "container id is required")
	}
	c, proc, err := r.managedTask(r.withNS(ctx), id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	return r.toSandbox(c, proc), nil
}

// getManaged returns container id, or NotFound unless it exists and carries
// the managed label: berth never touches containers it did not create.
func (r *Runtime) getManaged(ctx context.Context, id string) (containers.Container, error) {
	c, err := r.cli.ContainerService().Get(ctx, id)
	if err != nil {
		return c, r.mapErr(err, "get container", id)
	}
	return c, runtime.CheckManaged("containerd", id, c.Labels)
}

// taskProcess returns the init process of container id's task, or nil when
// it has no task.
func (r *Runtime) taskProcess(ctx context.Context, id string) (*tasktypes.Process, error) {
	resp, err := r.cli.TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id})
	if err != nil {
		mapped := r.mapErr(err, "get task", id)
		if errdefs.IsNotFound(mapped) {
			return nil, nil
		}
		return nil, mapped
	}
	return resp.GetProcess(), nil
}

// List returns the berth-managed sandboxes whose labels match sel, with two
// calls to containerd whatever their number (containers, then tasks).
func (r *Runtime) List(ctx context.Context, sel runtime.Selector) ([]runtime.Sandbox, error) {
	ctx = r.withNS(ctx)
	filters := []string{labelFilter(runtime.LabelManaged, "true")}
	for k, v := range sel {
		if k == "" || strings.ContainsAny(k, "=\"\x00") {
			return nil, errdefs.InvalidArgument("selector", "invalid label key %q", k)
		}
		filters = append(filters, labelFilter(k, v))
	}
	// Filters in one string are ANDed (comma), separate strings ORed.
	list, err := r.cli.ContainerService().List(ctx, strings.Join(filters, ","))
	if err != nil {
		return nil, r.mapErr(err, "list containers", "")
	}
	if len(list) == 0 {
		return []runtime.Sandbox{}, nil
	}
	resp, err := r.cli.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return nil, r.mapErr(err, "list tasks", "")
	}
	procs := make(map[string]*tasktypes.Process, len(resp.GetTasks()))
	for _, p := range resp.GetTasks() {
		id := p.GetContainerID()
		if id == "" {
			id = p.GetID() // containerd 1.6 fills only ID (the container's)
		}
		procs[id] = p
	}
	out := make([]runtime.Sandbox, 0, len(list))
	for _, c := range list {
		// containerd filtered already; re-check so nothing foreign leaks.
		if !runtime.IsManaged(c.Labels) || !sel.Matches(c.Labels) {
			continue
		}
		out = append(out, r.toSandbox(c, procs[c.ID]))
	}
	return out, nil
}

// labelFilter is a containerd filter expression matching label k == v.
func labelFilter(k, v string) string {
	return "labels." + strconv.Quote(k) + "==" + strconv.Quote(v)
}

// Stop sends SIGTERM to the sandbox's agent (PID 1, which forwards it to its
// children) and SIGKILL to every process after grace; zero or negative grace
// kills at once. A paused sandbox is thawed after the signal so it can act
// on it. Stopping a stopped (or never started) sandbox is a no-op. The
// stopped task is kept, so Get reports the exit code, until Remove.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	ctx = r.withNS(ctx)
	if _, err := r.getManaged(ctx, id); err != nil {
		return err
	}
	proc, err := r.taskProcess(ctx, id)
	if err != nil || proc == nil || proc.GetStatus() == tasktypes.Status_STOPPED {
		return err
	}
	if grace > 0 {
		if err := r.signal(ctx, id, syscall.SIGTERM, false); err != nil {
			return err
		}
		if proc.GetStatus() == tasktypes.Status_PAUSED || proc.GetStatus() == tasktypes.Status_PAUSING {
			r.resumeQuietly(ctx, id)
		}
		if done, err := r.waitExit(ctx, id, grace); err != nil || done {
			return err
		}
	}
	if err := r.signal(ctx, id, syscall.SIGKILL, true); err != nil {
		return err
	}
	r.resumeQuietly(ctx, id) // a frozen process cannot die
	done, err := r.waitExit(ctx, id, cleanupTimeout)
	if err == nil && !done {
		err = errdefs.Unavailable("containerd: task %s did not exit within %s of SIGKILL", id, cleanupTimeout)
	}
	return err
}

// signal sends sig to the task's init process (all=false) or to all of its
// processes. A task that is gone or already stopped is not an error.
func (r *Runtime) signal(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	_, err := r.cli.TaskService().Kill(ctx, &tasks.KillRequest{ContainerID: id, Signal: uint32(sig), All: all})
	if err == nil {
		return nil
	}
	mapped := r.mapErr(err, "kill task", id)
	if errdefs.IsNotFound(mapped) || strings.Contains(err.Error(), "process already finished") {
		return nil
	}
	return mapped
}

// resumeQuietly thaws a task if it is paused, ignoring errors (it may
// not be).
func (r *Runtime) resumeQuietly(ctx context.Context, id string) {
	if proc, err := r.taskProcess(ctx, id); err == nil && proc != nil {
		if s := proc.GetStatus(); s == tasktypes.Status_PAUSED || s == tasktypes.Status_PAUSING {
			_, _ = r.cli.TaskService().Resume(ctx, &tasks.ResumeTaskRequest{ContainerID: id})
		}
	}
}

// waitExit waits up to d for the task of id to stop; done reports whether
// it did (or has no task). Errors other than the wait timing out are
// returned.
func (r *Runtime) waitExit(ctx context.Context, id string, d time.Duration) (done bool, err error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err = r.cli.TaskService().Wait(wctx, &tasks.WaitRequest{ContainerID: id})
	if err == nil {
		return true, nil
	}
	if ctx.Err() != nil {
		return false, fmt.Errorf("containerd: wait for task %s: %w", id, ctx.Err())
	}
	if wctx.Err() != nil {
		return false, nil
	}
	mapped := r.mapErr(err, "wait for task", id)
	if errdefs.IsNotFound(mapped) {
		return true, nil
	}
	return false, mapped
}

// Remove force-removes the sandbox and everything it owns on the host: its
// task (killed and deleted), its network (CNI DEL: veth and IP address), its
// network namespace, its host directory, the container and its snapshot. A
// container that does not exist is success (leftovers under its id are
// cleaned up all the same); a container not managed by berth is left alone
// and reported as FailedPrecondition.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	if id == "" {
		return errdefs.InvalidArgument("id", "container id is required")
	}
	ctx = r.withNS(ctx)
	c, err := r.cli.ContainerService().Get(ctx, id)
	if err != nil {
		mapped := r.mapErr(err, "get container", id)
		if !errdefs.IsNotFound(mapped) {
			return mapped
		}
		if !containerIDRE.MatchString(id) || len(id) > maxContainerID {
			return nil // cannot have host state under a path made of it
		}
		return r.teardownHost(ctx, id)
	}
	if !runtime.IsManaged(c.Labels) {
		return errdefs.FailedPrecondition("containerd: refusing to remove container %s: not managed by berth", id)
	}
	r.keepLastWords(ctx, c.ID) // logs.go
	return r.teardown(ctx, c)
}

// teardown removes a container and all it owns, in an order that keeps the
// container (so List finds it for a retry) until everything else is gone.
func (r *Runtime) teardown(ctx context.Context, c containers.Container) error {
	if err := r.deleteTask(ctx, c.ID); err != nil {
		return err
	}
	if err := r.teardownHost(ctx, c.ID); err != nil {
		return err
	}
	if err := r.cli.ContainerService().Delete(ctx, c.ID); err != nil {
		if mapped := r.mapErr(err, "delete container", c.ID); !errdefs.IsNotFound(mapped) {
			return mapped
		}
	}
	removeCgroups(r.cfg.Namespace, c.ID)
	if c.SnapshotKey != "" {
		sn := c.Snapshotter
		if sn == "" {
			sn = r.cfg.Snapshotter
		}
		if err := r.cli.SnapshotService(sn).Remove(ctx, c.SnapshotKey); err != nil {
			if mapped := r.mapErr(err, "remove snapshot", c.SnapshotKey); !errdefs.IsNotFound(mapped) {
				return mapped
			}
		}
	}
	return nil
}

// deleteTask kills every process of the task (thawing it if paused), waits
// for it to stop and deletes it. No task is success.
func (r *Runtime) deleteTask(ctx context.Context, id string) error {
	proc, err := r.taskProcess(ctx, id)
	if err != nil || proc == nil {
		return err
	}
	if proc.GetStatus() != tasktypes.Status_STOPPED {
		if err := r.signal(ctx, id, syscall.SIGKILL, true); err != nil {
			return err
		}
		// A frozen process cannot die; runc thaws a cgroup v1 container
		// itself when it kills all its processes, so thaw only if needed.
		r.resumeQuietly(ctx, id)
		done, err := r.waitExit(ctx, id, cleanupTimeout)
		if err != nil {
			return err
		}
		if !done {
			return errdefs.Unavailable("containerd: task %s did not exit within %s of SIGKILL", id, cleanupTimeout)
		}
	}
	if _, err := r.cli.TaskService().Delete(ctx, &tasks.DeleteTaskRequest{ContainerID: id}); err != nil {
		if mapped := r.mapErr(err, "delete task", id); !errdefs.IsNotFound(mapped) {
			return mapped
		}
	}
	return nil
}

// teardownHost releases the sandbox's network (CNI DEL), unmounts and removes
// its network namespace and removes its host directory. Each step tolerates
// what is already gone.
func (r *Runtime) teardownHost(ctx context.Context, id string) error {
	var errs []error
	nsPath := r.netnsPath(id)
	if err := r.cniDel(ctx, id, nsPath); err != nil {
		errs = append(errs, err)
	}
	if err := removeNetns(nsPath); err != nil {
		errs = append(errs, fmt.Errorf("containerd: remove network namespace %s: %w", nsPath, err))
	}
	if err := os.RemoveAll(r.sandboxDir(id)); err != nil {
		errs = append(errs, fmt.Errorf("containerd: remove %s: %w", r.sandboxDir(id), err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
	}
	return nil
}

// Pause freezes every process of the sandbox (cgroup freezer). Pausing a
// sandbox that is not running is FailedPrecondition.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	ctx = r.withNS(ctx)
	if _, err := r.getManaged(ctx, id); err != nil {
		return err
	}
	proc, err := r.taskProcess(ctx, id)
	if err != nil {
		return err
	}
	if proc == nil || proc.GetStatus() != tasktypes.Status_RUNNING {
		return errdefs.FailedPrecondition("containerd: cannot pause %s: it is %s", id, statusText(proc))
	}
	_, err = r.cli.TaskService().Pause(ctx, &tasks.PauseTaskRequest{ContainerID: id})
	return r.mapErr(err, "pause task", id)
}

// Resume thaws a paused sandbox. Resuming a sandbox that is not paused is
// FailedPrecondition.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	ctx = r.withNS(ctx)
	if _, err := r.getManaged(ctx, id); err != nil {
		return err
	}
	proc, err := r.taskProcess(ctx, id)
	if err != nil {
		return err
	}
	if proc == nil || (proc.GetStatus() != tasktypes.Status_PAUSED && proc.GetStatus() != tasktypes.Status_PAUSING) {
		return errdefs.FailedPrecondition("containerd: cannot resume %s: it is %s, not paused", id, statusText(proc))
	}
	_, err = r.cli.TaskService().Resume(ctx, &tasks.ResumeTaskRequest{ContainerID: id})
	return r.mapErr(err, "resume task", id)
}

func statusText(p *tasktypes.Process) string {
	if p == nil {
		return "not started (no task)"
	}
	return strings.ToLower(p.GetStatus().String())
}

// pingTimeout bounds Ping's wait for containerd to answer.
const pingTimeout = 5 * time.Second

// Ping checks that containerd answers; errdefs.ErrUnavailable naming the
// socket when it does not.
func (r *Runtime) Ping(ctx context.Context) error {
	ctx = r.withNS(ctx)
	// The client waits for the connection to become ready, so an absent
	// socket would take the caller's whole deadline.
	if path := strings.TrimPrefix(r.cfg.Address, "unix://"); !strings.HasPrefix(path, "/") {
		// Not a socket path (e.g. a named pipe or TCP address): just dial.
	} else if st, err := os.Stat(path); err != nil || st.Mode()&os.ModeSocket == 0 {
		if err == nil {
			err = errors.New("not a socket")
		}
		return fmt.Errorf("%w: containerd: ping %s: %w (is containerd running? set the socket with Config.Address)",
			errdefs.ErrUnavailable, r.cfg.Address, err)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if _, err := r.cli.Version(pctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("containerd: ping: %w", err)
		}
		return fmt.Errorf("%w: containerd: ping %s: %w (is containerd running? set the socket with Config.Address)",
			errdefs.ErrUnavailable, r.cfg.Address, err)
	}
	return nil
}

// toSandbox builds the runtime view of container c with task process proc
// (nil: no task).
func (r *Runtime) toSandbox(c containers.Container, proc *tasktypes.Process) runtime.Sandbox {
	sb := runtime.Sandbox{
		ID:        c.ID,
		Name:      c.ID,
		Image:     familiar(c.Image),
		CreatedAt: c.CreatedAt,
		State:     runtime.StateCreated,
	}
	sb.SetLabels(c.Labels)
	if proc != nil {
		switch proc.GetStatus() {
		case tasktypes.Status_CREATED:
			sb.State = runtime.StateCreated
		case tasktypes.Status_RUNNING:
			sb.State = runtime.StateRunning
		case tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
			sb.State = runtime.StatePaused
		case tasktypes.Status_STOPPED:
			sb.State = runtime.StateExited
			sb.ExitCode = int(proc.GetExitStatus())
			sb.OOMKilled = r.oomKilled(c)
		default:
			sb.State = runtime.StateUnknown
		}
	}
	if sb.State == runtime.StateRunning || sb.State == runtime.StatePaused {
		if ni, ok := networkInfoOf(c); ok && ni.IP != "" {
			sb.Endpoint = net.JoinHostPort(ni.IP, strconv.Itoa(runtime.AgentPort))
		}
	}
	sb.StateDir = filepath.Join(r.sandboxDir(c.ID), agentStateDir)
	return sb
}
