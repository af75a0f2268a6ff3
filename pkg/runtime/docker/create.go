package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
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

// engineName and sandboxNoun name the backend and what it creates in
// messages.
const (
	engineName  = "docker"
	sandboxNoun = "container"
)

// backend describes the Docker backend to the Create logic shared by every
// backend (runtime.Backend): its failed creates are undone with remove and
// report the container's last log lines.
func (r *Runtime) backend() runtime.Backend {
	return runtime.Backend{Name: engineName, Noun: sandboxNoun, Log: r.log, Output: r.tailLogs, Remove: r.remove}
}

// ContainerName is the name of the container of lease leaseID whose agent
// token is agentToken. Naming by lease makes Create at most once per lease:
// a second Create for the same lease (and token) fails with
// errdefs.ErrAlreadyExists while the first container exists. The name
// says nothing of the lease: Docker's embedded DNS answers other sandboxes'
// reverse lookups with it, so it is a hash keyed by the secret token, not
// the lease id, and a pool's member and the lease that claimed it look
// alike. The lease id is in the container's labels, which only the
// operator sees.
func ContainerName(leaseID, agentToken string) string {
	h := sha256.Sum256([]byte("berth-container-name\x00" + leaseID + "\x00" + agentToken))
	return "berth-" + hex.EncodeToString(h[:12])
}

// Create creates a hardened container from spec.Image (which must be present
// locally; any image works, even one with no files), injects the agent and
// its token (see Injection), starts it and waits until GET /healthz answers
// 200 at the returned Endpoint. The whole of it is bounded by Spec.ReadyTimeout
// (default Config.ReadyTimeout). On any failure the container is removed and
// the error includes its last log lines.
//
// With InjectVolume, a Create whose container found the agent volume empty
// (removed behind the runtime's back, e.g. by `docker volume prune -a`: the
// engine then silently creates an empty one for the mount) populates the
// volume again and creates the sandbox once more.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return runtime.Sandbox{}, err
	}
	r.negotiate(ctx)
	sb, err := r.create(ctx, spec)
	if errors.Is(err, errAgentVolumeEmptied) && ctx.Err() == nil {
		r.log.Warn("the agent volume was removed behind berth's back; populating it again and creating the sandbox once more", "lease_id", spec.LeaseID)
		sb, err = r.create(ctx, spec)
	}
	return sb, err
}

// errAgentVolumeEmptied marks a Create whose container found no agent in
// the agent volume.
var errAgentVolumeEmptied = errors.New("the agent volume is empty: it was removed while in use")

// create is one attempt of Create.
func (r *Runtime) create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	began := time.Now()
	b := r.backend()
	cr, ctx, cancel := b.BeginCreate(ctx, spec, r.cfg.ReadyTimeout)
	defer cancel()
	log := r.log.With("lease_id", spec.LeaseID, "image", spec.Image)

	img, err := r.cli.ImageInspect(ctx, spec.Image)
	if err != nil {
		mapped := r.mapErr(err, "inspect image", spec.Image)
		if errdefs.IsNotFound(mapped) {
			return runtime.Sandbox{}, fmt.Errorf("%w: image %s is not present locally; berth builds images locally (make images) since no registry is reachable",
				errdefs.ErrNotFound, spec.Image)
		}
		return runtime.Sandbox{}, cr.Err(mapped)
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
		workDir = runtime.DefaultWorkDir
	}
	// The agent runs as root; it runs commands as the lease's user, by
	// default the image's own.
	if spec.User == "" {
		spec.User = imgUser
	}

	netID, err := r.ensureNetwork(ctx)
	if err != nil {
		return runtime.Sandbox{}, cr.Err(err)
	}
	if err := r.ensureVolumes(ctx, spec.Mounts); err != nil {
		return runtime.Sandbox{}, cr.Err(err)
	}
	var vol string
	if r.cfg.Injection == InjectVolume {
		if vol, err = r.ensureAgentVolume(ctx, spec.Image); err != nil {
			return runtime.Sandbox{}, cr.Err(err)
		}
	}

	disk := spec.Resources.WithDefaults(r.cfg.DefaultResources).DiskBytes
	// The engine bounds the writable layer where its storage driver can
	// (StorageOpt size); where it cannot, the create fails, and berth
	// enforces the limit instead (see diskMode).
	useOpt := disk > 0 && r.diskMode(ctx) != diskBerth
	cfg, hc := r.containerConfig(spec, workDir, netID, vol)
	if useOpt {
		setDiskLimit(hc, disk)
	}
	name := ContainerName(spec.LeaseID, spec.AgentToken)
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
			return runtime.Sandbox{}, cr.Err(err)
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
			return runtime.Sandbox{}, b.AlreadyExists(spec.LeaseID, name, err)
		}
		return runtime.Sandbox{}, cr.Err(mapped)
	}
	if err := ctx.Err(); err != nil {
		// Cancelled or timed out while the engine was creating it.
		return runtime.Sandbox{}, cr.Fail(resp.ID, spec.LeaseID, fmt.Errorf("docker: create container %s: %w", name, err))
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
			if r.agentVolumeEmpty(ctx, id) {
				err = fmt.Errorf("%w: %w", errAgentVolumeEmptied, err)
			}
		}
		return runtime.Sandbox{}, cr.Fail(id, spec.LeaseID, err)
	}
	sb.DiskEnforcement = diskEnforcement(disk, useOpt)
	log.Debug("sandbox ready", "endpoint", sb.Endpoint, "duration", time.Since(began), "disk_enforcement", sb.DiskEnforcement)
	return sb, nil
}

