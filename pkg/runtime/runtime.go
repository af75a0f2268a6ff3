// Package runtime defines the contract between berth's lease manager and the
// container backends (Docker in runtime/docker, containerd in
// runtime/containerd). A backend creates a hardened container from any image,
// injects the static sandbox-agent as its entrypoint, starts it and waits
// until the agent answers health. Every backend must pass the conformance
// suite in runtime/conformance.
package runtime

import (
	"context"
	"time"
)

// Labels that identify what berth created. Every container (and network)
// a backend creates carries LabelManaged=true and the lease, conversation and
// instance labels; user labels are stored under LabelUserPrefix.
const (
	LabelManaged      = "dev.berth.managed"
	LabelLease        = "dev.berth.lease"
	LabelConversation = "dev.berth.conversation"
	LabelInstance     = "dev.berth.instance"
	LabelUserPrefix   = "dev.berth.label."
	// LabelPool names the warm pool a sandbox was created for
	// (Spec.Pool); it stays on the container after a lease claims it.
	LabelPool = "dev.berth.pool"
	// LabelPoolProfile is a digest of the profile (image, user,
	// resources) a pooled sandbox was created with (Spec.PoolProfile).
	LabelPoolProfile = "dev.berth.pool-profile"
	// LabelPoolClaim is set on a warm pool's sandbox by the claim that
	// took it (ClaimMember, lease.MemberClaimer: on a backend whose pools several
	// orchestrators share): the claiming orchestrator's instance id. A
	// member that carries it is never handed out again.
	LabelPoolClaim = "dev.berth.pool-claim"
	// LabelPoolReady ("true") is set on a warm pool's sandbox, on a
	// backend whose pools several orchestrators share, by the orchestrator
	// that created it once its agent answered (MarkMemberReady,
	// lease.MemberClaimer): the others hand out only members that carry
	// it (a container the engine reports running may have an agent not
	// listening yet).
	LabelPoolReady = "dev.berth.pool-ready"
)

// AgentPort is the TCP port the agent listens on inside every sandbox.
const AgentPort = 7000

// EnvdPort is the TCP port inside every sandbox where the agent serves
// E2B's envd protocol (its --envd-listen; E2B's SDKs reach envd on this
// port). Like AgentPort it is reached on the sandbox's address, never
// published on the host.
const EnvdPort = 49983

// Resources are per-sandbox limits. Zero means the backend default.
type Resources struct {
	// NanoCPUs is the CPU quota in units of 1e-9 CPUs (1e9 = one CPU).
	NanoCPUs int64
	// MemoryBytes is the memory limit; swap is disabled (swap limit = memory).
	MemoryBytes int64
	// PidsLimit is the maximum number of processes.
	PidsLimit int64
	// DiskBytes bounds what the sandbox may write: its writable layer (and
	// volumes it writes to). Zero means no limit. The backend has the engine
	// enforce it where the storage driver supports a size
	// (Sandbox.DiskEnforcement DiskEnforcementEngine); elsewhere the lease
	// manager measures Usage and enforces it (DiskEnforcementBerth).
	DiskBytes int64
}

// How a sandbox's disk limit (Resources.DiskBytes) is enforced.
const (
	// DiskEnforcementNone: the sandbox has no disk limit.
	DiskEnforcementNone = ""
	// DiskEnforcementEngine: the engine bounds the writable layer (Docker
	// StorageOpt size on overlay2 with project quotas, btrfs, zfs, ...):
	// writes past the limit fail with ENOSPC inside the sandbox.
	DiskEnforcementEngine = "engine"
	// DiskEnforcementBerth: the engine cannot bound it (fuse-overlayfs,
	// overlay2 without quotas, containerd's overlayfs snapshotter); berth
	// measures Usage periodically and acts past the limit.
	DiskEnforcementBerth = "berth"
)

// Usage is what a sandbox consumes, as measured by Runtime.Usage.
type Usage struct {
	// DiskBytes is the size of the sandbox's writable layer plus the
	// volumes it writes to.
	DiskBytes int64
	// MeasuredAt is when DiskBytes was measured.
	MeasuredAt time.Time
}

