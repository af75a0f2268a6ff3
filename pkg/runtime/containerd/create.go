package containerd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	ctd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

const (
	// maxContainerID is containerd's limit on identifiers.
	maxContainerID = 76
	// staleSnapshotAge is how old a snapshot without its container must be
	// to be taken for a leftover (containerd creates the container right
	// after the snapshot).
	staleSnapshotAge = time.Minute
	// cpuPeriod is the CFS period the CPU quota is expressed in (100 ms, as
	// Docker's NanoCPUs).
	cpuPeriod = 100_000
)

// defaultPath is the PATH of a sandbox whose image sets none (Docker's).
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

var (
	// containerIDRE is containerd's identifier syntax (pkg/identifiers).
	containerIDRE = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)
)

// ContainerID is the containerd container id of lease leaseID's sandbox:
// "berth-" + leaseID when that is a valid containerd identifier of at most
// 76 characters (lease ids made by the lease manager always are), otherwise
// "berth-" + the first 32 hex digits of the lease id's SHA-256. Deriving the
// id from the lease makes Create at most once per lease: a second Create for
// a lease whose container exists fails with errdefs.ErrAlreadyExists. The id
// also names the sandbox's network namespace and host directory.
func ContainerID(leaseID string) string {
	id := "berth-" + leaseID
	if len(id) <= maxContainerID && containerIDRE.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(leaseID))
	return "berth-" + hex.EncodeToString(sum[:16])
}

// engineName and sandboxNoun name the backend and what it creates in
// messages.
const (
	engineName  = "containerd"
	sandboxNoun = "sandbox"
)

// backend describes the containerd backend to the Create logic shared by
// every backend (runtime.Backend): its failed creates are undone with Remove
// (task, network, namespace, host files, container, snapshot) and report
// the sandbox's last output lines.
func (r *Runtime) backend() runtime.Backend {
	return runtime.Backend{Name: engineName, Noun: sandboxNoun, Log: r.log, Remove: r.Remove,
		Output: func(_ context.Context, id string, n int) string { return tailFile(r.logPath(id), n) }}
}

// Create creates a hardened container from spec.Image (which must have been
// imported into the namespace; any image works, even one with no files),
// gives it its own network namespace on the sandbox bridge, starts the agent
// as PID 1 and waits until GET /healthz answers 200 at the returned
// Endpoint. The whole of it is bounded by Spec.ReadyTimeout (default
// Config.ReadyTimeout). On any failure everything created so far (task,
// network, namespace, host files, container, snapshot) is removed, even when
// the caller's context is done, and the error includes the sandbox's last
// log lines.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return runtime.Sandbox{}, err
	}
	began := time.Now()
	cr, ctx, cancel := r.backend().BeginCreate(r.withNS(ctx), spec, r.cfg.ReadyTimeout)
	defer cancel()
	log := r.log.With("lease_id", spec.LeaseID, "image", spec.Image)

	img, info, err := r.image(ctx, spec.Image)
	if err != nil {
		return runtime.Sandbox{}, cr.Err(err)
	}
	if err := r.ensureHost(ctx); err != nil {
		return runtime.Sandbox{}, cr.Err(err)
	}
	id := ContainerID(spec.LeaseID)
	log = log.With("container_id", id)
	t0 := time.Now()
	log = log.With("prepare", t0.Sub(began)) // image lookup, host set-up
	c, err := r.newContainer(ctx, id, spec, img, info)
	if err != nil {
		return runtime.Sandbox{}, cr.Err(err)
	}
	if err := ctx.Err(); err != nil {
		// Cancelled or timed out while containerd was creating it.
		return runtime.Sandbox{}, cr.Fail(id, spec.LeaseID, fmt.Errorf("containerd: create container %s: %w", id, err))
	}
	sb, err := r.start(ctx, c, spec, log, t0)
	if err != nil {
		return runtime.Sandbox{}, cr.Fail(id, spec.LeaseID, err)
	}
	sb.DiskEnforcement = diskEnforcement(r.resources(spec).DiskBytes)
	log.Debug("sandbox ready", "endpoint", sb.Endpoint, "duration", time.Since(began), "disk_enforcement", sb.DiskEnforcement)
	return sb, nil
}

