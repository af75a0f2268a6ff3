package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

const (
	// logTail is how many of the container's last log lines a failed Create
	// reports.
	logTail = 20
	// cleanupTimeout bounds the removal of a container whose Create failed;
	// it runs even when the caller's context is done.
	cleanupTimeout = 20 * time.Second
)

// ContainerName is the name of the container of lease leaseID. Naming by
// lease makes Create at most once per lease: a second Create for the same
// lease fails with errdefs.ErrAlreadyExists while the first container exists.
func ContainerName(leaseID string) string { return "berth-" + leaseID }

func validateSpec(spec runtime.Spec) error { return spec.Validate() }

// Create creates a hardened container from spec.Image (which must be present
// locally; any image works, even one with no files), injects the agent and
// its token (see Injection), starts it and waits until GET /healthz answers
// 200 at the returned Endpoint. The whole of it is bounded by Spec.ReadyTimeout
// (default Config.ReadyTimeout). On any failure the container is removed and
// the error includes its last log lines.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if err := validateSpec(spec); err != nil {
		return runtime.Sandbox{}, err
	}
	r.negotiate(ctx)
	began := time.Now()
	timeout := spec.ReadyTimeout
	if timeout == 0 {
		timeout = r.cfg.ReadyTimeout
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	log := r.log.With("lease_id", spec.LeaseID, "image", spec.Image)

	img, err := r.cli.ImageInspect(ctx, spec.Image)
	if err != nil {
		mapped := r.mapErr(err, "inspect image", spec.Image)
		if errdefs.IsNotFound(mapped) {
			return runtime.Sandbox{}, fmt.Errorf("%w: image %s is not present locally; berth builds images locally (make images) since no registry is reachable",
				errdefs.ErrNotFound, spec.Image)
		}
		return runtime.Sandbox{}, r.timeoutErr(parent, ctx, timeout, mapped)
	}
	if img.Os != "" && img.Os != "linux" {
		return runtime.Sandbox{}, errdefs.InvalidArgument("image", "%s is a %s image; berth runs linux images", spec.Image, img.Os)
	}
	var imgUser, imgWorkDir string
	if img.Config != nil {
		imgUser, imgWorkDir = img.Config.User, img.Config.WorkingDir
	}
	workDir := imgWorkDir
	if workDir == "" {
		workDir = DefaultWorkDir
	}
	// The agent runs as root; it runs commands as the lease's user, by
	// default the image's own.
	if spec.User == "" {
		spec.User = imgUser
	}

	netID, err := r.ensureNetwork(ctx)
	if err != nil {
		return runtime.Sandbox{}, r.timeoutErr(parent, ctx, timeout, err)
	}
	var vol string
	if r.cfg.Injection == InjectVolume {
		if vol, err = r.ensureAgentVolume(ctx, spec.Image); err != nil {
			return runtime.Sandbox{}, r.timeoutErr(parent, ctx, timeout, err)
		}
	}

	disk := spec.Resources.DiskBytes
	if disk == 0 {
		disk = r.cfg.DefaultResources.DiskBytes
	}
	// The engine bounds the writable layer where its storage driver can
	// (StorageOpt size); where it cannot, the create fails, and berth
	// enforces the limit instead (see diskMode).
	useOpt := disk > 0 && r.diskMode(ctx) != diskBerth
	cfg, hc := r.containerConfig(spec, workDir, netID, vol)
	if useOpt {
		setDiskLimit(hc, disk)
	}
	name := ContainerName(spec.LeaseID)
	resp, err := r.containerCreate(ctx, cfg, hc, name)
	if useOpt {
		switch {
		case storageOptRefused(err) && ctx.Err() == nil:
			r.learnDisk(diskBerth, err.Error())
			useOpt, hc.StorageOpt = false, nil
			resp, err = r.containerCreate(ctx, cfg, hc, name)
		case err == nil:
			r.learnDisk(diskEngine, "")
		}
	}
	if err != nil && ctx.Err() == nil && errdefs.IsNotFound(r.mapErr(err, "", "")) {
		// The image is there (inspected above), so the network went away
		// behind our back: recreate it and retry once.
		r.forgetNetwork()
		if netID, err = r.ensureNetwork(ctx); err != nil {
			return runtime.Sandbox{}, r.timeoutErr(parent, ctx, timeout, err)
		}
		cfg, hc = r.containerConfig(spec, workDir, netID, vol)
		if useOpt {
			setDiskLimit(hc, disk)
		}
		resp, err = r.containerCreate(ctx, cfg, hc, name)
	}
	if err != nil {
		mapped := r.mapErr(err, "create container", name)
		if errdefs.IsFailedPrecondition(mapped) && strings.Contains(err.Error(), "already in use") {
			return runtime.Sandbox{}, fmt.Errorf("%w: docker: a sandbox for lease %s already exists (container %s): %w",
				errdefs.ErrAlreadyExists, spec.LeaseID, name, err)
		}
		return runtime.Sandbox{}, r.timeoutErr(parent, ctx, timeout, mapped)
	}
	if err := ctx.Err(); err != nil {
		// Cancelled or timed out while the engine was creating it.
		return runtime.Sandbox{}, r.failCreate(parent, resp.ID, spec.LeaseID,
			r.timeoutErr(parent, ctx, timeout, fmt.Errorf("docker: create container %s: %w", name, err)))
	}
	id := resp.ID
	log = log.With("container_id", id)
	for _, w := range resp.Warnings {
		log.Warn("docker create warning", "warning", w)
	}

	sb, err := r.startAndWait(ctx, id, spec, spec.User, imgWorkDir == "", workDir, log)
	if err != nil {
		if vol != "" {
			// Check the agent volume again next time, in case it was
			// removed (the engine silently recreates a missing one empty).
			r.forgetAgentVolume()
		}
		return runtime.Sandbox{}, r.failCreate(parent, id, spec.LeaseID, r.timeoutErr(parent, ctx, timeout, err))
	}
	sb.DiskEnforcement = diskEnforcement(disk, useOpt)
	log.Debug("sandbox ready", "endpoint", sb.Endpoint, "duration", time.Since(began), "disk_enforcement", sb.DiskEnforcement)
	return sb, nil
}

