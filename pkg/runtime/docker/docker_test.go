package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/conformance"
	"github.com/berth-dev/berth/pkg/runtime/docker"
)

// Test images: the suite's, which TestMain makes with `docker import` (no
// registry needed), those of make images, and one derived from these.
const (
	shellImage   = "berth/minimal:latest"
	baseImage    = "berth/base:latest"
	namedUser    = "berth-test/nobody:latest" // berth/minimal's files, USER nobody
	emptyImage   = conformance.EmptyImage
	badUserImage = conformance.BadUserImage
	numUserImage = conformance.UID1000Image
)

var (
	agentBinary string // built by TestMain (or $BERTH_AGENT_BINARY)
	skipReason  string // set when Docker is unreachable
	shortSkip   bool   // -short: no test here touches the engine
	dockerCli   *client.Client
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		shortSkip = true
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cli, err := docker.NewClient()
	if err == nil {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = cli.Ping(pctx)
		pcancel()
	}
	if err != nil {
		skipReason = fmt.Sprintf("Docker Engine unreachable (DOCKER_HOST=%q): %v", os.Getenv("DOCKER_HOST"), err)
		return m.Run()
	}
	dockerCli = cli
	defer cli.Close()

	var cleanup func()
	agentBinary, cleanup = testenv.AgentBinary()
	defer cleanup()
	for _, img := range conformance.TestImages() {
		var changes []string
		if img.User != "" {
			changes = []string{"USER " + img.User}
		}
		if err := importImage(ctx, cli, img.Ref, changes); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code := m.Run()
	// The agent volume of this test binary (InjectVolume tests); in use by
	// no container once every test has cleaned up. testenv.AgentBinary
	// builds an agent of this package's own, so no other test package
	// running at the same time shares the volume.
	if name, err := docker.AgentVolumeName(agentBinary); err == nil {
		if err := cli.VolumeRemove(context.Background(), name, false); err != nil && !cerrdefs.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "cleanup: remove volume %s: %v\n", name, err)
		}
	}
	return code
}

// importImage creates ref from an empty root filesystem (idempotent).
func importImage(ctx context.Context, cli *client.Client, ref string, changes []string) error {
	if _, err := cli.ImageInspect(ctx, ref); err == nil {
		return nil
	}
	var buf bytes.Buffer
	if err := tar.NewWriter(&buf).Close(); err != nil {
		return err
	}
	rc, err := cli.ImageImport(ctx, image.ImportSource{Source: &buf, SourceName: "-"}, ref, image.ImportOptions{Changes: changes})
	if err != nil {
		return fmt.Errorf("import %s: %w", ref, err)
	}
	defer rc.Close()
	_, err = io.Copy(io.Discard, rc)
	return err
}

func requireDocker(tb testing.TB) {
	tb.Helper()
	if shortSkip {
		tb.Skip("needs the Docker Engine: skipped with -short")
	}
	if skipReason != "" {
		testenv.SkipOrFail(tb, skipReason)
	}
}

func imagePresent(tb testing.TB, ref string) bool {
	tb.Helper()
	_, err := dockerCli.ImageInspect(context.Background(), ref)
	return err == nil
}

func newRuntime(tb testing.TB, mutate ...func(*docker.Config)) *docker.Runtime {
	tb.Helper()
	requireDocker(tb)
	cfg := docker.Config{
		AgentBinary: agentBinary,
		InstanceID:  "docker-test",
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, f := range mutate {
		f(&cfg)
	}
	rt, err := docker.New(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("docker.New: %v", err)
	}
	tb.Cleanup(func() { _ = rt.Close() })
	return rt
}

// suiteOptions are the conformance suite's hooks into the engine: kill
// (docker kill), unmanaged containers, and the output lines a failed Create
// always has on Docker.
func suiteOptions() []conformance.Option {
	kill := func(ctx context.Context, id string) error { return dockerCli.ContainerKill(ctx, id, "KILL") }
	return []conformance.Option{conformance.WithKill(kill), conformance.WithFailureOutput(), conformance.WithUnmanaged(unmanaged)}
}

// unmanaged creates a container of image without berth's labels.
func unmanaged(t *testing.T, image string) (string, func() bool) {
	ctx := context.Background()
	c, err := dockerCli.ContainerCreate(ctx, &container.Config{Image: image, Entrypoint: []string{"/nothing"}}, nil, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dockerCli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true})
	})
	return c.ID, func() bool { _, err := dockerCli.ContainerInspect(ctx, c.ID); return err == nil }
}