// newContainer creates the container object with its snapshot and OCI
// spec. The call is not cancelled by ctx (containerd may create the
// container although the client gave up, leaving one nobody knows about);
// it is bounded by runtime.CleanupTimeout and the caller checks ctx
// afterwards.
func (r *Runtime) newContainer(ctx context.Context, id string, spec runtime.Spec, img ctd.Image, info imageInfo) (ctd.Container, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// With user namespaces: the image's remapped snapshot (made by the
	// first sandbox of the image, see remappedParent).
	parent, err := r.remappedParent(ctx, img)
	if err != nil {
		return nil, err
	}
	cctx, cancel := runtime.Detached(ctx)
	defer cancel()
	unlock := r.createMu.lock(id) // two Creates of one lease in this process
	defer unlock()
	for attempt := 0; ; attempt++ {
		c, err := r.cli.NewContainer(cctx, id,
			ctd.WithSnapshotter(r.cfg.Snapshotter),
			r.snapshotOpt(id, img, parent),
			ctd.WithRuntime(r.cfg.RuntimeName, nil),
			ctd.WithContainerLabels(runtime.SandboxLabels(spec, r.cfg.InstanceID)),
			ctd.WithNewSpec(r.specOpts(id, spec, info)...),
		)
		if err == nil {
			return c, nil
		}
		var ue *userError
		if errors.As(err, &ue) {
			return nil, ue.err
		}
		mapped := r.mapErr(err, "create container", id)
		if !errdefs.IsAlreadyExists(mapped) || attempt > 0 {
			return nil, mapped
		}
		// Either the lease has a sandbox already (or another process is
		// creating it: its snapshot is young), or a snapshot named id was
		// left behind by a Create or Remove cut short.
		exists := r.backend().AlreadyExists(spec.LeaseID, id, err)
		if _, gerr := r.cli.ContainerService().Get(cctx, id); gerr == nil || !errdefs.IsNotFound(r.mapErr(gerr, "", "")) {
			return nil, exists
		}
		if info, serr := r.cli.SnapshotService(r.cfg.Snapshotter).Stat(cctx, id); serr == nil && time.Since(info.Created) < staleSnapshotAge {
			return nil, exists
		}
		r.log.Info("removing a stale snapshot left by an earlier sandbox", "container_id", id)
		if rerr := r.cli.SnapshotService(r.cfg.Snapshotter).Remove(cctx, id); rerr != nil && !errdefs.IsNotFound(r.mapErr(rerr, "", "")) {
			return nil, mapped
		}
	}
}

// resources returns spec's limits with the defaults filled in.
func (r *Runtime) resources(spec runtime.Spec) runtime.Resources {
	return spec.Resources.WithDefaults(r.cfg.DefaultResources)
}

