package containerd_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	ctd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	dockerclient "github.com/docker/docker/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/conformance"
	"github.com/berth-dev/berth/pkg/runtime/containerd"
	"github.com/berth-dev/berth/pkg/runtime/docker"
)

// Test images: berth/minimal and berth/base from Docker (make images),
// when there; the suite's, which TestMain imports into the namespace from
// OCI archives built here (no registry, no Docker needed).
const (
	shellImage   = "berth/minimal:latest"
	baseImage    = "berth/base:latest"
	emptyImage   = conformance.EmptyImage
	badUserImage = conformance.BadUserImage
	numUserImage = conformance.UID1000Image
)

var (
	agentBinary string // built by TestMain (or $BERTH_AGENT_BINARY)
	skipReason  string // set when containerd is unusable here
	shortSkip   bool   // -short: no test here touches containerd
	shellOK     bool   // shellImage is in the namespace
	baseOK      bool   // baseImage is in the namespace
	testRT      *containerd.Runtime
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
	if os.Geteuid() != 0 {
		skipReason = "the containerd backend needs root (network namespaces, CNI, mounts); run the tests as root"
		return m.Run()
	}
	if addr := testenv.ContainerdSocket(containerd.DefaultAddress, containerd.DockerAddress); addr == "" {
		skipReason = fmt.Sprintf("no containerd socket (%s, %s or $BERTH_CONTAINERD_ADDRESS)", containerd.DefaultAddress, containerd.DockerAddress)
		return m.Run()
	}
	var cleanup func()
	agentBinary, cleanup = testenv.AgentBinary()
	defer cleanup()
	rt, err := containerd.New(context.Background(), baseConfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, "containerd.New:", err)
		return 1
	}
	defer rt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	err = rt.Ping(pctx)
	pcancel()
	if err != nil {
		skipReason = fmt.Sprintf("containerd unreachable at %s: %v", rt.Address(), err)
		return m.Run()
	}
	testRT = rt
	for _, img := range conformance.TestImages() {
		if _, err := rt.Import(ctx, bytes.NewReader(ociArchive(img.Ref, img.User))); err != nil {
			fmt.Fprintf(os.Stderr, "import %s: %v\n", img.Ref, err)
			return 1
		}
	}
	shellOK = ensureImage(ctx, rt, shellImage)
	baseOK = !testing.Short() && ensureImage(ctx, rt, baseImage)
	return m.Run()
}

// ensureImage imports ref from the Docker Engine (refreshing it when it is
// there); false when neither the Engine nor the namespace has it.
func ensureImage(ctx context.Context, rt *containerd.Runtime, ref string) bool {
	if _, err := rt.ImportFromDocker(ctx, ref); err != nil {
		fmt.Fprintf(os.Stderr, "note: %s not imported from Docker (%v)\n", ref, err)
		_, err := rt.Client().ImageService().Get(namespaces.WithNamespace(ctx, rt.Namespace()), "docker.io/"+ref)
		return err == nil
	}
	return true
}

// ociArchive returns an OCI image layout tar holding image ref: one empty
// layer and a configuration with the given user.
func ociArchive(ref, user string) []byte {
	var layer bytes.Buffer
	_ = tar.NewWriter(&layer).Close()
	digest := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	layerDigest := digest(layer.Bytes())
	config, _ := json.Marshal(map[string]any{
		"architecture": goruntime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"User": user},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layer.Len()}},
	})
	_, tag, _ := strings.Cut(ref, ":")
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest),
			"annotations": map[string]string{"io.containerd.image.name": "docker.io/" + ref, "org.opencontainers.image.ref.name": tag},
		}},
	})
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	add := func(name string, b []byte) {
		_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		_, _ = tw.Write(b)
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", index)
	for _, b := range [][]byte{layer.Bytes(), config, manifest} {
		add("blobs/sha256/"+strings.TrimPrefix(digest(b), "sha256:"), b)
	}
	_ = tw.Close()
	return out.Bytes()
}