func TestConformance(t *testing.T) {
	requireDocker(t)
	images := conformance.Images{Empty: emptyImage, BadUser: badUserImage}
	for _, ref := range []string{shellImage, baseImage} {
		if imagePresent(t, ref) {
			images.Shell = ref
			break
		}
	}
	if images.Shell == "" {
		testenv.LogOrFail(t, fmt.Sprintf("neither %s nor %s is present (make images); shell-based checks are skipped", shellImage, baseImage))
	}
	conformance.Run(t, func(t *testing.T) runtime.Runtime { return newRuntime(t) }, images, suiteOptions()...)
}

// TestConformanceBase runs the shell-based checks against berth/base too
// (bash and python3 instead of busybox) when both images are present.
func TestConformanceBase(t *testing.T) {
	requireDocker(t)
	if testing.Short() {
		t.Skip("-short")
	}
	if !imagePresent(t, baseImage) || !imagePresent(t, shellImage) {
		testenv.SkipOrFailf(t, "needs both %s and %s (make images)", shellImage, baseImage)
	}
	conformance.Run(t, func(t *testing.T) runtime.Runtime { return newRuntime(t) },
		conformance.Images{Empty: emptyImage, Shell: baseImage, BadUser: badUserImage}, suiteOptions()...)
}

// TestConformanceVolume runs the suite with the agent in a shared read-only
// volume instead of copied into each container.
func TestConformanceVolume(t *testing.T) {
	requireDocker(t)
	images := conformance.Images{Empty: emptyImage, BadUser: badUserImage}
	if imagePresent(t, shellImage) {
		images.Shell = shellImage
	} else {
		testenv.LogOrFail(t, fmt.Sprintf("%s is not present (make images); shell-based checks are skipped", shellImage))
	}
	conformance.Run(t, func(t *testing.T) runtime.Runtime {
		return newRuntime(t, func(c *docker.Config) { c.Injection = docker.InjectVolume })
	}, images, suiteOptions()...)
}

