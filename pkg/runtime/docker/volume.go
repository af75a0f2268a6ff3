package docker

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// Injection selects how the agent gets into a sandbox.
type Injection string

// Injection modes.
const (
	// InjectCopy copies the agent and a token file into every container
	// through the engine's archive API before starting it. It needs no state
	// on the engine besides the container. The default.
	InjectCopy Injection = "copy"
	// InjectVolume copies the agent once per agent version into a named
	// volume (berth-agent-<sha256 prefix>, through the archive API as well,
	// so no shared filesystem is assumed) and mounts it read-only at /.berth
	// in every sandbox; the token is passed in BERTH_AGENT_TOKEN, which the
	// agent removes from the environment of the commands it runs. It saves
	// the per-Create archive copy (about 60-150 ms here: the engine mounts
	// the container's filesystem and untars in a helper process).
	InjectVolume Injection = "volume"
)

// Labels of the agent volume.
const (
	labelAgentSHA = "dev.berth.agent.sha256"
	// completeMarker is written after the agent, so its presence means the
	// volume is fully populated.
	completeMarker = ".complete"
)

// hashFile returns the hex SHA-256 of path.
func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// agentVolumeName is the volume holding the agent whose SHA-256 is sum.
func agentVolumeName(sum string) string { return "berth-agent-" + sum[:16] }

// AgentVolumeName returns the name of the volume InjectVolume keeps the
// agent binary at path in (berth-agent-<sha256 prefix>): every orchestrator
// on an engine serving the same agent build shares it.
func AgentVolumeName(path string) (string, error) {
	sum, err := hashFile(path)
	if err != nil {
		return "", fmt.Errorf("docker: hash agent binary: %w", err)
	}
	return agentVolumeName(sum), nil
}

// agentMount is how sandboxes mount the agent volume.
func agentMount(name string) mount.Mount {
	return mount.Mount{
		Type:          mount.TypeVolume,
		Source:        name,
		Target:        runtime.AgentDir,
		ReadOnly:      true,
		VolumeOptions: &mount.VolumeOptions{NoCopy: true},
	}
}

// agentStateMount is the sandbox's own anonymous volume at
// runtime.AgentStateDir, labelled like the sandbox and removed with it
// (Remove's RemoveVolumes). A commit (snapshot) never includes a volume, and
// NoCopy leaves out whatever an image has at that path (a snapshot made
// before the agent's state had its own volume), so a fork never applies
// another lease's configuration.
func agentStateMount(labels map[string]string) mount.Mount {
	return mount.Mount{
		Type:          mount.TypeVolume,
		Target:        runtime.AgentStateDir,
		VolumeOptions: &mount.VolumeOptions{NoCopy: true, Labels: labels},
	}
}

// ensureAgentVolume makes sure the agent volume exists and holds this
// agent, populating it through a never-started helper container created
// from img (any local image will do; the engine may have no other). Several
// orchestrators populating the same volume at once write identical bytes;
// the marker file is written last.
func (r *Runtime) ensureAgentVolume(ctx context.Context, img string) (string, error) {
	r.volMu.Lock()
	defer r.volMu.Unlock()
	if r.volName != "" {
		return r.volName, nil
	}
	name := agentVolumeName(r.agentSum)
	opts := volume.CreateOptions{
		Name:   name,
		Driver: "local",
		Labels: map[string]string{runtime.LabelManaged: "true", labelAgentSHA: r.agentSum},
	}
	vol, err := r.cli.VolumeCreate(ctx, opts)
	if err != nil {
		return "", r.mapErr(err, "create agent volume", name)
	}
	if vol.Labels[labelAgentSHA] != r.agentSum {
		// A volume of that name without berth's labels: the engine made it
		// empty for a sandbox's mount after ours was removed (creating an
		// existing volume returns it as it is). Replace it with a labelled
		// one, which `make leakcheck` and operators can tell apart; one
		// still in use stays, and is populated below.
		if err := r.cli.VolumeRemove(ctx, name, false); err == nil {
			if _, err := r.cli.VolumeCreate(ctx, opts); err != nil {
				return "", r.mapErr(err, "create agent volume", name)
			}
		} else {
			r.log.Warn("agent volume has no berth labels and is in use; populating it as it is", "volume", name, "err", err)
		}
	}
	m := agentMount(name)
	m.ReadOnly = false
	// containerCreate: a helper created after our deadline must still be
	// removed.
	helper, err := r.containerCreate(ctx,
		&container.Config{
			Image:      img,
			Entrypoint: []string{runtime.AgentPath, "--version"},
			Labels:     map[string]string{runtime.LabelManaged: "true", labelAgentSHA: r.agentSum},
		},
		&container.HostConfig{NetworkMode: "none", Mounts: []mount.Mount{m}},
		"")
	if err != nil {
		return "", r.mapErr(err, "create agent volume helper", name)
	}
	defer func() {
		cctx, cancel := runtime.Detached(ctx)
		defer cancel()
		_ = r.remove(cctx, helper.ID)
	}()
	if _, err := r.cli.ContainerStatPath(ctx, helper.ID, runtime.AgentDir+"/"+completeMarker); err == nil {
		r.volName = name
		return name, nil
	}
	began := time.Now()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(r.writeVolumeArchive(pw)) }()
	err = r.cli.CopyToContainer(ctx, helper.ID, runtime.AgentDir, pr, container.CopyToContainerOptions{})
	_ = pr.Close()
	if err != nil {
		return "", r.mapErr(err, "populate agent volume", name)
	}
	r.log.Info("populated agent volume", "volume", name, "duration", time.Since(began))
	r.volName = name
	return name, nil
}

// agentVolumeEmpty reports whether the agent volume, as container id
// mounts it, lacks the completion marker (the engine created it empty).
func (r *Runtime) agentVolumeEmpty(ctx context.Context, id string) bool {
	ctx, cancel := runtime.Detached(ctx)
	defer cancel()
	_, err := r.cli.ContainerStatPath(ctx, id, runtime.AgentDir+"/"+completeMarker)
	return err != nil && errdefs.IsNotFound(r.mapErr(err, "", ""))
}

// forgetAgentVolume makes the next Create check the agent volume again
// (e.g. after it was removed behind our back).
func (r *Runtime) forgetAgentVolume() {
	r.volMu.Lock()
	r.volName = ""
	r.volMu.Unlock()
}

// openAgent opens the agent binary for copying, and returns its size.
func (r *Runtime) openAgent() (*os.File, int64, error) {
	f, err := os.Open(r.cfg.AgentBinary)
	if err != nil {
		return nil, 0, fmt.Errorf("open agent binary: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("stat agent binary: %w", err)
	}
	return f, st.Size(), nil
}

// writeVolumeArchive writes the agent and then the completion marker.
func (r *Runtime) writeVolumeArchive(w io.Writer) error {
	f, size, err := r.openAgent()
	if err != nil {
		return err
	}
	defer f.Close()
	now := time.Now()
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: runtime.AgentFile, Mode: 0o755, Size: size, ModTime: now, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, size); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: completeMarker, Mode: 0o444, Size: int64(len(r.agentSum)), ModTime: now, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := io.WriteString(tw, r.agentSum); err != nil {
		return err
	}
	return tw.Close()
}