// containerCreate calls ContainerCreate without letting ctx cancel the
// request: an engine that received the request may create the container even
// though the client gave up, and it would be left behind with no id to remove
// it by. The caller checks ctx afterwards. The call is still bounded by
// runtime.CleanupTimeout.
func (r *Runtime) containerCreate(ctx context.Context, cfg *container.Config, hc *container.HostConfig, name string) (container.CreateResponse, error) {
	if err := ctx.Err(); err != nil {
		return container.CreateResponse{}, err
	}
	cctx, cancel := runtime.Detached(ctx)
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
	vars := spec.Environ()
	env := make([]string, 0, len(vars)+1)
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	// With the agent volume (shared and read-only) the token comes in the
	// environment, which the agent clears for the commands it runs.
	tokenInEnv := agentVolume != ""
	entrypoint := runtime.AgentCommand{WorkDir: spec.AgentWorkDir(workDir), KeepWorkDirOwner: spec.WorkDir != "", User: spec.User, DenyRootUser: spec.DenyRootUser, TokenInEnv: tokenInEnv, App: spec.App}.Args()
	if tokenInEnv {
		env = append(env, runtime.AgentTokenEnv+"="+spec.AgentToken)
	}

	res := spec.Resources.WithDefaults(r.cfg.DefaultResources)
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
		Labels:     runtime.SandboxLabels(spec, r.cfg.InstanceID),
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
		// Spec.DNS: berth's egress resolver (docs/network-policy.md).
		DNS: spec.DNS,
		Resources: container.Resources{
			NanoCPUs:   res.NanoCPUs,
			Memory:     res.MemoryBytes,
			MemorySwap: res.MemoryBytes, // equal to Memory: no swap
			PidsLimit:  &pids,
		},
		// The engine's log of the agent's output, rotated by berth's
		// own bound whatever the daemon's default log options are.
		LogConfig:     outputLog(r.cfg.Output),
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
	hc.Mounts = append(hc.Mounts, agentStateMount(cfg.Labels))
	hc.Mounts = append(hc.Mounts, engineMounts(spec.Mounts)...)
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
		return runtime.Sandbox{}, r.backend().StartErr(id, err, r.mapErr(err, "start container", id))
	}
	t2 := time.Now()
	ins, err := r.cli.ContainerInspect(ctx, id)
	if err != nil {
		return runtime.Sandbox{}, r.mapErr(err, "inspect container", id)
	}
	sb, err := r.startedSandbox(id, ins)
	if err != nil {
		return runtime.Sandbox{}, err
	}
	if err := r.waitReady(ctx, id, sb.Endpoint); err != nil {
		return runtime.Sandbox{}, err
	}
	log.Debug("sandbox started", "inject", t1.Sub(t0), "start", t2.Sub(t1), "ready", time.Since(t2))
	sb.State = runtime.StateRunning
	return sb, nil
}

// exitedErr reports a container that exited before its agent was ready.
func exitedErr(id string, st *container.State) error {
	return runtime.Backend{Name: engineName, Noun: sandboxNoun}.ExitedErr(id, st.ExitCode, st.OOMKilled, st.Error)
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

// tailLogs returns the last n lines of the container's stdout and stderr,
// indented (runtime.TailLines), or "" when there are none or they cannot
// be read.
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
	return runtime.TailLines(buf.String(), n)
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
	dir := strings.TrimPrefix(runtime.AgentDir, "/") + "/"
	var entries []archiveEntry
	if a.agent || a.token != "" {
		entries = append(entries, archiveEntry{h: tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: now}})
	}
	if a.agent {
		f, size, err := r.openAgent()
		if err != nil {
			return err
		}
		defer f.Close()
		entries = append(entries, archiveEntry{h: tar.Header{Typeflag: tar.TypeReg, Name: dir + runtime.AgentFile, Mode: 0o755, Size: size, ModTime: now}, body: f})
	}
	if a.token != "" {
		// Readable by root only: the agent runs as root, the commands as
		// the lease's user, who must not read it (unless that is root).
		entries = append(entries, archiveEntry{h: tar.Header{Typeflag: tar.TypeReg, Name: dir + runtime.TokenFile, Mode: 0o400, Size: int64(len(a.token)), ModTime: now}, body: strings.NewReader(a.token)})
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

// outputLog is the log configuration of a sandbox: the json-file driver
// (which berth's log reading and docker logs both read) keeping at most
// o.MaxFiles files of o.MaxBytes.
func outputLog(o runtime.OutputLimit) container.LogConfig {
	o = o.WithDefaults()
	return container.LogConfig{Type: "json-file", Config: map[string]string{
		"max-size": strconv.FormatInt(o.MaxBytes, 10),
		"max-file": strconv.Itoa(o.MaxFiles),
	}}
}