func TestAgentVolume(t *testing.T) {
	rt := newRuntime(t, func(c *docker.Config) { c.Injection = docker.InjectVolume })
	ctx := context.Background()
	spec := testSpec(t, rt, numUserImage) // non-root: the workspace is still theirs
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ins, err := dockerCli.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The agent volume, read-only, and the sandbox's own anonymous
	// volume for the agent's state (removed with the container). The
	// engine lists mounts in no fixed order.
	agentMount, stateMount := mountAt(ins.Mounts, runtime.AgentDir), mountAt(ins.Mounts, runtime.AgentStateDir)
	if len(ins.Mounts) != 2 || agentMount == nil || stateMount == nil ||
		agentMount.RW || !strings.HasPrefix(agentMount.Name, "berth-agent-") ||
		!stateMount.RW || strings.HasPrefix(stateMount.Name, "berth-") {
		t.Fatalf("mounts = %+v, want the agent volume read-only at %s and an anonymous one at %s", ins.Mounts, runtime.AgentDir, runtime.AgentStateDir)
	}
	vol, err := dockerCli.VolumeInspect(ctx, agentMount.Name)
	if err != nil {
		t.Fatal(err)
	}
	if vol.Labels[runtime.LabelManaged] != "true" || len(vol.Labels["dev.berth.agent.sha256"]) != 64 {
		t.Errorf("volume labels = %v", vol.Labels)
	}
	if slices.Contains([]string(ins.Config.Entrypoint), "--token-file") {
		t.Errorf("entrypoint %v: volume mode passes the token in the environment", ins.Config.Entrypoint)
	}
	if st := statInContainer(t, sb.ID, "/workspace"); st.uid != 1000 || st.gid != 1000 {
		t.Errorf("/workspace owned by %d:%d, want 1000:1000", st.uid, st.gid)
	}
	out := agentExec(t, sb, spec.AgentToken, `{"argv":["/.berth/sandbox-agent","--version"]}`)
	if !strings.Contains(out, `"exitCode":0`) {
		t.Errorf("exec: %s", out)
	}
	// A second runtime (another orchestrator) reuses the populated volume.
	rt2 := newRuntime(t, func(c *docker.Config) { c.Injection = docker.InjectVolume })
	sb2, err := rt2.Create(ctx, testSpec(t, rt2, emptyImage))
	if err != nil {
		t.Fatal(err)
	}
	ins2, _ := dockerCli.ContainerInspect(ctx, sb2.ID)
	if m := mountAt(ins2.Mounts, runtime.AgentDir); len(ins2.Mounts) != 2 || m == nil || m.Name != agentMount.Name {
		t.Errorf("second runtime mounts %+v, want %s at %s", ins2.Mounts, agentMount.Name, runtime.AgentDir)
	}
}

// TestAgentVolumeRemovedBehindOurBack removes the agent volume while a
// runtime has it cached, as `docker volume prune -a` would between two
// sandboxes: the next Create still succeeds (the engine makes an empty
// volume for the mount; the runtime sees the agent missing, populates the
// volume and creates the sandbox again), and the volume has its labels.
func TestAgentVolumeRemovedBehindOurBack(t *testing.T) {
	rt := newRuntime(t, func(c *docker.Config) { c.Injection = docker.InjectVolume })
	ctx := context.Background()
	sb, err := rt.Create(ctx, testSpec(t, rt, emptyImage))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Remove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	name, err := docker.AgentVolumeName(agentBinary)
	if err != nil {
		t.Fatal(err)
	}
	if err := dockerCli.VolumeRemove(ctx, name, false); err != nil {
		t.Fatalf("remove the agent volume behind the runtime's back: %v", err)
	}
	spec := testSpec(t, rt, emptyImage)
	sb, err = rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create after the agent volume was removed: %v", err)
	}
	if out := agentExec(t, sb, spec.AgentToken, `{"argv":["/.berth/sandbox-agent","--version"]}`); !strings.Contains(out, `"exitCode":0`) {
		t.Errorf("exec: %s", out)
	}
	vol, err := dockerCli.VolumeInspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if vol.Labels[runtime.LabelManaged] != "true" || len(vol.Labels["dev.berth.agent.sha256"]) != 64 {
		t.Errorf("volume labels = %v, want berth's", vol.Labels)
	}
}

// mountAt returns the mount at destination dst, or nil.
func mountAt(mounts []container.MountPoint, dst string) *container.MountPoint {
	for i := range mounts {
		if mounts[i].Destination == dst {
			return &mounts[i]
		}
	}
	return nil
}

// spec returns a spec with a unique lease id and registers cleanup.
func testSpec(t testing.TB, rt *docker.Runtime, img string) runtime.Spec {
	t.Helper()
	lease := fmt.Sprintf("dt-%d", time.Now().UnixNano())
	t.Cleanup(func() { removeLease(t, rt, lease) })
	return runtime.Spec{LeaseID: lease, ConversationID: "c-" + lease, Image: img, AgentToken: "token-" + lease}
}