func baseConfig() containerd.Config {
	cfg := containerd.Config{
		AgentBinary: agentBinary,
		Address:     os.Getenv("BERTH_CONTAINERD_ADDRESS"),
		InstanceID:  "containerd-test",
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

func requireContainerd(tb testing.TB) {
	tb.Helper()
	if shortSkip {
		tb.Skip("needs containerd: skipped with -short")
	}
	if skipReason != "" {
		testenv.SkipOrFail(tb, skipReason)
	}
}

func newRuntime(tb testing.TB, mutate ...func(*containerd.Config)) *containerd.Runtime {
	tb.Helper()
	requireContainerd(tb)
	cfg := baseConfig()
	for _, f := range mutate {
		f(&cfg)
	}
	rt, err := containerd.New(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("containerd.New: %v", err)
	}
	tb.Cleanup(func() { _ = rt.Close() })
	return rt
}

// kill SIGKILLs a sandbox's task behind the runtime's back.
func kill(ctx context.Context, id string) error {
	ctx = namespaces.WithNamespace(ctx, testRT.Namespace())
	_, err := testRT.Client().TaskService().Kill(ctx, &tasks.KillRequest{ContainerID: id, Signal: uint32(syscall.SIGKILL)})
	return err
}

// unmanaged creates a container of image without berth's labels in the
// runtime's namespace.
func unmanaged(t *testing.T, image string) (string, func() bool) {
	ctx := namespaces.WithNamespace(context.Background(), testRT.Namespace())
	img, err := testRT.Client().GetImage(ctx, "docker.io/"+image)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("berth-unmanaged-%d", time.Now().UnixNano())
	c, err := testRT.Client().NewContainer(ctx, id, ctdWithImage(img)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(ctx) })
	return id, func() bool { _, err := testRT.Client().ContainerService().Get(ctx, id); return err == nil }
}

func TestConformance(t *testing.T) {
	requireContainerd(t)
	images := conformance.Images{Empty: emptyImage, BadUser: badUserImage}
	if shellOK {
		images.Shell = shellImage
	} else {
		testenv.LogOrFail(t, fmt.Sprintf("%s is not present (make images, with Docker running to import it); shell-based checks are skipped", shellImage))
	}
	conformance.Run(t, func(t *testing.T) runtime.Runtime { return newRuntime(t) }, images, conformance.WithKill(kill), conformance.WithUnmanaged(unmanaged))
}

// TestConformanceBase runs the shell-based checks against berth/base too
// (bash and python3 instead of busybox).
func TestConformanceBase(t *testing.T) {
	requireContainerd(t)
	if testing.Short() {
		t.Skip("-short")
	}
	if !baseOK {
		testenv.SkipOrFailf(t, "%s is not present (make images, with Docker running to import it)", baseImage)
	}
	conformance.Run(t, func(t *testing.T) runtime.Runtime { return newRuntime(t) },
		conformance.Images{Empty: emptyImage, Shell: baseImage, BadUser: badUserImage}, conformance.WithKill(kill), conformance.WithUnmanaged(unmanaged))
}

var leaseSeq int

// testSpec returns a spec with a fresh lease id and registers the removal of
// every sandbox labelled with that lease when the test ends, whatever the
// test did with Create's result (failed, skipped, or never saw it).
func testSpec(t testing.TB, img string) runtime.Spec {
	t.Helper()
	leaseSeq++
	lease := fmt.Sprintf("ct-%d-%d", time.Now().UnixNano(), leaseSeq)
	t.Cleanup(func() { removeLease(t, lease) })
	return runtime.Spec{
		LeaseID:        lease,
		ConversationID: "conv",
		InstanceID:     "containerd-test",
		Image:          img,
		AgentToken:     fmt.Sprintf("tok-%d", time.Now().UnixNano()),
	}
}

// removeLease removes the sandboxes labelled with lease (by label, not by an
// id a Create returned: a Create that failed or raced a timeout may still
// have left one).
func removeLease(t testing.TB, lease string) {
	if testRT == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := testRT.List(ctx, runtime.Selector{runtime.LabelLease: lease})
	if err != nil {
		t.Errorf("cleanup: list lease %s: %v", lease, err)
		return
	}
	for _, sb := range list {
		if err := testRT.Remove(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("cleanup: remove %s: %v", sb.ID, err)
		}
	}
}

func create(t testing.TB, rt *containerd.Runtime, spec runtime.Spec) runtime.Sandbox {
	t.Helper()
	sb, err := rt.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := rt.Remove(context.Background(), sb.ID); err != nil {
			t.Errorf("cleanup: Remove %s: %v", sb.ID, err)
		}
	})
	return sb
}