// containerCreate calls ContainerCreate without letting ctx cancel the
// request: an engine that received the request may create the container even
// though the client gave up, and it would be left behind with no id to remove
// it by. The caller checks ctx afterwards. The call is still bounded by
// cleanupTimeout.
func (r *Runtime) containerCreate(ctx context.Context, cfg *container.Config, hc *container.HostConfig, name string) (container.CreateResponse, error) {
	if err := ctx.Err(); err != nil {
		return container.CreateResponse{}, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return r.cli.ContainerCreate(cctx, cfg, hc, nil, nil, name)
}

// containerStart starts id. While another orchestrator's duplicate of the
// sandbox network exists (see ensureNetwork) the engine refuses to start
// containers with "network … is ambiguous"; the duplicate is removed within
// moments, so that error is retried for a short while.
func (r *Runtime) containerStart(ctx context.Context, id string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := r.cli.ContainerStart(ctx, id, container.StartOptions{})
		if err == nil || !strings.Contains(err.Error(), "is ambiguous") || time.Now().After(deadline) {
			return err
		}
		r.log.Debug("sandbox network name is ambiguous; retrying start", "container_id", id)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// containerConfig builds the container and host configuration: the agent as
// entrypoint, berth's labels, the limits and the hardening defaults.
func (r *Runtime) containerConfig(spec runtime.Spec, workDir, netID, agentVolume string) (*container.Config, *container.HostConfig) {
	instance := spec.InstanceID
	if instance == "" {
		instance = r.cfg.InstanceID
	}
	labels := map[string]string{
		runtime.LabelManaged:      "true",
		runtime.LabelLease:        spec.LeaseID,
		runtime.LabelConversation: spec.ConversationID,
		runtime.LabelInstance:     instance,
	}
	for k, v := range spec.Labels {
		labels[runtime.LabelUserPrefix+k] = v
	}
	env := make([]string, 0, len(spec.Env)+1)
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	entrypoint := []string{AgentPath,
		"--listen", "0.0.0.0:" + strconv.Itoa(runtime.AgentPort),
		"--workdir", workDir}
	if spec.User != "" {
		entrypoint = append(entrypoint, "--user", spec.User)
	}
	if spec.DenyRootUser {
		entrypoint = append(entrypoint, "--allow-root=false")
	}
	if agentVolume == "" {
		entrypoint = append(entrypoint, "--token-file", TokenPath)
	} else {
		// The volume is shared and read-only: the token comes in the
		// environment, which the agent clears for the commands it runs.
		env = append(env, "BERTH_AGENT_TOKEN="+spec.AgentToken)
	}

	res := spec.Resources
	if res.NanoCPUs == 0 {
		res.NanoCPUs = r.cfg.DefaultResources.NanoCPUs
	}
	if res.MemoryBytes == 0 {
		res.MemoryBytes = r.cfg.DefaultResources.MemoryBytes
	}
	if res.PidsLimit == 0 {
		res.PidsLimit = r.cfg.DefaultResources.PidsLimit
	}
	pids := res.PidsLimit
	noInit := false

	cfg := &container.Config{
		Image: spec.Image,
		// The agent is PID 1: it supervises itself, reaps orphans and
		// forwards SIGTERM. The image's own entrypoint and command do not
		// run (a user-specified Entrypoint makes Docker drop the image's Cmd).
		Entrypoint: entrypoint,
		Cmd:        nil,
		Env:        env, // merged by the engine over the image's environment
		Labels:     labels,
		WorkingDir: workDir,
		// The agent runs as root, so the commands it runs as the lease's
		// user (--user) can neither read its token nor signal it.
		User:       "0:0",
		StopSignal: "SIGTERM",
	}
	hc := &container.HostConfig{
		// The network's id, not its name: immune to a transiently duplicated
		// name (see ensureNetwork).
		NetworkMode: container.NetworkMode(netID),
		Resources: container.Resources{
			NanoCPUs:   res.NanoCPUs,
			Memory:     res.MemoryBytes,
			MemorySwap: res.MemoryBytes, // equal to Memory: no swap
			PidsLimit:  &pids,
		},
		SecurityOpt:   []string{"no-new-privileges:true"},
		CapDrop:       []string{"ALL"},
		CapAdd:        runtime.Capabilities(),
		Privileged:    false,
		Init:          &noInit,
		IpcMode:       container.IPCModePrivate,
		CgroupnsMode:  container.CgroupnsModePrivate,
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		// No PortBindings and no PublishAllPorts: the agent port is reachable
		// only over the bridge, i.e. from this host.
	}
	if agentVolume != "" {
		hc.Mounts = []mount.Mount{agentMount(agentVolume)}
	}
	return cfg, hc
}

// startAndWait injects the agent, starts the container and waits for the
// agent's health. The caller removes the container when it fails.
func (r *Runtime) startAndWait(ctx context.Context, id string, spec runtime.Spec, imgUser string, ownWorkDir bool, workDir string, log *slog.Logger) (runtime.Sandbox, error) {
	t0 := time.Now()
	var ws *workspaceDir
	if ownWorkDir {
		// The image sets no working directory: create /workspace owned by the
		// image's user, so a non-root image can write to it.
		uid, gid := r.resolveOwner(ctx, id, imgUser)
		ws = &workspaceDir{path: workDir, uid: uid, gid: gid}
	}
	if r.cfg.Injection == InjectCopy {
		if err := r.inject(ctx, id, archive{agent: true, token: spec.AgentToken, ws: ws}); err != nil {
			return runtime.Sandbox{}, err
		}
	} else if ws != nil && (ws.uid != 0 || ws.gid != 0) {
		// The engine creates the working directory owned by root; a
		// non-root image needs it to be its own.
		if err := r.inject(ctx, id, archive{ws: ws}); err != nil {
			return runtime.Sandbox{}, err
		}
	}
	t1 := time.Now()
	if err := r.containerStart(ctx, id); err != nil {
		mapped := r.mapErr(err, "start container", id)
		if errors.Is(mapped, errdefs.ErrInternal) {
			// The engine reports what stops a container from starting (a
			// missing user, an unusable working directory, a runc error)
			// as a server error; it is the image's or the spec's problem.
			return runtime.Sandbox{}, fmt.Errorf("%w: docker: container %s cannot start: %w", errdefs.ErrFailedPrecondition, id, err)
		}
		return runtime.Sandbox{}, mapped
	}
	t2 := time.Now()
	ins, err := r.cli.ContainerInspect(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, r.mapErr(err, "inspect container", id)
	}
	sb := r.fromInspect(ins)
	if sb.Endpoint == "" {
		if ins.State != nil && !ins.State.Running {
			return runtime.Sandbox{}, exitedErr(id, ins.State)
		}
		return runtime.Sandbox{}, errdefs.FailedPrecondition("docker: container %s has no address on network %s", id, r.cfg.Network)
	}
	if err := r.waitReady(ctx, id, sb.Endpoint); err != nil {
		return runtime.Sandbox{}, err
	}
	log.Debug("sandbox started", "inject", t1.Sub(t0), "start", t2.Sub(t1), "ready", time.Since(t2))
	sb.State = runtime.StateRunning
	return sb, nil
}

func exitedErr(id string, st *container.State) error {
	msg := fmt.Sprintf("docker: container %s exited with code %d before the agent was ready", id, st.ExitCode)
	if st.OOMKilled {
		msg += " (OOM-killed: raise the memory limit)"
	}
	if st.Error != "" {
		msg += ": " + st.Error
	}
	return fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, msg)
}

// waitReady polls the agent's /healthz until it answers 200, the container
// exits, or ctx ends.
func (r *Runtime) waitReady(ctx context.Context, id, endpoint string) error {
	return r.health.WaitReady(ctx, endpoint, func(ctx context.Context) error {
		ins, err := r.cli.ContainerInspect(ctx, id)
		if err != nil {
			return r.mapErr(err, "inspect container", id)
		}
		if ins.State != nil && !ins.State.Running {
			return exitedErr(id, ins.State)
		}
		return nil
	})
}

// timeoutErr turns an error caused by Create's own deadline into a clear
// "not ready within" error (Unavailable, still matching
// context.DeadlineExceeded); other errors pass through.
func (r *Runtime) timeoutErr(parent, ctx context.Context, timeout time.Duration, err error) error {
	if err == nil || parent.Err() != nil || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return err
	}
	if errdefs.IsUnavailable(err) {
		return err
	}
	return fmt.Errorf("%w: docker: sandbox not ready within %s (ReadyTimeout): %w", errdefs.ErrUnavailable, timeout, err)
}

