package lease

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Limits on request fields.
const (
	MaxConversationIDLen = 256
	MaxOwnerLen          = 256
	MaxImageLen          = 512
	MaxLabels            = 64
	MaxLabelKeyLen       = 128
	MaxLabelValueLen     = 256
	MaxEnv               = 256
	MaxEnvKeyLen         = 256
	MaxEnvValueLen       = 32 << 10
)

// ReservedEnvPrefix is the prefix of environment variables berth sets in a
// sandbox (BERTH_AGENT_TOKEN among them); an acquire may not set them.
const ReservedEnvPrefix = "BERTH_"

// MaxPublicPorts bounds AcquireRequest.PublicPorts.
const MaxPublicPorts = 16

// AcquireRequest asks for a conversation's sandbox. Only ConversationID is
// required.
type AcquireRequest struct {
	// ConversationID identifies the conversation: 1–256 bytes of UTF-8
	// without control characters. Acquire is idempotent by it within one
	// owner: two owners' identical conversation ids are independent.
	ConversationID string
	// Owner is who asks; the edge sets it from the credential (clients own
	// what they acquire; the operator may pass any owner, or none).
	Owner string
	// Image defaults to Config.DefaultImage.
	Image string
	// TTL is the lifetime from now; 0 takes Config.DefaultTTL; it may not be
	// negative or exceed Config.MaxTTL.
	TTL time.Duration
	// IdleTimeout expires the lease after this long without activity; 0
	// takes Config.DefaultIdleTimeout (which may be none).
	IdleTimeout time.Duration
	// IdlePolicy is what the idle timeout does: IdleExpire ends the lease,
	// IdleFreeze and IdleHibernate pause it. "" takes
	// Config.Pause.DefaultIdlePolicy.
	IdlePolicy IdlePolicy
	// Labels are user labels (keys [A-Za-z0-9._/-], starting alphanumeric,
	// ≤128 bytes; values ≤256 bytes, no control characters or commas).
	Labels map[string]string
	// Env is added to the sandbox's environment; keys may not start with
	// ReservedEnvPrefix. It is persisted with the lease.
	Env map[string]string
	// Secrets are added to the sandbox's environment like Env (names are
	// checked like Env's keys, may not also be in Env nor contain ',';
	// MaxEnv and AdmissionConfig.MaxEnvBytes count both). Their values are never
	// stored: the lease records only their names (Lease.SecretNames), and
	// the sandbox's agent masks the values in the output it returns.
	Secrets map[string]string
	// Resources are limits; zero fields take AdmissionConfig.DefaultResources.
	Resources runtime.Resources
	// User runs the sandbox's commands as this user of the image ("name",
	// "uid", "name:group", "uid:gid"). Default: AdmissionConfig.DefaultUser for the
	// images it applies to, else the image's own user.
	User string
	// PublicPorts are preview ports (1-65535) the proxy serves without a
	// token. Default none.
	PublicPorts []int
	// Network is what the sandbox may reach; nil takes
	// NetworkConfig.Default (see NetworkPolicy, network.go).
	Network *NetworkPolicy
	// NoOwnerLimit exempts this acquire from AdmissionConfig.MaxLivePerOwner (the
	// edge sets it for the operator). MaxLive still applies.
	NoOwnerLimit bool
	// Snapshot starts the sandbox from snapshot NAME of Owner
	// (Snapshots.Take): a fork, with the snapshotted sandbox's files.
	// Image must then be empty; an Image into the snapshot repository
	// (berth/snapshot:NAME in any spelling) is the same request, and image
	// ids and digests into it are refused (runtime.ParseImageRef). Another
	// owner's snapshot is NotFound like a missing one, unless AnySnapshot.
	// The user defaults to the snapshotted lease's.
	Snapshot string
	// AnySnapshot lets this acquire fork any owner's snapshot (the edge
	// sets it for the operator).
	AnySnapshot bool

	fork *Snapshot // the snapshot resolved by resolveFork
	// ownerVolumes are the owner's workspace volumes the runtime had when
	// the acquire began (listOwnerVolumes); nil when the volume limit does
	// not apply.
	ownerVolumes map[string]bool
	// Persist keeps /workspace on the conversation's volume (VolumeName of
	// owner and conversation), created at the first such acquire and
	// mounted again by later ones, after release or expiry: the files
	// outlive the lease. Config.Volumes.PersistWorkspaces makes every acquire
	// persist. Default false.
	Persist bool
	// Mounts are host paths to mount (see HostMount), allowed only under
	// Config.Volumes.HostMounts' prefixes. Default none.
	Mounts []HostMount
	// App is a server the image carries that the sandbox's agent runs as a
	// supervised child, on Config.AppPort, and forwards the routes it does
	// not serve to (docs/openhands.md). Such a lease never takes a warm
	// pool's sandbox. Default nil: none.
	App *App
	// WorkDir is the default working directory (absolute) of the sandbox's
	// commands, terminals and git calls (the agent's --workdir), created
	// owned by the sandbox's user if missing. Such a lease never takes a
	// warm pool's sandbox. Default "": the image's, else /workspace.
	WorkDir string
}