// ociSpec reads the OCI spec containerd stored for container id.
func ociSpec(t *testing.T, rt *containerd.Runtime, id string) specs.Spec {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	c, err := rt.Client().ContainerService().Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(c.Spec.GetValue(), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSpecHardening(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, emptyImage)
	spec.Resources = runtime.Resources{NanoCPUs: 1_500_000_000, MemoryBytes: 300 << 20, PidsLimit: 77}
	sb := create(t, rt, spec)
	if sb.ID != containerd.ContainerID(spec.LeaseID) {
		t.Errorf("ID = %s, want %s", sb.ID, containerd.ContainerID(spec.LeaseID))
	}
	s := ociSpec(t, rt, sb.ID)
	p := s.Process
	if !p.NoNewPrivileges {
		t.Error("NoNewPrivileges is off")
	}
	var want []string
	for _, c := range runtime.Capabilities() {
		want = append(want, "CAP_"+c)
	}
	for name, got := range map[string][]string{"bounding": p.Capabilities.Bounding, "effective": p.Capabilities.Effective, "permitted": p.Capabilities.Permitted} {
		if !sameSet(got, want) {
			t.Errorf("%s capabilities = %v, want %v", name, got, want)
		}
	}
	if len(p.Capabilities.Inheritable) != 0 || len(p.Capabilities.Ambient) != 0 {
		t.Errorf("inheritable/ambient capabilities = %v/%v, want none", p.Capabilities.Inheritable, p.Capabilities.Ambient)
	}
	if len(s.Linux.MaskedPaths) == 0 || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Errorf("masked %v / readonly %v paths: want containerd's defaults", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != specs.ActErrno {
		t.Errorf("seccomp = %+v, want the default profile", s.Linux.Seccomp)
	}
	res := s.Linux.Resources
	if *res.Memory.Limit != 300<<20 || *res.Memory.Swap != 300<<20 {
		t.Errorf("memory limit/swap = %d/%d, want %d both", *res.Memory.Limit, *res.Memory.Swap, 300<<20)
	}
	if res.Pids.Limit == nil || *res.Pids.Limit != 77 {
		t.Errorf("pids limit = %v, want 77", res.Pids.Limit)
	}
	if *res.CPU.Quota != 150_000 || *res.CPU.Period != 100_000 {
		t.Errorf("cpu quota/period = %d/%d, want 150000/100000", *res.CPU.Quota, *res.CPU.Period)
	}
	nsTypes := map[specs.LinuxNamespaceType]string{}
	for _, ns := range s.Linux.Namespaces {
		nsTypes[ns.Type] = ns.Path
	}
	if nsTypes[specs.NetworkNamespace] != filepath.Join(containerd.DefaultNetnsDir, sb.ID) {
		t.Errorf("network namespace = %q, want the sandbox's own", nsTypes[specs.NetworkNamespace])
	}
	for _, typ := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace, specs.CgroupNamespace} {
		if path, ok := nsTypes[typ]; !ok || path != "" {
			t.Errorf("%s namespace = %q (present %v), want a private one", typ, path, ok)
		}
	}
	found := false
	for _, m := range s.Mounts {
		if m.Destination == runtime.AgentDir {
			found = true
			if !slices.Contains(m.Options, "ro") || m.Type != "bind" {
				t.Errorf("agent mount %+v is not a read-only bind mount", m)
			}
		}
	}
	if !found {
		t.Errorf("no mount at %s", runtime.AgentDir)
	}
	if p.Args[0] != runtime.AgentPath {
		t.Errorf("args = %v, want the agent first", p.Args)
	}
	// The veth is an isolated bridge port.
	out, err := exec.Command("bridge", "-d", "link", "show", "master", containerd.DefaultBridge).CombinedOutput()
	if err != nil {
		t.Logf("bridge -d link show: %v: %s", err, out)
	} else {
		// Older iproute2 ignores "master": keep the bridge's ports only.
		lines := strings.Split(string(out), "\n")
		ports := 0
		for i := 0; i+1 < len(lines); i++ {
			if strings.Contains(lines[i], "master "+containerd.DefaultBridge+" ") {
				ports++
				if !strings.Contains(lines[i+1], "isolated on") {
					t.Errorf("bridge port of %s not isolated:\n%s\n%s", containerd.DefaultBridge, lines[i], lines[i+1])
				}
			}
		}
		if ports == 0 {
			t.Errorf("no port on %s:\n%s", containerd.DefaultBridge, out)
		}
	}
}

// hostState lists what the runtime keeps on the host for container id.
func hostState(id string) []string {
	var found []string
	for _, p := range []string{
		filepath.Join(containerd.DefaultNetnsDir, id),
		filepath.Join(containerd.DefaultStateDir, "sandboxes", id),
		filepath.Join("/var/lib/cni/results", containerd.DefaultNetworkName+"-"+id+"-eth0"),
	} {
		if _, err := os.Lstat(p); err == nil {
			found = append(found, p)
		}
	}
	ipam := filepath.Join("/var/lib/cni/networks", containerd.DefaultNetworkName)
	entries, _ := os.ReadDir(ipam)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(ipam, e.Name()))
		if first, _, _ := strings.Cut(string(b), "\n"); strings.TrimSpace(first) == id {
			found = append(found, filepath.Join(ipam, e.Name()))
		}
	}
	return found
}