// specOpts builds the OCI spec on top of containerd's default one (which
// brings the masked and read-only /proc paths, the default devices and
// namespaces, NoNewPrivileges): the agent as the process, the image's user
// and environment, the sandbox's network namespace, the bind mounts, the
// capability list, the limits and the default seccomp profile.
func (r *Runtime) specOpts(id string, spec runtime.Spec, info imageInfo) []oci.SpecOpts {
	res := r.resources(spec)
	workDir := info.config.WorkingDir
	if workDir == "" {
		workDir = runtime.DefaultWorkDir
	}
	keep := runtime.Capabilities()
	caps := make([]string, len(keep))
	for i, c := range keep {
		caps[i] = "CAP_" + c
	}
	dir := r.sandboxDir(id)
	bind := func(src, dst string, extra ...string) specs.Mount {
		return specs.Mount{Type: "bind", Source: src, Destination: dst,
			Options: append([]string{"rbind", "nosuid", "nodev"}, extra...)}
	}
	mounts := []specs.Mount{
		bind(filepath.Join(dir, "berth"), runtime.AgentDir, "ro"),
		// The agent's state (runtime.AgentStateDir): a host directory of
		// this sandbox's, so a snapshot (the rootfs diff) never holds it.
		bind(filepath.Join(dir, agentStateDir), runtime.AgentStateDir, "noexec", "rw"),
		bind(filepath.Join(dir, "hosts"), "/etc/hosts", "noexec", "rw"),
		bind(filepath.Join(dir, "hostname"), "/etc/hostname", "noexec", "rw"),
		bind(filepath.Join(dir, "resolv.conf"), "/etc/resolv.conf", "noexec", "rw"),
		{Type: "cgroup", Source: "cgroup", Destination: "/sys/fs/cgroup", Options: []string{"ro", "nosuid", "noexec", "nodev", "relatime"}},
	}
	mounts = append(mounts, r.volumeMounts(spec.Mounts)...) // workspace volumes, host paths
	quota := res.NanoCPUs * cpuPeriod / 1_000_000_000
	// The agent runs as root; it runs commands as the lease's user, by
	// default the image's own (resolved here too, so that a missing user
	// fails Create before anything runs).
	user := spec.User
	if user == "" {
		user = info.config.User
	}
	args := runtime.AgentCommand{WorkDir: spec.AgentWorkDir(workDir), KeepWorkDirOwner: spec.WorkDir != "", User: user, DenyRootUser: spec.DenyRootUser, App: spec.App}.Args()
	hostBase, _ := r.hostRoot()
	return []oci.SpecOpts{
		oci.WithDefaultUnixDevices,
		oci.WithProcessArgs(args...),
		oci.WithProcessCwd(workDir),
		withEnv(info.config.Env, spec.Environ()),
		withImageUser(user, info.config.WorkingDir == "", hostBase),
		r.withVolumes(spec.Mounts, hostBase), // owned by the user withImageUser set
		withRootAgent,
		r.withUserNS,
		oci.WithHostname(hostname(id)),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: r.netnsPath(id)}),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}),
		oci.WithMounts(mounts),
		oci.WithCapabilities(caps),
		oci.WithAmbientCapabilities(nil),
		oci.WithNoNewPrivileges,
		oci.WithCPUCFS(quota, cpuPeriod),
		oci.WithMemoryLimit(uint64(res.MemoryBytes)),
		oci.WithMemorySwap(res.MemoryBytes), // memory+swap = memory: no swap
		oci.WithPidsLimit(res.PidsLimit),
		withoutNofileLimit,
		seccomp.WithDefaultProfile(),
	}
}