// validateWorkDir checks AcquireRequest.WorkDir.
func validateWorkDir(d string) error {
	switch {
	case d == "":
		return nil
	case !strings.HasPrefix(d, "/"):
		return errdefs.InvalidArgument("working_dir", "%q is not absolute", d)
	case len(d) > MaxWorkDirLen:
		return errdefs.InvalidArgument("working_dir", "%d bytes, at most %d", len(d), MaxWorkDirLen)
	case strings.ContainsFunc(d, unicode.IsControl):
		return errdefs.InvalidArgument("working_dir", "contains a control character")
	}
	return nil
}

// MaxWorkDirLen bounds AcquireRequest.WorkDir (Linux's PATH_MAX).
const MaxWorkDirLen = 4096

// DefaultAppPort is Config.AppPort's default: the OpenHands agent-server's.
const DefaultAppPort = 8000

// MaxAppArgs bounds App.Command.
const MaxAppArgs = 256

// App is a lease's app (AcquireRequest.App).
type App struct {
	// Command is its command line: at least one argument, the first not
	// empty.
	Command []string `json:"command"`
	// WorkDir is its working directory (absolute); "" for the sandbox's.
	WorkDir string `json:"workDir,omitempty"`
}

// validate checks a (nil is none).
func (a *App) validate() error {
	if a == nil {
		return nil
	}
	switch {
	case len(a.Command) == 0 || a.Command[0] == "":
		return errdefs.InvalidArgument("app.command", "required (its first argument may not be empty)")
	case len(a.Command) > MaxAppArgs:
		return errdefs.InvalidArgument("app.command", "%d arguments, at most %d", len(a.Command), MaxAppArgs)
	case a.WorkDir != "" && !strings.HasPrefix(a.WorkDir, "/"):
		return errdefs.InvalidArgument("app.working_dir", "%q is not absolute", a.WorkDir)
	}
	n := len(a.WorkDir)
	for _, arg := range a.Command {
		n += len(arg)
		if strings.ContainsRune(arg, 0) {
			return errdefs.InvalidArgument("app.command", "an argument contains a NUL byte")
		}
	}
	if strings.ContainsRune(a.WorkDir, 0) || n > MaxEnvValueLen {
		return errdefs.InvalidArgument("app", "NUL byte in working_dir, or longer than %d bytes in all", MaxEnvValueLen)
	}
	return nil
}

func noControl(field, s string) error {
	if !utf8.ValidString(s) {
		return errdefs.InvalidArgument(field, "not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return errdefs.InvalidArgument(field, "contains control character %U", r)
		}
	}
	return nil
}

func validLabelKey(k string) error {
	if k == "" || len(k) > MaxLabelKeyLen {
		return fmt.Errorf("label key %q must be 1-%d bytes", k, MaxLabelKeyLen)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || (c != '.' && c != '_' && c != '/' && c != '-')) {
			return fmt.Errorf("label key %q: want [A-Za-z0-9][A-Za-z0-9._/-]*", k)
		}
	}
	return nil
}

func validLabels(field string, labels map[string]string, maxLabels int) error {
	if len(labels) > maxLabels {
		return errdefs.InvalidArgument(field, "%d labels, at most %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		if err := validLabelKey(k); err != nil {
			return errdefs.InvalidArgument(field, "%v", err)
		}
		if len(v) > MaxLabelValueLen {
			return errdefs.InvalidArgument(field, "value of %q is %d bytes, at most %d", k, len(v), MaxLabelValueLen)
		}
		if err := noControl(field+"["+k+"]", v); err != nil {
			return err
		}
		if strings.ContainsRune(v, ',') {
			return errdefs.InvalidArgument(field, "value of %q contains a comma", k)
		}
	}
	return nil
}