func TestRemoveCleansHost(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	for _, paused := range []bool{false, true} {
		spec := testSpec(t, emptyImage)
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if st := hostState(sb.ID); len(st) != 4 {
			t.Errorf("host state of a live sandbox = %v, want netns, dir, CNI result, IP allocation", st)
		}
		if paused {
			if err := rt.Pause(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := rt.Remove(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if st := hostState(sb.ID); len(st) != 0 {
			t.Errorf("Remove (paused %v) left %v", paused, st)
		}
		nsCtx := namespaces.WithNamespace(ctx, rt.Namespace())
		if _, err := rt.Client().SnapshotService(containerd.DefaultSnapshotter).Stat(nsCtx, sb.ID); err == nil {
			t.Errorf("Remove left snapshot %s", sb.ID)
		}
		if _, err := rt.Client().ContainerService().Get(nsCtx, sb.ID); err == nil {
			t.Errorf("Remove left container %s", sb.ID)
		}
	}
}

// TestFailedCreateCleansHost fails Create at different stages and checks
// that no host state is left.
func TestFailedCreateCleansHost(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	for name, mutate := range map[string]func(*runtime.Spec){
		"ready timeout": func(s *runtime.Spec) { s.ReadyTimeout = 20 * time.Millisecond }, // well under a cold create (~150 ms)
		"bad user":      func(s *runtime.Spec) { s.Image = badUserImage },
		"early exit":    func(s *runtime.Spec) { s.Resources.PidsLimit = 1 },
	} {
		spec := testSpec(t, emptyImage)
		mutate(&spec)
		if _, err := rt.Create(ctx, spec); err == nil {
			t.Errorf("%s: Create succeeded", name)
			_ = rt.Remove(ctx, containerd.ContainerID(spec.LeaseID))
			continue
		} else {
			t.Logf("%s: %v", name, err)
		}
		if st := hostState(containerd.ContainerID(spec.LeaseID)); len(st) != 0 {
			t.Errorf("%s: failed Create left %v", name, st)
		}
	}
}

func TestImageMissingText(t *testing.T) {
	rt := newRuntime(t)
	_, err := rt.Create(context.Background(), runtime.Spec{LeaseID: "ct-missing", Image: "berth/does-not-exist", AgentToken: "x"})
	for _, want := range []string{"berth/does-not-exist", "make images", "ctr -a " + rt.Address() + " -n berth images import -"} {
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v\nwant NotFound containing %q", err, want)
		}
	}
}

func TestImageByID(t *testing.T) {
	rt := newRuntime(t)
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	img, err := rt.Client().GetImage(ctx, "docker.io/"+emptyImage)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spec := testSpec(t, cfg.Digest.Encoded()[:12])
	sb := create(t, rt, spec)
	if sb.Image != emptyImage {
		t.Errorf("Image = %q, want %q", sb.Image, emptyImage)
	}
}

// taskPid returns the host pid of sandbox id's agent (its task).
func taskPid(t *testing.T, rt *containerd.Runtime, id string) int {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	resp, err := rt.Client().TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id})
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.GetProcess().GetPid())
}

