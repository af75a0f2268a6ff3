package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultNetwork is the bridge network sandboxes are attached to.
	DefaultNetwork = "berth"
)

// cleanupTimeout bounds cleanup that runs even when the caller's context is
// done (runtime.CleanupTimeout).
const cleanupTimeout = runtime.CleanupTimeout

// Config configures a Docker Runtime. Zero fields take the defaults stated.
type Config struct {
	// AgentBinary is the host path of the static sandbox-agent binary that is
	// copied into every sandbox. Required. It must be statically linked
	// (CGO_ENABLED=0) since images may have no libc at all.
	AgentBinary string
	// Network is the bridge network sandboxes join; created on first use
	// with inter-container communication disabled. Default "berth".
	Network string
	// InstanceID identifies this orchestrator; it becomes the instance label
	// of sandboxes whose Spec leaves InstanceID empty. Default "".
	InstanceID string
	// DefaultResources apply to zero fields of Spec.Resources. Its zero
	// fields take runtime.DefaultResources(): 1 CPU (NanoCPUs 1e9), 512 MiB
	// memory without swap, 512 pids, no disk limit.
	DefaultResources runtime.Resources
	// Output bounds each sandbox's output kept on the host (rotated
	// files); zero fields take runtime.OutputLimit's defaults.
	Output runtime.OutputLimit
	// Injection is how the agent gets into sandboxes: InjectCopy (default)
	// or InjectVolume. See their docs.
	Injection Injection
	// ReadyTimeout applies when Spec.ReadyTimeout is zero. Default
	// runtime.DefaultReadyTimeout (30s).
	ReadyTimeout time.Duration
	// Logger receives the backend's logs (keys container_id, lease_id,
	// image, network); the caller adds a component attribute if it wants
	// one. Default slog.Default().
	Logger *slog.Logger
	// Client is the Docker API client. Default: NewClient() (configured from
	// DOCKER_HOST etc., with API version negotiation); Close closes it.
	Client Client
	// HostInput keeps sandboxes away from the host's own listeners with
	// iptables INPUT rules for the network's bridge: HostInputAuto
	// (default), HostInputRequired or HostInputOff. See HostInputMode.
	HostInput HostInputMode
}

// Runtime is the Docker Engine backend. It is safe for concurrent use.
type Runtime struct {
	cfg       Config
	cli       Client
	ownClient io.Closer
	log       *slog.Logger
	agentSum  string // hex SHA-256 of the agent (InjectVolume)
	agentSize int64  // size of the agent binary (InjectCopy puts it in the writable layer)

	netMu sync.Mutex
	netID string // id of the sandbox network once ensured

	snapMu sync.Mutex // one Snapshot at a time (snapshot.go)

	hostInputWarn sync.Once // the warning that the host input filter is missing

	volMu   sync.Mutex
	volName string // the agent volume once ensured (InjectVolume)

	negMu      sync.Mutex
	negotiated atomic.Bool

	health runtime.HealthProber

	disk diskProbe // whether the engine can bound the writable layer

	statsPids sync.Map          // container id -> main pid, for Stats without an inspect (stats.go)
	lastWords runtime.LastWords // output of removed containers that had exited (logs.go)
}

// Runtime is a runtime.Freezer: Pause and Resume use the cgroup freezer.
var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Freezer = (*Runtime)(nil)
)

// New returns a Docker backend. It checks that the agent binary exists and is
// statically linked; it does not contact the engine (use Ping), and creates
// the network on the first Create.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	_ = ctx
	agentSize, err := runtime.CheckAgentBinary(cfg.AgentBinary)
	if err != nil {
		return nil, err
	}
	if cfg.Network == "" {
		cfg.Network = DefaultNetwork
	}
	cfg.DefaultResources = cfg.DefaultResources.WithDefaults(runtime.DefaultResources())
	if err := cfg.DefaultResources.Validate("default_resources"); err != nil {
		return nil, err
	}
	switch cfg.Injection {
	case "":
		cfg.Injection = InjectCopy
	case InjectCopy, InjectVolume:
	default:
		return nil, errdefs.InvalidArgument("injection", "want %q or %q, got %q", InjectCopy, InjectVolume, cfg.Injection)
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = runtime.DefaultReadyTimeout
	}
	switch cfg.HostInput {
	case "":
		cfg.HostInput = HostInputAuto
	case HostInputAuto, HostInputRequired, HostInputOff:
	default:
		return nil, errdefs.InvalidArgument("host_input", "want %q, %q or %q, got %q", HostInputAuto, HostInputRequired, HostInputOff, cfg.HostInput)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Runtime{cfg: cfg, cli: cfg.Client, log: cfg.Logger, agentSize: agentSize}
	if cfg.Injection == InjectVolume {
		if r.agentSum, err = hashFile(cfg.AgentBinary); err != nil {
			return nil, errdefs.InvalidArgument("agent_binary", "%v", err)
		}
	}
	if r.cli == nil {
		c, err := NewClient()
		if err != nil {
			return nil, errdefs.Unavailable("docker: create client: %v", err)
		}
		r.cli, r.ownClient = c, c
	}
	r.health = runtime.NewHealthProber()
	return r, nil
}