// failCreate collects the container's last log lines, removes it (even when
// the caller's context is done) and returns err with the lines appended.
func (r *Runtime) failCreate(parent context.Context, id, leaseID string, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), cleanupTimeout)
	defer cancel()
	lines := r.tailLogs(ctx, id, logTail)
	if rmErr := r.remove(ctx, id); rmErr != nil {
		r.log.Warn("cannot remove container of failed create", "container_id", id, "lease_id", leaseID, "err", rmErr)
		err = fmt.Errorf("%w (removing container %s also failed: %v)", err, id, rmErr)
	}
	if lines != "" {
		err = fmt.Errorf("%w\ncontainer output (last %d lines):\n%s", err, logTail, lines)
	}
	r.log.Warn("create failed", "container_id", id, "lease_id", leaseID, "err", err)
	return err
}

// tailLogs returns the last n lines of the container's stdout and stderr,
// indented, or "" when there are none or they cannot be read.
func (r *Runtime) tailLogs(ctx context.Context, id string, n int) string {
	rc, err := r.cli.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: strconv.Itoa(n)})
	if err != nil {
		return ""
	}
	defer rc.Close()
	var buf bytes.Buffer
	// Both streams into one buffer, in the order the engine sends them.
	w := &capped{w: &buf, n: 64 << 10}
	_, _ = stdcopy.StdCopy(w, w, rc)
	text := strings.TrimRight(buf.String(), "\n")
	if text == "" {
		return ""
	}
	lines := strings.Split(text, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		lines[i] = "  " + strings.TrimRight(l, "\r")
	}
	return strings.Join(lines, "\n")
}