func removeLease(t testing.TB, rt *docker.Runtime, lease string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := rt.List(ctx, runtime.Selector{runtime.LabelLease: lease})
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for _, sb := range list {
		if err := rt.Remove(ctx, sb.ID); err != nil {
			t.Errorf("cleanup: remove %s: %v", sb.ID, err)
		}
	}
}

func TestHostConfigHardening(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	spec := testSpec(t, rt, emptyImage)
	spec.Env = map[string]string{"FOO": "bar"}
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ins, err := dockerCli.ContainerInspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	hc := ins.HostConfig
	if !slices.Contains(hc.SecurityOpt, "no-new-privileges:true") {
		t.Errorf("SecurityOpt = %v, want no-new-privileges:true", hc.SecurityOpt)
	}
	if !slices.Equal([]string(hc.CapDrop), []string{"ALL"}) {
		t.Errorf("CapDrop = %v, want [ALL]", hc.CapDrop)
	}
	var capAdd []string
	for _, c := range hc.CapAdd {
		capAdd = append(capAdd, strings.TrimPrefix(c, "CAP_"))
	}
	if !sameSet(capAdd, runtime.Capabilities()) {
		t.Errorf("CapAdd = %v, want %v", hc.CapAdd, runtime.Capabilities())
	}
	if hc.Privileged {
		t.Error("Privileged")
	}
	if hc.Init != nil && *hc.Init {
		t.Error("Init = true; the agent is PID 1 itself")
	}
	if hc.NanoCPUs != runtime.DefaultNanoCPUs || hc.Memory != runtime.DefaultMemoryBytes || hc.MemorySwap != hc.Memory {
		t.Errorf("NanoCPUs %d Memory %d MemorySwap %d; want defaults %d, %d, swap = memory", hc.NanoCPUs, hc.Memory, hc.MemorySwap, runtime.DefaultNanoCPUs, runtime.DefaultMemoryBytes)
	}
	if hc.PidsLimit == nil || *hc.PidsLimit != runtime.DefaultPidsLimit {
		t.Errorf("PidsLimit = %v, want %d", hc.PidsLimit, runtime.DefaultPidsLimit)
	}
	if len(hc.PortBindings) != 0 || hc.PublishAllPorts {
		t.Errorf("ports are published: %v %v", hc.PortBindings, hc.PublishAllPorts)
	}
	if nw, err := dockerCli.NetworkInspect(ctx, string(hc.NetworkMode), network.InspectOptions{}); err != nil || nw.Name != docker.DefaultNetwork {
		t.Errorf("NetworkMode = %q (%v), want the %q network", hc.NetworkMode, err, docker.DefaultNetwork)
	}
	if len(ins.NetworkSettings.Ports) != 0 {
		for p, b := range ins.NetworkSettings.Ports {
			if len(b) > 0 {
				t.Errorf("port %s bound on the host: %v", p, b)
			}
		}
	}
	wantEntry := []string{runtime.AgentPath, "--listen", "0.0.0.0:7000", "--envd-listen", "0.0.0.0:49983", "--workdir", "/workspace", "--token-file", runtime.TokenPath}
	if !slices.Equal([]string(ins.Config.Entrypoint), wantEntry) {
		t.Errorf("Entrypoint = %v, want %v", ins.Config.Entrypoint, wantEntry)
	}
	if len(ins.Config.Cmd) != 0 {
		t.Errorf("Cmd = %v, want empty", ins.Config.Cmd)
	}
	if !slices.Contains(ins.Config.Env, "FOO=bar") {
		t.Errorf("Env = %v, want FOO=bar", ins.Config.Env)
	}
	for _, e := range ins.Config.Env {
		if strings.Contains(e, spec.AgentToken) {
			t.Errorf("the token is visible in the container's environment: %s", e)
		}
	}
	if ins.Name != "/"+docker.ContainerName(spec.LeaseID, spec.AgentToken) || strings.Contains(ins.Name, spec.LeaseID) {
		t.Errorf("Name = %q", ins.Name)
	}
	if ins.Config.Labels[runtime.LabelInstance] != "docker-test" {
		t.Errorf("instance label = %q, want the Config.InstanceID", ins.Config.Labels[runtime.LabelInstance])
	}
}