func validResources(field string, r runtime.Resources) error {
	switch {
	case r.NanoCPUs < 0:
		return errdefs.InvalidArgument(field+".cpus", "must not be negative")
	case r.MemoryBytes < 0:
		return errdefs.InvalidArgument(field+".memory_bytes", "must not be negative")
	case r.PidsLimit < 0:
		return errdefs.InvalidArgument(field+".pids", "must not be negative")
	case r.DiskBytes < 0:
		return errdefs.InvalidArgument(field+".disk_bytes", "must not be negative")
	}
	return nil
}

// acquireHost is what the acquirer needs from the Manager; *Manager
// implements it. Every method ending in Locked is called with the
// Manager's mu held; the others without it.
type acquireHost interface {
	// now is the lease clock (manager.go).
	now() time.Time
	// enterLocked admits a call Close waits for; the acquirer's done ends
	// it. usableLocked reports why no call may start now (manager.go).
	enterLocked() error
	usableLocked() error
	// transitionLocked moves e to a state (manager.go).
	transitionLocked(e *entry, to State, reason string) error
	// persist writes a snapshot of a lease (manager.go).
	persist(l Lease, rev uint64) error
	// endOpLocked gives e back from its creation with the outcome and
	// queues what is left to do, e.g. the removal of a lease that failed
	// or was released meanwhile (work.go).
	endOpLocked(e *entry, o *op, err error)
	// goBackground runs f on a goroutine Close waits for (manager.go).
	goBackground(f func())
	// Resume resumes a PAUSED lease: an acquire of its conversation
	// (pause.go).
	Resume(ctx context.Context, id string) (Lease, error)
}

var _ acquireHost = (*Manager)(nil)

// acquirer is the acquire path: it checks an acquire, returns the
// conversation's live lease or joins its creation, and creates a lease and
// its sandbox (cold, or by claiming a warm pool's). Its state is guarded
// by the Manager's mu, which it shares with the Manager's maps: the
// methods named ...Locked are called with it held; those documented as
// releasing it are entered with it held; the others take it themselves.
type acquirer struct {
	host acquireHost
	rt   Runtime // the Manager's (Config.Runtime)
	log  *slog.Logger
	// done ends a call enterLocked admitted (the Manager's wg.Done).
	done func()

	// Of the Manager's Config (defaults applied): an acquire's defaults
	// and bounds (validate) ...
	defaultImage                           string
	defaultTTL, maxTTL, defaultIdleTimeout time.Duration
	pause                                  PauseConfig   // the idle policies (pause.go)
	net                                    NetworkConfig // policies, enforcement, name servers (network.go)
	// ... and what a sandbox is created with (create).
	instanceID   string
	readyTimeout time.Duration
	appPort      int
	denyRoot     bool

	// The components an acquire goes through: admission (limits.go),
	// volumes (volumes.go), forks (snapshot.go), the fleet (replicas.go)
	// and the warm pools (pool.go). New sets fleet and pools after
	// building them, as the pools validate their profiles with validate
	// and the fleet creates leases with startCreateID.
	admit   *admission
	vols    *volumeKeeper
	snaps   *snapshotKeeper
	fleet   *fleet
	pools   *poolSet
	network *networkKeeper // the network policies' enforcement (network.go)
	queue   *workQueue     // removals of the leases it expires (work.go)
	tokens  *Tokens        // a lease's token, and its agent's (token.go)
	// drain refuses new leases while draining (drain.go). New sets it.
	drain *drainer

	mu     *sync.Mutex       // the Manager's
	leases map[string]*entry // the Manager's, written with mu held
	byConv map[string]*entry // the Manager's, written with mu held
	counts map[State]int     // the Manager's, written with mu held
	// created counts the leases created since New (Stats). Guarded by mu.
	created uint64
}