// capped writes at most n bytes to w and silently drops the rest.
type capped struct {
	w io.Writer
	n int
}

func (c *capped) Write(p []byte) (int, error) {
	l := len(p)
	if c.n <= 0 {
		return l, nil
	}
	if len(p) > c.n {
		p = p[:c.n]
	}
	c.n -= len(p)
	_, err := c.w.Write(p)
	return l, err
}

// errCopyDone ends the archive writer once the engine has stopped reading.
var errCopyDone = errors.New("copy finished")

// workspaceDir is a directory the injected archive creates, owned by uid:gid.
type workspaceDir struct {
	path     string
	uid, gid int
}

// inject copies /.berth/sandbox-agent, /.berth/token (and the workspace
// directory when berth chose it) into the created container through the
// engine's archive API, so the engine need not share our filesystem. The
// agent is streamed from disk; nothing large is held in memory.
func (r *Runtime) inject(ctx context.Context, id string, a archive) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := r.writeArchive(pw, a)
		pw.CloseWithError(err)
		done <- err
	}()
	err := r.cli.CopyToContainer(ctx, id, "/", pr, container.CopyToContainerOptions{})
	_ = pr.CloseWithError(errCopyDone)
	werr := <-done
	// A failure to read the agent (not one caused by the copy ending)
	// explains the copy's failure best.
	if werr != nil && !errors.Is(werr, errCopyDone) && !errors.Is(werr, io.ErrClosedPipe) {
		return fmt.Errorf("docker: inject agent into %s: %w", id, werr)
	}
	if err != nil {
		return r.mapErr(err, "copy agent into container", id)
	}
	if werr != nil {
		return fmt.Errorf("docker: inject agent into %s: %w", id, werr)
	}
	return nil
}