func TestNetworkICCDisabled(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	spec := testSpec(t, rt, emptyImage)
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	nw, err := dockerCli.NetworkInspect(ctx, rt.Network(), network.InspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nw.Driver != "bridge" {
		t.Errorf("driver = %q", nw.Driver)
	}
	if nw.Options["com.docker.network.bridge.enable_icc"] != "false" {
		t.Errorf("options = %v, want enable_icc=false", nw.Options)
	}
	if nw.Labels[runtime.LabelManaged] != "true" {
		t.Errorf("labels = %v, want %s=true", nw.Labels, runtime.LabelManaged)
	}
}

// TestNetworkCreateRace creates a fresh network from several runtimes at
// once: exactly one network results and every Create succeeds.
func TestNetworkCreateRace(t *testing.T) {
	requireDocker(t)
	ctx := context.Background()
	name := fmt.Sprintf("berth-test-net-%d", time.Now().UnixNano())
	t.Cleanup(func() { removeNetworks(t, name) })
	const n = 3
	errs := make(chan error, n)
	for range n {
		rt := newRuntime(t, func(c *docker.Config) { c.Network = name })
		spec := testSpec(t, rt, emptyImage)
		go func() {
			sb, err := rt.Create(ctx, spec)
			if err == nil {
				err = rt.Remove(ctx, sb.ID)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	list, err := dockerCli.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(filters.Arg("name", name))})
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, nw := range list {
		if nw.Name == name {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d networks named %s, want 1", count, name)
	}
}

func TestNetworkWithICCRefused(t *testing.T) {
	requireDocker(t)
	ctx := context.Background()
	name := fmt.Sprintf("berth-test-icc-%d", time.Now().UnixNano())
	if _, err := dockerCli.NetworkCreate(ctx, name, network.CreateOptions{Driver: "bridge"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeNetworks(t, name) })
	rt := newRuntime(t, func(c *docker.Config) { c.Network = name })
	_, err := rt.Create(ctx, testSpec(t, rt, emptyImage))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "inter-container") {
		t.Fatalf("Create on a network with ICC: %v, want FailedPrecondition about inter-container communication", err)
	}
}

func TestImageMissingText(t *testing.T) {
	rt := newRuntime(t)
	_, err := rt.Create(context.Background(), runtime.Spec{LeaseID: "dt-missing", Image: "berth/does-not-exist", AgentToken: "x"})
	want := "image berth/does-not-exist is not present locally; berth builds images locally (make images) since no registry is reachable"
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v\nwant NotFound containing %q", err, want)
	}
}

// TestNonRootUsers checks that images running as a non-root user (numeric,
// or named and resolved through the image's /etc/passwd) get a workspace
// they can write to and can run the injected agent.
func TestNonRootUsers(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()

	t.Run("numeric", func(t *testing.T) {
		spec := testSpec(t, rt, numUserImage)
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		out := agentExec(t, sb, spec.AgentToken, `{"argv":["/.berth/sandbox-agent","--version"]}`)
		if !strings.Contains(out, `"exitCode":0`) {
			t.Errorf("exec as uid 1000: %s", out)
		}
		st := statInContainer(t, sb.ID, "/workspace")
		if st.uid != 1000 || st.gid != 1000 {
			t.Errorf("/workspace owned by %d:%d, want 1000:1000", st.uid, st.gid)
		}
	})
	t.Run("named", func(t *testing.T) {
		if !imagePresent(t, shellImage) {
			testenv.SkipOrFailf(t, "%s not present (make images)", shellImage)
		}
		if err := derive(ctx, shellImage, namedUser, []string{"USER nobody"}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = dockerCli.ImageRemove(context.Background(), namedUser, image.RemoveOptions{Force: true})
		})
		spec := testSpec(t, rt, namedUser)
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		out := agentExec(t, sb, spec.AgentToken, `{"command":"id -u; touch /workspace/ok && pwd"}`)
		if !strings.Contains(out, `"exitCode":0`) || !strings.Contains(out, "/workspace") {
			t.Errorf("exec as nobody: %s", out)
		}
	})
}