// newAcquirer returns the acquire path of a Manager configured by cfg
// (defaults applied): host is the Manager, done its wg.Done; admit, vols
// and snaps its components; mu, leases, byConv and counts its own. The
// caller sets fleet, pools and draining.
func newAcquirer(cfg Config, host acquireHost, done func(), admit *admission, vols *volumeKeeper, snaps *snapshotKeeper,
	mu *sync.Mutex, leases, byConv map[string]*entry, counts map[State]int) *acquirer {
	return &acquirer{host: host, rt: cfg.Runtime, log: cfg.Logger, done: done,
		defaultImage: cfg.DefaultImage, defaultTTL: cfg.DefaultTTL, maxTTL: cfg.MaxTTL, defaultIdleTimeout: cfg.DefaultIdleTimeout,
		pause: cfg.Pause, net: cfg.Network,
		instanceID: cfg.InstanceID, readyTimeout: cfg.ReadyTimeout, appPort: cfg.AppPort, denyRoot: cfg.Admission.DenyRootUser,
		admit: admit, vols: vols, snaps: snaps, mu: mu, leases: leases, byConv: byConv, counts: counts}
}

// validate checks req and returns it with defaults applied.
func (a *acquirer) validate(req AcquireRequest) (AcquireRequest, error) {
	switch {
	case req.ConversationID == "":
		return req, errdefs.InvalidArgument("conversation_id", "required")
	case len(req.ConversationID) > MaxConversationIDLen:
		return req, errdefs.InvalidArgument("conversation_id", "%d bytes, at most %d", len(req.ConversationID), MaxConversationIDLen)
	}
	if err := noControl("conversation_id", req.ConversationID); err != nil {
		return req, err
	}
	if len(req.Owner) > MaxOwnerLen {
		return req, errdefs.InvalidArgument("owner", "%d bytes, at most %d", len(req.Owner), MaxOwnerLen)
	}
	if err := noControl("owner", req.Owner); err != nil {
		return req, err
	}
	if err := req.App.validate(); err != nil {
		return req, err
	}
	if err := validateWorkDir(req.WorkDir); err != nil {
		return req, err
	}
	if req.Image == "" {
		req.Image = a.defaultImage
	}
	if len(req.Image) > MaxImageLen || strings.ContainsFunc(req.Image, unicode.IsSpace) {
		return req, errdefs.InvalidArgument("image", "%q is not an image reference", req.Image)
	}
	if err := noControl("image", req.Image); err != nil {
		return req, err
	}
	var userImage string // the image whose user defaults apply
	if req.fork != nil {
		// A snapshot was made of an allowed image; its user defaults
		// follow the image the snapshotted lease ran.
		userImage = req.fork.Image
	} else {
		// The engine opens the normalised reference that is checked here.
		ir, err := runtime.ParseImageRef("image", req.Image)
		if err != nil {
			return req, err
		}
		if ir.Snapshot {
			return req, errdefs.InvalidArgument("image", "%q is a snapshot; fork it with snapshot NAME", req.Image)
		}
		req.Image, userImage = ir.Ref, ir.Ref
		if err := a.admit.checkImage(req.Image); err != nil { // limits.go
			return req, err
		}
	}
	user, err := a.admit.leaseUser(userImage, req.User) // user.go
	if err != nil {
		return req, err
	}
	req.User = user
	switch {
	case req.TTL < 0:
		return req, errdefs.InvalidArgument("ttl", "%s is negative", req.TTL)
	case req.TTL > a.maxTTL:
		return req, errdefs.InvalidArgument("ttl", "%s exceeds the maximum of %s", req.TTL, a.maxTTL)
	case req.TTL == 0:
		req.TTL = a.defaultTTL
	}
	switch {
	case req.IdleTimeout < 0:
		return req, errdefs.InvalidArgument("idle_timeout", "%s is negative", req.IdleTimeout)
	case req.IdleTimeout == 0:
		req.IdleTimeout = a.defaultIdleTimeout
	}
	if req.IdlePolicy, err = a.pause.idlePolicy(a.rt, "idle_policy", req.IdlePolicy); err != nil { // pause.go
		return req, err
	}
	if err := a.admit.checkSizes(req); err != nil { // limits.go
		return req, err
	}
	for k, v := range req.Env {
		if err := validEnvVar("env", k, v); err != nil {
			return req, err
		}
	}
	for k, v := range req.Secrets {
		if _, ok := req.Env[k]; ok || strings.Contains(k, ",") {
			return req, errdefs.InvalidArgument("secrets."+k, "a secret's name may not contain ',' nor also be in env")
		}
		if err := validEnvVar("secrets."+k, k, v); err != nil {
			return req, err
		}
	}
	if err := validResources("resources", req.Resources); err != nil {
		return req, err
	}
	if err := a.admit.checkPublicPorts(req); err != nil { // limits.go
		return req, err
	}
	for _, p := range req.PublicPorts {
		if p < 1 || p > 65535 {
			return req, errdefs.InvalidArgument("public_ports", "port %d is not in 1-65535", p)
		}
	}
	if req.Network, err = a.net.admit(req.Network); err != nil { // network.go
		return req, err
	}
	if req.Resources, err = a.admit.resources("resources", req.Resources); err != nil { // limits.go
		return req, err
	}
	if req, err = a.vols.validateMounts(req); err != nil {
		return req, err
	}
	req.Labels = maps.Clone(req.Labels)
	req.Env = maps.Clone(req.Env)
	req.Secrets = maps.Clone(req.Secrets)
	return req, nil
}