// Close releases the Docker client when New created it. Sandboxes keep
// running.
func (r *Runtime) Close() error {
	r.health.Close()
	if r.ownClient != nil {
		return r.ownClient.Close()
	}
	return nil
}

// Network returns the name of the bridge network sandboxes join.
func (r *Runtime) Network() string { return r.cfg.Network }

// versionNegotiator is implemented by *client.Client.
type versionNegotiator interface {
	NegotiateAPIVersionPing(types.Ping)
}

// negotiate settles the client's API version once, before the first API
// call. The client would otherwise negotiate lazily inside whichever request
// comes first, while other requests (Events, ContainerList) read the version
// unsynchronised: a data race. Until the engine answers a ping it is retried
// on every call.
func (r *Runtime) negotiate(ctx context.Context) {
	if r.negotiated.Load() {
		return
	}
	n, ok := r.cli.(versionNegotiator)
	if !ok {
		r.negotiated.Store(true)
		return
	}
	r.negMu.Lock()
	defer r.negMu.Unlock()
	if r.negotiated.Load() {
		return
	}
	ping, err := r.cli.Ping(ctx)
	if err != nil {
		return
	}
	n.NegotiateAPIVersionPing(ping)
	r.negotiated.Store(true)
}

// Get returns the berth-managed sandbox with container id (or name) id.
// A container that does not exist or is not managed by berth is NotFound.
func (r *Runtime) Get(ctx context.Context, id string) (runtime.Sandbox, error) {
	r.negotiate(ctx)
	if id == "" {
		return runtime.Sandbox{}, errdefs.InvalidArgument("id", "container id is required")
	}
	ins, err := r.inspectManaged(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	return r.fromInspect(ins), nil
}

// inspectManaged inspects id and fails with NotFound unless it carries the
// managed label: berth never touches containers it did not create.
func (r *Runtime) inspectManaged(ctx context.Context, id string) (container.InspectResponse, error) {
	ins, err := r.cli.ContainerInspect(ctx, id)
	if err != nil {
		return ins, r.mapErr(err, "inspect container", id)
	}
	return ins, runtime.CheckManaged("docker", id, labelsOf(ins))
}

// labelsOf returns the labels of an inspected container (nil when the
// engine sent no configuration).
func labelsOf(ins container.InspectResponse) map[string]string {
	if ins.Config == nil {
		return nil
	}
	return ins.Config.Labels
}

// List returns the berth-managed sandboxes whose labels match sel, in the
// engine's order (newest first). ExitCode comes from the container status
// text; OOMKilled is only reported by Get.
func (r *Runtime) List(ctx context.Context, sel runtime.Selector) ([]runtime.Sandbox, error) {
	r.negotiate(ctx)
	args := filters.NewArgs(filters.Arg("label", runtime.LabelManaged+"=true"))
	for k, v := range sel {
		if k == "" || strings.Contains(k, "=") {
			return nil, errdefs.InvalidArgument("selector", "invalid label key %q", k)
		}
		args.Add("label", k+"="+v)
	}
	list, err := r.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return nil, r.mapErr(err, "list containers", "")
	}
	out := make([]runtime.Sandbox, 0, len(list))
	for _, c := range list {
		// The engine already filtered; re-check so a fake or an older engine
		// with looser filtering cannot leak foreign containers.
		if !sel.Matches(c.Labels) || !runtime.IsManaged(c.Labels) {
			continue
		}
		out = append(out, r.fromSummary(c))
	}
	return out, nil
}

// Stop sends SIGTERM to the sandbox's agent (PID 1, which forwards it to its
// children) and SIGKILL after grace, rounded up to whole seconds; zero or
// negative grace kills at once. Stopping a stopped sandbox is a no-op.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	r.negotiate(ctx)
	if _, err := r.inspectManaged(ctx, id); err != nil {
		return err
	}
	secs := 0
	if grace > 0 {
		secs = int((grace + time.Second - 1) / time.Second)
	}
	if err := r.cli.ContainerStop(ctx, id, container.StopOptions{Timeout: &secs}); err != nil {
		return r.mapErr(err, "stop container", id)
	}
	return nil
}