type fileOwner struct{ uid, gid int }

func statInContainer(t *testing.T, id, path string) fileOwner {
	t.Helper()
	rc, _, err := dockerCli.CopyFromContainer(context.Background(), id, path)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h, err := tar.NewReader(rc).Next()
	if err != nil {
		t.Fatal(err)
	}
	return fileOwner{h.Uid, h.Gid}
}

// derive makes ref from src's files (the busybox rootfs of berth/minimal
// has an /etc/passwd with nobody) with the given Dockerfile changes and no
// WORKDIR.
func derive(ctx context.Context, src, ref string, changes []string) error {
	c, err := dockerCli.ContainerCreate(ctx, &container.Config{Image: src, Entrypoint: []string{"/bin/true"}}, nil, nil, nil, "")
	if err != nil {
		return err
	}
	defer dockerCli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true})
	exp, err := dockerCli.ContainerExport(ctx, c.ID)
	if err != nil {
		return err
	}
	defer exp.Close()
	rc, err := dockerCli.ImageImport(ctx, image.ImportSource{Source: exp, SourceName: "-"}, ref, image.ImportOptions{Changes: changes})
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = io.Copy(io.Discard, rc)
	return err
}

// agentExec posts body to sb's agent's REST exec and returns the answer.
func agentExec(t *testing.T, sb runtime.Sandbox, token, body string) string {
	t.Helper()
	code, b := testenv.AgentCall(t, sb.Endpoint, token, http.MethodPost, "/v1/exec", body)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/exec: HTTP %d: %s", code, b)
	}
	return string(b)
}

func TestPingUnavailable(t *testing.T) {
	requireDocker(t)
	cli, err := client.NewClientWithOpts(client.WithHost("unix:///nonexistent/docker.sock"), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(t, func(c *docker.Config) { c.Client = cli })
	err = rt.Ping(context.Background())
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "DOCKER_HOST=unix:///nonexistent/docker.sock") {
		t.Fatalf("Ping: %v; want Unavailable with a DOCKER_HOST hint", err)
	}
	if _, err := rt.Get(context.Background(), "x"); !errdefs.IsUnavailable(err) {
		t.Errorf("Get: %v; want Unavailable", err)
	}
}

// BenchmarkCreate measures a cold Create (create, inject the agent, start,
// wait for /healthz) of the empty image, then Remove (not timed).
func BenchmarkCreate(b *testing.B) {
	b.Run("copy", func(b *testing.B) { benchmarkCreate(b, docker.InjectCopy) })
	b.Run("volume", func(b *testing.B) { benchmarkCreate(b, docker.InjectVolume) })
}

func benchmarkCreate(b *testing.B, mode docker.Injection) {
	rt := newRuntime(b, func(c *docker.Config) { c.Injection = mode })
	conformance.BenchmarkCreate(b, rt, func() runtime.Spec { return testSpec(b, rt, emptyImage) })
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// removeNetworks removes every network named name (by id: duplicates make
// the name ambiguous).
func removeNetworks(t testing.TB, name string) {
	ctx := context.Background()
	list, err := dockerCli.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(filters.Arg("name", name))})
	if err != nil {
		t.Errorf("cleanup: list networks: %v", err)
		return
	}
	for _, nw := range list {
		if nw.Name == name {
			if err := dockerCli.NetworkRemove(ctx, nw.ID); err != nil {
				t.Errorf("cleanup: remove network %s: %v", nw.ID, err)
			}
		}
	}
}