// TestNonRootUser: an image whose user is 1000:1000 and that has no files
// and no working directory: the agent runs as root and runs commands as
// 1000 (--user); /workspace is created owned by 1000, and so are uploads.
func TestNonRootUser(t *testing.T) {
	rt := newRuntime(t)
	spec := testSpec(t, numUserImage)
	sb := create(t, rt, spec)
	s := ociSpec(t, rt, sb.ID)
	if s.Process.User.UID != 0 || s.Process.User.GID != 0 {
		t.Errorf("agent user = %+v, want root", s.Process.User)
	}
	if !slices.Contains(s.Process.Args, "--user") || !slices.Contains(s.Process.Args, "1000:1000") {
		t.Errorf("agent args %q lack --user 1000:1000", s.Process.Args)
	}
	req, _ := http.NewRequest(http.MethodPut, "http://"+sb.Endpoint+"/v1/files/workspace/hello.txt", strings.NewReader("hi"))
	req.Header.Set("Authorization", "Bearer "+spec.AgentToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Errorf("upload into /workspace as uid 1000: HTTP %d: %s", resp.StatusCode, body)
	}
	root := fmt.Sprintf("/proc/%d/root", taskPid(t, rt, sb.ID))
	for _, p := range []string{"/workspace", "/workspace/hello.txt"} {
		var st syscall.Stat_t
		if err := syscall.Stat(root+p, &st); err != nil {
			t.Errorf("stat %s: %v", p, err)
		} else if st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s owned by %d:%d, want 1000:1000", p, st.Uid, st.Gid)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(root+runtime.TokenPath, &st); err != nil || st.Mode&0o077 != 0 {
		t.Errorf("token file: mode %o, %v; want readable by its owner only", st.Mode&0o777, err)
	}
}

func TestPingUnavailable(t *testing.T) {
	requireContainerd(t)
	rt := newRuntime(t, func(c *containerd.Config) { c.Address = filepath.Join(t.TempDir(), "nope.sock") })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rt.Ping(ctx); !errdefs.IsUnavailable(err) {
		t.Errorf("Ping of a missing socket: %v, want ErrUnavailable", err)
	}
}

func TestImportInvalid(t *testing.T) {
	rt := newRuntime(t)
	if _, err := rt.Import(context.Background(), strings.NewReader("not a tar")); err == nil {
		t.Error("Import of garbage succeeded")
	}
}