// Remove force-removes the sandbox and its anonymous volumes. A container
// that does not exist (or is already being removed) is success; a container
// not managed by berth is left alone and reported as FailedPrecondition.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	r.negotiate(ctx)
	if id == "" {
		return errdefs.InvalidArgument("id", "container id is required")
	}
	r.statsPids.Delete(id) // stats.go
	ins, err := r.cli.ContainerInspect(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(r.mapErr(err, "", "")) {
			return r.removeCreating(ctx, id) // gone, or still being created
		}
		return r.mapErr(err, "inspect container", id)
	}
	if !runtime.IsManaged(labelsOf(ins)) {
		return errdefs.FailedPrecondition("docker: refusing to remove container %s: not managed by berth", id)
	}
	if ins.State == nil || !ins.State.Running {
		r.keepLastWords(ctx, ins.ID) // logs.go
	}
	return r.remove(ctx, ins.ID)
}

func (r *Runtime) remove(ctx context.Context, id string) error {
	err := r.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil {
		return nil
	}
	mapped := r.mapErr(err, "remove container", id)
	// NotFound: gone already. Conflict "removal already in progress": someone
	// else (a concurrent Remove, the reaper) is removing it.
	if errdefs.IsNotFound(mapped) || strings.Contains(err.Error(), "already in progress") {
		return nil
	}
	return mapped
}

// Pause freezes every process of the sandbox (cgroup freezer). Pausing a
// sandbox that is not running (paused, stopped) is FailedPrecondition.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.freeze(ctx, id, true)
}

// Resume thaws a paused sandbox. Resuming a sandbox that is not paused is
// FailedPrecondition.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.freeze(ctx, id, false)
}

// pausedFlagSettle bounds how long Pause and Resume wait for the engine's
// paused flag to show the state they can act on. The Docker daemon sets
// that flag twice for every pause and unpause: when the call returns, and
// again when containerd's event for it is handled, later and on its own
// goroutine. In a quick pause, resume, pause the "paused" event of the first
// pause can be handled after the resume, so the engine reports a running,
// thawed container as paused (and refuses to pause it) until the "resumed"
// event behind it arrives; the same happens the other way round. A flag
// that disagrees with a running container is given this long to settle.
const pausedFlagSettle = 2 * time.Second