// Spec describes a sandbox to create.
type Spec struct {
	// LeaseID, ConversationID and InstanceID become labels. LeaseID is required.
	LeaseID        string
	ConversationID string
	InstanceID     string
	// Image is the image reference; it must be present locally.
	Image string
	// AgentToken is the bearer token the agent will require.
	AgentToken string
	// Env is added to the image's environment.
	Env map[string]string
	// Secrets are added to the environment like Env (a name may not be in
	// both), and named in AgentSecretsEnv so that the agent masks their
	// values in the output it returns. See Spec.Environ.
	Secrets map[string]string
	// Labels are user labels, stored with LabelUserPrefix.
	Labels map[string]string
	// Resources are the limits; zero fields take the backend's defaults.
	Resources Resources
	// ReadyTimeout bounds create+start+health; zero means 30s.
	ReadyTimeout time.Duration
	// User is the user the sandbox's commands run as by default, and that
	// owns the files created through the agent ("name", "uid",
	// "name:group", "uid:gid"), resolved inside the sandbox with the
	// image's /etc/passwd and /etc/group. The agent itself runs as root
	// (the container's user is root) and a command may name another user.
	// Default "": the image's configured user, root when it sets none.
	User string
	// DenyRootUser makes the agent refuse commands as uid 0
	// (PERMISSION_DENIED), and fail to start when the default user is
	// root. Default false: the lease token may run commands as root.
	DenyRootUser bool
	// DNS are the name servers of the sandbox's resolv.conf (Docker: its
	// --dns). The lease manager gives egress.DNSAddress when berth
	// enforces network policies (docs/network-policy.md). Default none:
	// the backend's (the host's name servers).
	DNS []string
	// Mounts are volumes and host directories to mount (see Mount;
	// ValidateMounts). A MountVolume's volume is created when missing.
	// Default none.
	Mounts []Mount
	// Pool and PoolProfile, when set, are written as LabelPool and
	// LabelPoolProfile: the sandbox is a warm pool's, created before any
	// lease claims it. Default "": not pooled.
	Pool, PoolProfile string
	// App is a server the image carries that the agent runs as a
	// supervised child and forwards the routes it does not serve to
	// (docs/openhands.md). Default nil: none.
	App *App
	// WorkDir, when set, is the agent's working directory (its --workdir:
	// the default directory of commands, terminals and git), created by
	// the agent if missing. The sandbox's workspace storage stays where the
	// backend puts it (AgentWorkDir). Default "": the image's, else
	// DefaultWorkDir.
	WorkDir string
}

// AgentWorkDir is the agent's working directory in a sandbox of s whose
// backend chose dir (the image's, or DefaultWorkDir): Spec.WorkDir when
// set, else dir.
func (s Spec) AgentWorkDir(dir string) string {
	if s.WorkDir != "" {
		return s.WorkDir
	}
	return dir
}

// App is a sandbox's app (Spec.App).
type App struct {
	// Command is its command line. Required.
	Command []string
	// Port is the port it listens on inside the sandbox (1-65535, not
	// AgentPort). Required.
	Port int
	// WorkDir is its working directory (absolute); "" for the agent's.
	WorkDir string
	// Key is given to the app (SESSION_API_KEY, OH_SESSION_API_KEYS_0) and
	// sent by the agent on the requests it forwards. Default "": none.
	Key string
}

// State is a sandbox's container state.
type State string

// Container states reported by backends.
const (
	StateCreated State = "created"
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateExited  State = "exited"
	StateUnknown State = "unknown"
)

// Sandbox is a container a backend created.
type Sandbox struct {
	// ID is the backend's container id.
	ID string
	// Name is the container name.
	Name string
	// LeaseID, ConversationID and InstanceID are read back from labels.
	LeaseID        string
	ConversationID string
	InstanceID     string
	// Image is the image reference it was created from.
	Image string
	// State is the container state; ExitCode and OOMKilled are set when exited.
	State     State
	ExitCode  int
	OOMKilled bool
	// Endpoint is host:port of the agent, reachable from the orchestrator's host.
	Endpoint string
	// StateDir is the directory mounted at AgentStateDir, as a path on the
	// engine's host; empty when the backend has none there (Kubernetes).
	// An orchestrator on that host configures a claimed agent by writing
	// its state file there (package statefile); elsewhere the path names
	// nothing, and the write finds no agent's marker in it.
	StateDir string
	// Labels are all labels of the container.
	Labels map[string]string
	// CreatedAt is when the container was created.
	CreatedAt time.Time
	// DiskEnforcement says who enforces Resources.DiskBytes (one of the
	// DiskEnforcement constants); set by Create.
	DiskEnforcement string
}