// TestIsolationFromDocker checks the firewall against the Docker backend's
// sandboxes on the same host: neither kind can open a connection to the
// other's agent, while the host reaches both.
func TestIsolationFromDocker(t *testing.T) {
	rt := newRuntime(t)
	if !shellOK {
		testenv.SkipOrFailf(t, "%s not in the namespace", shellImage)
	}
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = cli.ImageInspect(ctx, shellImage)
		cancel()
	}
	if err != nil {
		testenv.SkipOrFailf(t, "no Docker Engine with %s: %v", shellImage, err)
	}
	defer cli.Close()
	drt, err := docker.New(context.Background(), docker.Config{AgentBinary: agentBinary, InstanceID: "containerd-test",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer drt.Close()
	cspec, dspec := testSpec(t, shellImage), testSpec(t, shellImage)
	csb := create(t, rt, cspec)
	dsb, err := drt.Create(context.Background(), dspec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drt.Remove(context.Background(), dsb.ID) })

	probe := func(from runtime.Sandbox, token, to string) int {
		host, port, _ := strings.Cut(to, ":")
		body, _ := json.Marshal(map[string]any{"argv": []string{"/bin/sh", "-c", `nc -w 2 "$1" "$2" -e true </dev/null`, "probe", host, port}, "timeout": "10s"})
		req, _ := http.NewRequest(http.MethodPost, "http://"+from.Endpoint+"/v1/exec", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var res struct {
			ExitCode int `json:"exitCode"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			t.Fatal(err)
		}
		return res.ExitCode
	}
	// Control: each reaches its own agent.
	if code := probe(csb, cspec.AgentToken, "127.0.0.1:7000"); code != 0 {
		t.Fatalf("control probe failed: exit %d", code)
	}
	if code := probe(csb, cspec.AgentToken, dsb.Endpoint); code == 0 {
		t.Errorf("containerd sandbox reached the Docker sandbox's agent at %s", dsb.Endpoint)
	}
	if code := probe(dsb, dspec.AgentToken, csb.Endpoint); code == 0 {
		t.Errorf("Docker sandbox reached the containerd sandbox's agent at %s", csb.Endpoint)
	}
}

// TestWatchOOM: a command that exceeds the memory limit is OOM-killed;
// Watch reports it, and the sandbox keeps serving.
func TestWatchOOM(t *testing.T) {
	rt := newRuntime(t)
	if !shellOK {
		testenv.SkipOrFailf(t, "%s not in the namespace", shellImage)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := rt.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spec := testSpec(t, shellImage)
	spec.Resources.MemoryBytes = 48 << 20
	sb := create(t, rt, spec)
	body, _ := json.Marshal(map[string]any{"command": "head -c 200000000 /dev/zero | tail > /dev/null", "timeout": "30s"})
	req, _ := http.NewRequest(http.MethodPost, "http://"+sb.Endpoint+"/v1/exec", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+spec.AgentToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("exec: HTTP %d: %s", resp.StatusCode, out)
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.ID == sb.ID && ev.Kind == runtime.EventOOM {
				if ev.LeaseID != spec.LeaseID {
					t.Errorf("oom event lease = %q, want %q", ev.LeaseID, spec.LeaseID)
				}
				got, err := rt.Get(context.Background(), sb.ID)
				if err != nil || got.State != runtime.StateRunning {
					t.Errorf("after the OOM kill: %+v %v, want still running", got, err)
				}
				return
			}
		case <-timeout:
			t.Fatal("no oom event within 20s")
		}
	}
}

// TestSnapshotInTheWay: a fresh snapshot named after the lease's container
// (another process creating that sandbox) makes Create report
// ErrAlreadyExists and leaves the snapshot alone.
func TestSnapshotInTheWay(t *testing.T) {
	rt := newRuntime(t)
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	spec := testSpec(t, emptyImage)
	id := containerd.ContainerID(spec.LeaseID)
	sn := rt.Client().SnapshotService(containerd.DefaultSnapshotter)
	// gc.root keeps containerd's garbage collector off it, as the lease of
	// the creating client would.
	if _, err := sn.Prepare(ctx, id, "", snapshots.WithLabels(map[string]string{"containerd.io/gc.root": time.Now().UTC().Format(time.RFC3339)})); err != nil {
		t.Fatal(err)
	}
	defer sn.Remove(ctx, id)
	if sb, err := rt.Create(ctx, spec); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Create: %v, want ErrAlreadyExists", err)
		if err == nil {
			_ = rt.Remove(ctx, sb.ID)
		}
	}
	if _, err := sn.Stat(ctx, id); err != nil {
		t.Errorf("the snapshot in the way is gone: %v", err)
	}
}

// TestNoLeftovers runs last: no host state (network namespaces, host
// directories, CNI results and IP allocations, cgroups) may exist without
// its container.
func TestNoLeftovers(t *testing.T) {
	rt := newRuntime(t)
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	list, err := rt.Client().ContainerService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, c := range list {
		live[c.ID] = true
	}
	var orphans []string
	check := func(id, what string) {
		if strings.HasPrefix(id, "berth-") && !live[id] {
			orphans = append(orphans, what)
		}
	}
	entries, _ := os.ReadDir(containerd.DefaultNetnsDir)
	for _, e := range entries {
		check(e.Name(), filepath.Join(containerd.DefaultNetnsDir, e.Name()))
	}
	entries, _ = os.ReadDir(filepath.Join(containerd.DefaultStateDir, "sandboxes"))
	for _, e := range entries {
		check(e.Name(), filepath.Join(containerd.DefaultStateDir, "sandboxes", e.Name()))
	}
	ipam := filepath.Join("/var/lib/cni/networks", containerd.DefaultNetworkName)
	entries, _ = os.ReadDir(ipam)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(ipam, e.Name()))
		first, _, _ := strings.Cut(string(b), "\n")
		check(strings.TrimSpace(first), filepath.Join(ipam, e.Name()))
	}
	entries, _ = os.ReadDir("/var/lib/cni/results")
	for _, e := range entries {
		// Other CNI users on the host (the Kubernetes test cluster's
		// "berth-k8s" network) keep their results here too: only this
		// backend's network is checked.
		rest, ours := strings.CutPrefix(e.Name(), containerd.DefaultNetworkName+"-")
		if !ours {
			continue
		}
		check(strings.TrimSuffix(rest, "-eth0"), filepath.Join("/var/lib/cni/results", e.Name()))
	}
	cgroups, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", rt.Namespace(), "berth-*"))
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", rt.Namespace(), "berth-*"))
	for _, d := range append(cgroups, more...) {
		check(filepath.Base(d), d)
	}
	if len(orphans) > 0 {
		t.Errorf("host state without a container:\n  %s", strings.Join(orphans, "\n  "))
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// ctdWithImage are the options of a bare container (no berth labels) of img.
func ctdWithImage(img ctd.Image) []ctd.NewContainerOpts {
	return []ctd.NewContainerOpts{ctd.WithImage(img), ctd.WithRuntime(containerd.DefaultRuntimeName, nil), ctd.WithNewSpec()}
}