// validEnvVar checks one variable of env or secrets; errors name field.
func validEnvVar(field, k, v string) error {
	switch {
	case k == "" || len(k) > MaxEnvKeyLen || strings.ContainsAny(k, "=\x00") || strings.ContainsFunc(k, unicode.IsSpace):
		return errdefs.InvalidArgument(field, "bad variable name %q", k)
	case strings.HasPrefix(k, ReservedEnvPrefix):
		return errdefs.InvalidArgument(field, "%s: names starting with %s are reserved", k, ReservedEnvPrefix)
	case len(v) > MaxEnvValueLen || strings.ContainsRune(v, 0):
		return errdefs.InvalidArgument(field, "value of %s: at most %d bytes, no NUL", k, MaxEnvValueLen)
	}
	return nil
}

// Acquire returns the live lease of req.ConversationID, creating it and its
// sandbox when there is none, with the lease's token and whether this call
// created it.
//
// Idempotent by (owner, conversation): concurrent and repeated acquires of
// one owner's conversation create one sandbox and all get the same lease and token. A
// caller arriving while the lease is PENDING waits for the creation's
// outcome and shares it (success or error). Returning an existing lease
// counts as activity; it neither renews it nor applies the request's other
// fields. A conversation whose lease is RELEASING, or ended, gets a new lease.
//
// Errors: errdefs.ErrInvalidArgument naming the field (also for resources
// above AdmissionConfig.MaxResources); errdefs.ErrPermissionDenied naming image for
// an image outside AdmissionConfig.AllowedImages; errdefs.ErrResourceExhausted with a
// RetryAfter hint when MaxLive leases, or MaxLivePerOwner leases of the
// owner, are live; the runtime's error, category preserved (e.g. NotFound
// for a missing image), when the sandbox could not be created — the lease
// record is then FAILED with that reason; errdefs.ErrUnavailable when the
// Manager is not running; ctx's error when the caller gives up.
//
// The sandbox is created with a context detached from ctx (bounded by
// ReadyTimeout): a caller who gives up does not leave half a sandbox — the
// creation finishes, and a retry gets the lease.
func (m *Manager) Acquire(ctx context.Context, req AcquireRequest) (l Lease, token string, created bool, err error) {
	return m.acq.acquire(ctx, req)
}

// acquire is Manager.Acquire.
func (a *acquirer) acquire(ctx context.Context, req AcquireRequest) (l Lease, token string, created bool, err error) {
	if req, err = a.snaps.resolveFork(ctx, req); err != nil {
		return Lease{}, "", false, err
	}
	req, err = a.validate(req)
	if err != nil {
		return Lease{}, "", false, err
	}
	if req, err = a.vols.listOwnerVolumes(ctx, req); err != nil { // volumes.go
		return Lease{}, "", false, err
	}
	if err := ctx.Err(); err != nil {
		return Lease{}, "", false, err
	}
	a.mu.Lock()
	err = a.host.enterLocked()
	a.mu.Unlock()
	if err != nil {
		return Lease{}, "", false, err
	}
	defer a.done()
	for {
		// One hold of a.mu looks the conversation up and starts the step it
		// needs; each step releases a.mu before it waits or writes.
		a.mu.Lock()
		if err := a.host.usableLocked(); err != nil {
			a.mu.Unlock()
			return Lease{}, "", false, err
		}
		e := a.byConv[convKey(req.Owner, req.ConversationID)]
		switch {
		case e != nil && e.l.State == StatePending && e.op == nil && a.fleet.shared != nil:
			// Another replica is creating it (replicas.go): wait, look again.
			id := e.l.ID
			a.mu.Unlock()
			if err = a.fleet.awaitRemotePending(ctx, id, 2*a.fleet.readyTimeout); err == nil {
				continue
			}
		case e != nil && e.l.State == StatePending:
			l, err = a.joinPending(ctx, e)
		case e != nil && e.l.State == StatePaused:
			// Acquiring a paused conversation resumes it.
			id := e.l.ID
			a.mu.Unlock()
			l, err = a.host.Resume(ctx, id)
		case e != nil && e.l.State == StateReady:
			var ok bool
			if l, ok = a.existing(e); !ok {
				continue // it had expired: look again
			}
		case a.drain.drainingLocked(): // drain.go: no new lease while draining
			err = a.drain.refusalLocked("acquire")
			a.mu.Unlock()
		case a.fleet.shared != nil: // no live lease here; maybe on another replica (replicas.go)
			// A warm member, claimed in the runtime (poolshared.go), unless
			// the live limits refuse the acquire anyway (startCreateID
			// checks them again): a refused acquire wastes no member.
			claimable := a.admit.checkLiveLimitsLocked(req) == nil
			a.mu.Unlock()
			var retry bool
			var c *claim
			if claimable {
				c = a.pools.claimShared(ctx, req)
			}
			if l, retry, err = a.fleet.acquireShared(ctx, req, c); retry && err == nil {
				continue // the conversation is another lease's: join it
			}
			created = err == nil
		default: // no live lease
			l, err = a.startCreate(ctx, req)
			created = err == nil
		}
		if err != nil {
			return Lease{}, "", false, err
		}
		return l, a.tokens.Token(l.ID), created, nil
	}
}