// freeze pauses (pause true) or resumes a sandbox, waiting out a stale
// paused flag of a running container (pausedFlagSettle).
func (r *Runtime) freeze(ctx context.Context, id string, pause bool) error {
	r.negotiate(ctx)
	deadline := time.Now().Add(pausedFlagSettle)
	wait := 5 * time.Millisecond
	for {
		ins, err := r.inspectManaged(ctx, id)
		if err != nil {
			return err
		}
		st := ins.State
		switch {
		case st == nil || !st.Running:
			// Stopped, restarting or dead: no event will change that.
			return r.notFreezable(id, ins, pause)
		case st.Paused != pause:
			var err error
			if pause {
				err = r.mapErr(r.cli.ContainerPause(ctx, id), "pause container", id)
			} else {
				err = r.mapErr(r.cli.ContainerUnpause(ctx, id), "unpause container", id)
			}
			// The daemon checks its flag again: a conflict is the same stale
			// flag, seen between our inspect and the call.
			if err == nil || !errdefs.IsFailedPrecondition(err) || time.Now().After(deadline) {
				return err
			}
		case time.Now().After(deadline):
			return r.notFreezable(id, ins, pause)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("docker: waiting for container %s to settle: %w", id, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// notFreezable is the FailedPrecondition of a pause or resume the
// container's state does not allow.
func (r *Runtime) notFreezable(id string, ins container.InspectResponse, pause bool) error {
	if pause {
		return errdefs.FailedPrecondition("docker: cannot pause container %s: it is %s", id, stateText(ins))
	}
	return errdefs.FailedPrecondition("docker: cannot resume container %s: it is %s, not paused", id, stateText(ins))
}

func stateText(ins container.InspectResponse) string {
	if ins.State == nil || ins.State.Status == "" {
		return "in an unknown state"
	}
	return ins.State.Status
}

// Ping checks that the engine answers; errdefs.ErrUnavailable (with a hint
// naming DOCKER_HOST) when it does not.
func (r *Runtime) Ping(ctx context.Context) error {
	r.negotiate(ctx)
	if _, err := r.cli.Ping(ctx); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			if ctx.Err() == nil {
				// A dial timeout rather than the caller giving up.
				return fmt.Errorf("%w: docker: ping: %w (is the Docker Engine running? DOCKER_HOST=%s)",
					errdefs.ErrUnavailable, err, r.daemonHost())
			}
			return fmt.Errorf("docker: ping: %w", err)
		}
		mapped := r.mapErr(err, "ping", "")
		if errdefs.IsUnavailable(mapped) {
			return mapped
		}
		return fmt.Errorf("%w: docker: ping: %w (is the Docker Engine running? DOCKER_HOST=%s)",
			errdefs.ErrUnavailable, err, r.daemonHost())
	}
	return nil
}

func mapState(s string) runtime.State {
	switch s {
	case container.StateCreated:
		return runtime.StateCreated
	case container.StateRunning, container.StateRestarting:
		return runtime.StateRunning
	case container.StatePaused:
		return runtime.StatePaused
	case container.StateExited, container.StateDead, container.StateRemoving:
		return runtime.StateExited
	default:
		return runtime.StateUnknown
	}
}

func (r *Runtime) endpoint(ip string) string {
	if ip == "" {
		return ""
	}
	return net.JoinHostPort(ip, strconv.Itoa(runtime.AgentPort))
}

func (r *Runtime) fromInspect(ins container.InspectResponse) runtime.Sandbox {
	sb := runtime.Sandbox{ID: ins.ID, Name: strings.TrimPrefix(ins.Name, "/")}
	if ins.Config != nil {
		sb.SetLabels(ins.Config.Labels)
		sb.Image = ins.Config.Image
	}
	if t, err := time.Parse(time.RFC3339Nano, ins.Created); err == nil {
		sb.CreatedAt = t
	}
	if hc := ins.HostConfig; hc != nil && hc.StorageOpt["size"] != "" {
		sb.DiskEnforcement = runtime.DiskEnforcementEngine
	}
	sb.State = runtime.StateUnknown
	if st := ins.State; st != nil {
		sb.State = mapState(st.Status)
		if sb.State == runtime.StateExited {
			sb.ExitCode = st.ExitCode
			sb.OOMKilled = st.OOMKilled
		}
	}
	if ns := ins.NetworkSettings; ns != nil && (sb.State == runtime.StateRunning || sb.State == runtime.StatePaused) {
		if ep := ns.Networks[r.cfg.Network]; ep != nil {
			sb.Endpoint = r.endpoint(ep.IPAddress)
		}
	}
	sb.StateDir = agentStateSource(ins.Mounts)
	return sb
}

// agentStateSource returns the host path of the volume mounted at
// runtime.AgentStateDir (agentStateMount), or "".
func agentStateSource(mounts []container.MountPoint) string {
	for _, mp := range mounts {
		if mp.Destination == runtime.AgentStateDir && mp.Type == mount.TypeVolume {
			return mp.Source
		}
	}
	return ""
}

var exitedRE = regexp.MustCompile(`^Exited \((-?\d+)\)`)

func (r *Runtime) fromSummary(c container.Summary) runtime.Sandbox {
	sb := runtime.Sandbox{ID: c.ID, Image: c.Image, CreatedAt: time.Unix(c.Created, 0)}
	sb.SetLabels(c.Labels)
	if len(c.Names) > 0 {
		sb.Name = strings.TrimPrefix(c.Names[0], "/")
	}
	sb.State = mapState(c.State)
	if sb.State == runtime.StateExited {
		if m := exitedRE.FindStringSubmatch(c.Status); m != nil {
			sb.ExitCode, _ = strconv.Atoi(m[1])
		}
	}
	if ns := c.NetworkSettings; ns != nil && (sb.State == runtime.StateRunning || sb.State == runtime.StatePaused) {
		if ep := ns.Networks[r.cfg.Network]; ep != nil {
			sb.Endpoint = r.endpoint(ep.IPAddress)
		}
	}
	sb.StateDir = agentStateSource(c.Mounts)
	return sb
}

// ImageSize returns the size of the local image ref (runtime.ImageInspector);
// a missing one is errdefs.ErrNotFound.
func (r *Runtime) ImageSize(ctx context.Context, ref string) (int64, error) {
	img, err := r.cli.ImageInspect(ctx, ref)
	if err != nil {
		return 0, r.mapErr(err, "inspect image", ref)
	}
	return img.Size, nil
}