// withEnv sets the environment: the image's, PATH if the image sets none,
// then spec's variables (sorted, replacing the image's of the same name).
func withEnv(image []string, extra map[string]string) oci.SpecOpts {
	env := append([]string(nil), image...)
	hasPath := false
	for _, kv := range env {
		hasPath = hasPath || strings.HasPrefix(kv, "PATH=")
	}
	if !hasPath {
		env = append([]string{defaultPath}, env...)
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	add := make([]string, 0, len(keys))
	for _, k := range keys {
		add = append(add, k+"="+extra[k])
	}
	return func(ctx context.Context, c oci.Client, cont *containers.Container, s *oci.Spec) error {
		s.Process.Env = env
		return oci.WithEnv(add)(ctx, c, cont, s)
	}
}

// withoutNofileLimit drops containerd's default RLIMIT_NOFILE of 1024 (too
// low for build tools), so sandboxes inherit containerd's limit as Docker's
// containers inherit dockerd's. (Raising it above containerd's own hard
// limit fails: the runtime may not raise a hard limit.)
func withoutNofileLimit(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	rl := s.Process.Rlimits[:0]
	for _, l := range s.Process.Rlimits {
		if l.Type != "RLIMIT_NOFILE" {
			rl = append(rl, l)
		}
	}
	s.Process.Rlimits = rl
	return nil
}

// hostname is the sandbox's host name: its container id, cut to 63
// characters (a DNS label).
func hostname(id string) string {
	if len(id) > 63 {
		id = strings.TrimRight(id[:63], "-._")
	}
	return id
}

// start prepares the sandbox's host files and network, creates and starts
// its task and waits for the agent. The caller removes everything when it
// fails.
func (r *Runtime) start(ctx context.Context, c ctd.Container, spec runtime.Spec, log *slog.Logger, t0 time.Time) (runtime.Sandbox, error) {
	id := c.ID()
	if err := r.writeSandboxFiles(id, spec.AgentToken, spec.DNS); err != nil {
		return runtime.Sandbox{}, err
	}
	t1 := time.Now()
	ni, err := r.setupNetwork(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	t2 := time.Now()
	if err := r.recordNetwork(ctx, id, ni); err != nil {
		return runtime.Sandbox{}, err
	}
	// Creating and starting the task are not cancelled half-way (runc
	// would be left with half a container: a task containerd registers after
	// the cleanup looked for it, or empty cgroups); ctx is checked after.
	tctx, cancel := runtime.Detached(ctx)
	defer cancel()
	task, err := c.NewTask(tctx, r.taskIO(id))
	if err != nil {
		return runtime.Sandbox{}, r.startErr(err, "create task", id)
	}
	t3 := time.Now()
	if err := ctx.Err(); err != nil {
		return runtime.Sandbox{}, fmt.Errorf("containerd: create task %s: %w", id, err)
	}
	if err := task.Start(tctx); err != nil {
		return runtime.Sandbox{}, r.startErr(err, "start task", id)
	}
	t4 := time.Now()
	endpoint := ni.endpoint()
	if err := r.waitReady(ctx, id, endpoint); err != nil {
		return runtime.Sandbox{}, err
	}
	log.Debug("sandbox started", "container", t1.Sub(t0), "network", t2.Sub(t1), "task", t3.Sub(t2), "start", t4.Sub(t3), "ready", time.Since(t4))
	info, err := c.Info(ctx, ctd.WithoutRefreshedMetadata)
	if err != nil {
		return runtime.Sandbox{}, r.mapErr(err, "get container", id)
	}
	sb := r.toSandbox(info, &tasktypes.Process{ContainerID: id, Status: tasktypes.Status_RUNNING})
	sb.Endpoint = endpoint
	return sb, nil
}

// startErr maps a task create/start failure: what keeps a container from
// starting (a runc error, a bad working directory) is the image's or the
// spec's problem, so FailedPrecondition rather than Internal.
func (r *Runtime) startErr(err error, op, id string) error {
	return r.backend().StartErr(id, err, r.mapErr(err, op, id))
}

// waitReady polls the agent's /healthz until it answers 200, the task
// stops, or ctx ends.
func (r *Runtime) waitReady(ctx context.Context, id, endpoint string) error {
	return r.health.WaitReady(ctx, endpoint, func(ctx context.Context) error {
		proc, err := r.taskProcess(ctx, id)
		if err != nil {
			return err
		}
		if proc == nil || proc.GetStatus() == tasktypes.Status_STOPPED {
			return r.exitedErr(ctx, id, proc)
		}
		return nil
	})
}

// exitedErr reports a sandbox whose agent exited before it was ready.
func (r *Runtime) exitedErr(ctx context.Context, id string, proc *tasktypes.Process) error {
	if proc == nil {
		return errdefs.FailedPrecondition("containerd: the task of %s disappeared before the agent was ready", id)
	}
	c, err := r.cli.ContainerService().Get(ctx, id)
	oom := err == nil && r.oomKilled(c)
	return r.backend().ExitedErr(id, int(proc.GetExitStatus()), oom, "")
}

// tailFile returns the last n lines of the file at path (read from its last
// 64 KiB), indented (runtime.TailLines), or "" when there are none or it
// cannot be read.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > max {
		_, _ = f.Seek(st.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	return runtime.TailLines(string(bytes.ToValidUTF8(b, []byte("?"))), n)
}

// Logs returns up to the last n lines of the sandbox's output (the agent's
// stdout and stderr, which the shim appends to StateDir/sandboxes/ID/log).
func (r *Runtime) Logs(ctx context.Context, id string, n int) (string, error) {
	if _, err := r.getManaged(r.withNS(ctx), id); err != nil {
		return "", err
	}
	text := tailFile(r.logPath(id), n)
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "  ")
	}
	return strings.Join(lines, "\n"), nil
}

// oomKilled reports whether the kernel OOM-killed a process of container c,
// read from its memory cgroup (which outlives the task's processes until the
// task is deleted): oom_kill in memory.oom_control (cgroup v1) or
// memory.events (cgroup v2).
func (r *Runtime) oomKilled(c containers.Container) bool {
	rel := filepath.Join(r.cfg.Namespace, c.ID) // containerd's default cgroupsPath /NS/ID
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory", rel, "memory.oom_control"),
		filepath.Join("/sys/fs/cgroup", rel, "memory.events"),
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n > 0
			}
		}
	}
	return false
}