// joinPending waits for the creation (or in-place restart) already
// running for e's conversation and shares its outcome. Called with a.mu
// held; it releases a.mu.
func (a *acquirer) joinPending(ctx context.Context, e *entry) (Lease, error) {
	id, o := e.l.ID, e.op
	a.mu.Unlock()
	if o == nil || (o.kind != opCreate && o.kind != opRestart) { // cannot happen: PENDING in byConv is always creating
		return Lease{}, fmt.Errorf("%w: lease %s is PENDING with no creation", errdefs.ErrInternal, id)
	}
	return o.outcome(ctx)
}

// existing returns the READY lease e, counting the call as activity. A lease
// past its time but not reaped yet is expired now instead, so the caller gets
// a fresh lease rather than a dying one: existing then reports false and the
// caller looks again. Called with a.mu held; it releases a.mu.
func (a *acquirer) existing(e *entry) (Lease, bool) {
	if reason := expiryReason(&e.l, a.host.now()); reason != "" {
		if err := a.host.transitionLocked(e, StateExpired, reason); err == nil {
			l, rev := e.snapshot()
			a.mu.Unlock()
			_ = a.host.persist(l, rev)
			a.mu.Lock()
			a.queue.addRemovalLocked(e) // work.go
			a.mu.Unlock()
			return Lease{}, false
		}
	}
	e.l.LastActivityAt = a.host.now()
	e.activityDirty = true
	l := e.l.Clone()
	a.mu.Unlock()
	return l, true
}

// startCreate creates a lease for req, whose conversation has no live lease:
// it checks the live limits, records the PENDING lease (in memory, then in
// the store), starts the sandbox's creation in the background and waits for
// it. Called with a.mu held; it releases a.mu.
func (a *acquirer) startCreate(ctx context.Context, req AcquireRequest) (Lease, error) {
	return a.startCreateID(ctx, req, "", nil)
}