// Selector matches sandboxes whose labels equal every key/value given.
// An empty selector matches every berth-managed sandbox.
type Selector map[string]string

// Matches reports whether labels carry every key of s with its value (a
// key that is missing never matches, even against an empty value). Every
// backend filters with it, so selectors mean the same on each.
func (s Selector) Matches(labels map[string]string) bool {
	for k, v := range s {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// EventKind is what happened to a sandbox.
type EventKind string

// Event kinds delivered by Watch.
const (
	// EventDied means the container's main process exited (or was killed).
	EventDied EventKind = "died"
	// EventOOM means the kernel OOM-killed a process in the container.
	EventOOM EventKind = "oom"
	// EventRemoved means the container was removed.
	EventRemoved EventKind = "removed"
)

// Event is a change to a berth-managed sandbox seen by the backend.
type Event struct {
	Kind     EventKind
	ID       string
	LeaseID  string
	ExitCode int
	At       time.Time
}

// Runtime is a container backend.
type Runtime interface {
	// Create creates, injects the agent into, starts, and waits for the
	// readiness of a sandbox. On failure nothing is left behind and the error
	// includes the container's last log lines when there are any.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Get returns one sandbox; errdefs.ErrNotFound when there is none.
	Get(ctx context.Context, id string) (Sandbox, error)
	// List returns the berth-managed sandboxes matching sel.
	List(ctx context.Context, sel Selector) ([]Sandbox, error)
	// Stop stops a sandbox: SIGTERM, grace, SIGKILL. Its files are kept
	// (Restart starts it again); the lease manager stops a sandbox past its
	// disk limit with it.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Remove force-removes a sandbox; a missing one is success.
	Remove(ctx context.Context, id string) error
	// Restart starts a sandbox whose container exited (agent crash, kill
	// from outside, engine restart) again in place: the same container with
	// its writable layer — the files — kept; its processes are lost. It
	// waits for the agent like Create (bounded by the backend's
	// ReadyTimeout) and returns the sandbox with its endpoint read again
	// (the address may change). A running sandbox is only waited for; a
	// paused one is FailedPrecondition; a missing one NotFound.
	Restart(ctx context.Context, id string) (Sandbox, error)
	// Watch delivers events for berth-managed sandboxes until ctx ends.
	// The channel is closed when the watch stops (ctx done or backend error);
	// callers re-List after a reconnect.
	Watch(ctx context.Context) (<-chan Event, error)
	// Ping checks the backend is reachable (errdefs.ErrUnavailable if not).
	Ping(ctx context.Context) error
	// Usage measures what a sandbox consumes: the size of its writable
	// layer (plus the volumes it writes to). The cost grows with the number
	// of files written (the engine walks the layer), so callers poll it
	// sparingly. errdefs.ErrNotFound when there is no such sandbox.
	Usage(ctx context.Context, id string) (Usage, error)
}

// ImageInspector is the optional part of a Runtime that reports the images
// it has locally (Docker implements it). Callers type-assert.
type ImageInspector interface {
	// ImageSize returns the size in bytes of the local image ref;
	// errdefs.ErrNotFound when there is none, errdefs.ErrInvalidArgument
	// for a malformed reference.
	ImageSize(ctx context.Context, ref string) (int64, error)
}

// Freezer is the optional part of a Runtime that freezes a sandbox's
// processes in place and thaws them, keeping its memory, files and address.
// Docker and containerd implement it through the cgroup freezer; a backend
// that cannot freeze (Kubernetes has no such operation) does not, and a
// caller that finds a Runtime without it answers FAILED_PRECONDITION naming
// the backend. Callers type-assert: rt.(runtime.Freezer).
type Freezer interface {
	// Pause freezes a running sandbox's processes (State becomes
	// StatePaused; its agent stops answering). A paused or stopped sandbox
	// is FailedPrecondition, a missing one NotFound. A paused sandbox can
	// still be stopped and removed.
	Pause(ctx context.Context, id string) error
	// Resume thaws a paused sandbox (State becomes StateRunning again); a
	// sandbox that is not paused is FailedPrecondition, a missing one
	// NotFound.
	Resume(ctx context.Context, id string) error
}