// archive is what one injection copies into a container.
type archive struct {
	agent bool          // /.berth/sandbox-agent
	token string        // /.berth/token when not empty
	ws    *workspaceDir // the working directory, when not nil
}

type archiveEntry struct {
	h    tar.Header
	body io.Reader
}

// writeArchive writes the injection tar stream to w.
func (r *Runtime) writeArchive(w io.Writer, a archive) error {
	now := time.Now()
	dir := strings.TrimPrefix(AgentDir, "/") + "/"
	var entries []archiveEntry
	if a.agent || a.token != "" {
		entries = append(entries, archiveEntry{h: tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: now}})
	}
	if a.agent {
		f, err := os.Open(r.cfg.AgentBinary)
		if err != nil {
			return fmt.Errorf("open agent binary: %w", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("stat agent binary: %w", err)
		}
		entries = append(entries, archiveEntry{h: tar.Header{Typeflag: tar.TypeReg, Name: dir + "sandbox-agent", Mode: 0o755, Size: st.Size(), ModTime: now}, body: f})
	}
	if a.token != "" {
		// Readable by root only: the agent runs as root, the commands as
		// the lease's user, who must not read it (unless that is root).
		entries = append(entries, archiveEntry{h: tar.Header{Typeflag: tar.TypeReg, Name: dir + "token", Mode: 0o400, Size: int64(len(a.token)), ModTime: now}, body: strings.NewReader(a.token)})
	}
	if ws := a.ws; ws != nil {
		entries = append(entries, archiveEntry{h: tar.Header{Typeflag: tar.TypeDir, Name: strings.Trim(ws.path, "/") + "/", Mode: 0o755, Uid: ws.uid, Gid: ws.gid, ModTime: now}})
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := e.h
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return err
		}
		if e.body != nil {
			n, err := io.CopyN(tw, e.body, h.Size)
			if err != nil {
				return fmt.Errorf("write %s (%d of %d bytes): %w", h.Name, n, h.Size, err)
			}
		}
	}
	return tw.Close()
}