// startCreateID is startCreate for the lease id id ("": a new one, or a
// warm pool's). With a SharedStore the id is the one the conversation's
// lock names: a new one, or that of the warm member c the fleet's replica
// claimed already (poolshared.go), which it takes (or gives up when the
// acquire fails here). Called with a.mu held; it releases a.mu.
func (a *acquirer) startCreateID(ctx context.Context, req AcquireRequest, id string, c *claim) (Lease, error) {
	refuse := func(err error) (Lease, error) {
		a.mu.Unlock()
		a.pools.releaseClaim(c) // poolshared.go
		return Lease{}, err
	}
	if err := a.admit.checkLiveLimitsLocked(req); err != nil { // limits.go
		return refuse(err)
	}
	if err := a.vols.volumeFreeLocked(req); err != nil { // volumes.go
		return refuse(err)
	}
	if err := a.vols.volumeLimitLocked(req); err != nil { // volumes.go
		return refuse(err)
	}
	// A warm pool's sandbox, when one matches (pool.go).
	if p := a.pools.forLocked(req); c == nil && p != nil && id == "" && !req.Persist && len(req.Mounts) == 0 && req.App == nil && req.WorkDir == "" { // pooled sandboxes mount nothing, run no app and keep the image's directory
		if mb, ok := a.pools.takeLocked(p); ok {
			c = &claim{pool: p.cfg.Name, m: mb}
		}
	}
	e := a.addPendingLocked(req, c, id)
	a.pools.startConfigureLocked(ctx, c, e.l.ID, req) // pool.go
	l, rev := e.snapshot()
	o := e.op // create ends it when it is done
	a.mu.Unlock()

	// Crash safety: the record exists before the container can. A claim's
	// container exists already and is its pool's until the READY record
	// is written (pool.go: its agent's one-shot Configure keeps that safe).
	if c == nil {
		if err := a.host.persist(l, rev); err != nil {
			a.abandon(e, err)
			return Lease{}, wrapf(err, "acquire: persist lease %s", l.ID)
		}
	}
	a.host.goBackground(func() { a.create(context.WithoutCancel(ctx), e, o) })
	return o.outcome(ctx)
}

// addPendingLocked records a new PENDING lease for req, held by its
// creation (an opCreate carrying claim c, if any), as its conversation's
// lease. Called with a.mu held.
func (a *acquirer) addPendingLocked(req AcquireRequest, c *claim, id string) *entry {
	now := a.host.now()
	if id == "" {
		id = newID(now)
	}
	if c != nil {
		id = c.m.id // the pooled sandbox's labels name this id
	}
	e := &entry{
		l: Lease{
			ID:             id,
			ConversationID: req.ConversationID,
			Owner:          req.Owner,
			Instance:       a.instanceID,
			Labels:         req.Labels,
			Image:          req.Image,
			User:           req.User,
			Env:            req.Env,
			SecretNames:    slices.Sorted(maps.Keys(req.Secrets)),
			Resources:      req.Resources,
			PublicPorts:    req.PublicPorts,
			Network:        netOf(req.Network),
			Volume:         a.vols.volumeFor(req),
			Mounts:         a.vols.hostMounts(req),
			App:            req.App,
			WorkDir:        req.WorkDir,
			CreatedAt:      now,
			ExpiresAt:      now.Add(req.TTL),
			LastActivityAt: now,
			TTL:            req.TTL,
			IdleTimeout:    req.IdleTimeout,
			IdlePolicy:     req.IdlePolicy,
		},
		ended:   make(chan struct{}),
		secrets: req.Secrets,
	}
	beginOpLocked(e, opCreate).claim = c
	a.leases[e.l.ID] = e
	a.counts[StateUnspecified]++ // balanced by transitionLocked
	reason := "acquired"
	if req.fork != nil {
		reason = "acquired: fork of snapshot " + req.fork.Name
	}
	if err := a.host.transitionLocked(e, StatePending, reason); err != nil {
		panic(err) // "" → PENDING is always allowed
	}
	delete(a.counts, StateUnspecified)
	a.byConv[convKey(req.Owner, req.ConversationID)] = e
	a.created++
	return e
}

// abandon forgets a lease whose PENDING record could not be written.
func (a *acquirer) abandon(e *entry, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if key := convKey(e.l.Owner, e.l.ConversationID); a.byConv[key] == e {
		delete(a.byConv, key)
	}
	delete(a.leases, e.l.ID)
	a.counts[e.l.State]--
	a.admit.trackLiveLocked(e.l.Owner, e.l.State, StateUnspecified)
	o := e.op
	e.op = nil
	o.err = wrapf(err, "acquire: persist lease %s", e.l.ID)
	o.finish()
	if !e.l.State.Ended() {
		close(e.ended) // wake a Release that raced with the failed acquire
	}
}

// create runs Runtime.Create for a PENDING lease, which o holds, and
// records the outcome; a lease that failed, or was released meanwhile, is
// queued for the removal of what is left (endOpLocked). ctx carries the
// caller's values but not its cancellation.
func (a *acquirer) create(ctx context.Context, e *entry, o *op) {
	a.mu.Lock()
	id, spec := e.l.ID, runtime.Spec{
		LeaseID:        e.l.ID,
		ConversationID: e.l.ConversationID,
		InstanceID:     a.instanceID,
		Image:          e.l.Image,
		AgentToken:     a.tokens.AgentToken(e.l.ID),
		Env:            maps.Clone(e.l.Env),
		Secrets:        e.secrets,
		Labels:         maps.Clone(e.l.Labels),
		Resources:      e.l.Resources,
		ReadyTimeout:   a.readyTimeout,
		User:           e.l.User,
		DenyRootUser:   a.denyRoot,
		Mounts:         a.vols.specMounts(&e.l), // volumes.go
		DNS:            a.net.dns(),             // network.go
		WorkDir:        e.l.WorkDir,
	}
	if app := e.l.App; app != nil {
		spec.App = &runtime.App{Command: slices.Clone(app.Command), Port: a.appPort, WorkDir: app.WorkDir, Key: a.tokens.Token(e.l.ID)}
	}
	e.secrets = nil // in the container's environment now; not kept here
	hostMounts := slices.Clone(e.l.Mounts)
	c := o.claim
	o.claim = nil
	a.mu.Unlock()

	start := time.Now()
	// The runtime bounds its own work by ReadyTimeout; the extra grace lets
	// its (more precise) timeout error win over ours.
	cctx, cancel := context.WithTimeout(ctx, a.readyTimeout+5*time.Second)
	var sb runtime.Sandbox
	var err error
	how := "sandbox ready"
	var record <-chan error // a warm claim's READY record, written while its agent is configured
	var recordRev uint64
	netDone := false
	if c != nil { // a warm pool's sandbox (pool.go)
		// The record, the network policy and the agent's Configure run
		// side by side; the lease is READY once all three are done.
		record, recordRev = a.writeClaimRecord(e, c)
		netErr := a.claimNetwork(cctx, c, id)
		var warm bool
		sb, warm, err = a.pools.claimSandbox(cctx, c, spec)
		nerr := <-netErr
		if warm {
			how = "claimed from pool " + c.pool
			err, netDone = nerr, true
		}
	} else if err = a.vols.verifyHostMounts(id, hostMounts); err == nil { // volumes.go: unchanged since validate
		sb, err = a.rt.Create(cctx, spec)
	}
	if err == nil && !netDone {
		err = a.network.enforce(cctx, id, sb.Endpoint) // network.go
	}
	cancel()
	if record != nil {
		if rerr := <-record; rerr != nil && err == nil {
			err = fmt.Errorf("persist the claim: %w", rerr)
		}
	}
	took := time.Since(start)

	a.mu.Lock()
	now := a.host.now()
	var claimed bool
	switch {
	case err == nil && e.l.State == StatePending:
		e.l.ContainerID, e.l.Endpoint = sb.ID, sb.Endpoint
		e.l.DiskEnforcement = sb.DiskEnforcement
		e.l.ExpiresAt = now.Add(e.l.TTL)
		e.l.LastActivityAt = now
		if c != nil && how != "sandbox ready" {
			e.l.Pool = c.pool
			// Nothing else written since the claim's record: it holds.
			claimed = e.rev == recordRev
		}
		_ = a.host.transitionLocked(e, StateReady, fmt.Sprintf("%s in %s", how, took.Round(time.Millisecond)))
		a.host.endOpLocked(e, o, nil)
	case err == nil: // released while being created: endOpLocked queues its removal
		e.l.ContainerID, e.l.Endpoint = sb.ID, sb.Endpoint
		e.rev++
		a.host.endOpLocked(e, o, errNotUsable(&e.l))
	default:
		err = wrapf(err, "lease %s: create sandbox from image %q", id, spec.Image)
		if e.l.State == StatePending {
			_ = a.host.transitionLocked(e, StateFailed, err.Error())
		}
		// The runtime promises nothing is left behind; removal by label
		// (queued by endOpLocked) makes sure, and is what finishes a
		// release during creation.
		a.host.endOpLocked(e, o, err)
	}
	l, rev := e.snapshot()
	a.mu.Unlock()
	if claimed {
		// The claim's READY record is durable already (writeClaimRecord);
		// this one drops its claiming phase and need not delay the answer.
		a.host.goBackground(func() { _ = a.host.persist(l, rev) })
	} else {
		_ = a.host.persist(l, rev)
	}
	a.vols.noteVolumeUsed(l) // volumes.go
	o.finish()
	if c != nil {
		a.pools.answered() // the refill waits for the claims' answers (takeLocked)
	}
	if err != nil {
		a.log.Warn("sandbox creation failed", "lease_id", id, "conversation_id", l.ConversationID, "image", spec.Image, "err", err)
	}
}
