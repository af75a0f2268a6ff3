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
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// fakeClient implements Client; methods a test does not set panic through
// the nil embedded interface, so a test states exactly what it expects.
type fakeClient struct {
	Client

	mu      sync.Mutex
	removed []string
	copied  []byte

	imageInspect    func(ref string) (image.InspectResponse, error)
	containerCreate func(name string, cfg *container.Config, hc *container.HostConfig) (container.CreateResponse, error)
	containerStart  func(id string) error
	containerList   func(opts container.ListOptions) ([]container.Summary, error)
	copyFrom        func(id, path string) (io.ReadCloser, error)
	logs            []byte
	events          chan events.Message
	eventErrs       chan error
}

func (f *fakeClient) DaemonHost() string { return "unix:///fake.sock" }

func (f *fakeClient) ImageInspect(_ context.Context, ref string, _ ...client.ImageInspectOption) (image.InspectResponse, error) {
	return f.imageInspect(ref)
}

func (f *fakeClient) NetworkList(context.Context, network.ListOptions) ([]network.Summary, error) {
	return []network.Summary{{Name: "berth", ID: "net1", Driver: "bridge", Options: map[string]string{optICC: "false"}}}, nil
}

func (f *fakeClient) ContainerCreate(_ context.Context, cfg *container.Config, hc *container.HostConfig, _ *network.NetworkingConfig, _ *ocispec.Platform, name string) (container.CreateResponse, error) {
	return f.containerCreate(name, cfg, hc)
}

func (f *fakeClient) CopyToContainer(_ context.Context, _, _ string, r io.Reader, _ container.CopyToContainerOptions) error {
	b, err := io.ReadAll(r)
	f.mu.Lock()
	f.copied = b
	f.mu.Unlock()
	return err
}

func (f *fakeClient) CopyFromContainer(_ context.Context, id, path string) (io.ReadCloser, container.PathStat, error) {
	rc, err := f.copyFrom(id, path)
	return rc, container.PathStat{}, err
}

func (f *fakeClient) ContainerStart(_ context.Context, id string, _ container.StartOptions) error {
	return f.containerStart(id)
}

func (f *fakeClient) ContainerLogs(context.Context, string, container.LogsOptions) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(f.logs)), nil
}

func (f *fakeClient) ContainerRemove(_ context.Context, id string, opts container.RemoveOptions) error {
	if !opts.Force || !opts.RemoveVolumes {
		return fmt.Errorf("remove without force/volumes: %+v", opts)
	}
	f.mu.Lock()
	f.removed = append(f.removed, id)
	f.mu.Unlock()
	return nil
}

func (f *fakeClient) ContainerList(_ context.Context, opts container.ListOptions) ([]container.Summary, error) {
	return f.containerList(opts)
}

func (f *fakeClient) Events(context.Context, events.ListOptions) (<-chan events.Message, <-chan error) {
	return f.events, f.eventErrs
}

func (f *fakeClient) Ping(context.Context) (types.Ping, error) { return types.Ping{}, nil }

func newFakeRuntime(t *testing.T, f *fakeClient) *Runtime {
	t.Helper()
	// Create does not re-check the binary (New does), so any file will do.
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, []byte("\x7fELF fake agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{
		cfg: Config{AgentBinary: agent, Network: DefaultNetwork, ReadyTimeout: 5 * time.Second, Injection: InjectCopy,
			DefaultResources: runtime.Resources{NanoCPUs: runtime.DefaultNanoCPUs, MemoryBytes: runtime.DefaultMemoryBytes, PidsLimit: runtime.DefaultPidsLimit}},
		cli:    f,
		log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		health: runtime.NewHealthProber(),
	}
	return r
}

func TestMapErr(t *testing.T) {
	r := &Runtime{cli: &fakeClient{}}
	cases := []struct {
		in   error
		want error
	}{
		{cerrdefs.ErrNotFound, errdefs.ErrNotFound},
		{cerrdefs.ErrConflict, errdefs.ErrFailedPrecondition},
		{cerrdefs.ErrAlreadyExists, errdefs.ErrAlreadyExists}, // as on containerd (was FailedPrecondition)
		{cerrdefs.ErrInvalidArgument, errdefs.ErrInvalidArgument},
		{cerrdefs.ErrUnavailable, errdefs.ErrUnavailable},
		{cerrdefs.ErrPermissionDenied, errdefs.ErrPermissionDenied},
		{errors.New("boom"), errdefs.ErrInternal},
	}
	for _, c := range cases {
		got := r.mapErr(fmt.Errorf("daemon: %w", c.in), "op", "id1")
		if !errors.Is(got, c.want) || !errors.Is(got, c.in) {
			t.Errorf("mapErr(%v) = %v; want it to match %v and keep the original", c.in, got, c.want)
		}
		if !strings.Contains(got.Error(), "op id1") {
			t.Errorf("mapErr(%v) = %q; want the op and id", c.in, got)
		}
	}
	if got := r.mapErr(context.Canceled, "op", "x"); !errors.Is(got, context.Canceled) || errors.Is(got, errdefs.ErrInternal) {
		t.Errorf("mapErr(Canceled) = %v", got)
	}
	if r.mapErr(nil, "op", "x") != nil {
		t.Error("mapErr(nil) != nil")
	}
}

func TestToEvent(t *testing.T) {
	attrs := map[string]string{"exitCode": "137", runtime.LabelLease: "l1"}
	ev, ok := toEvent(events.Message{Type: events.ContainerEventType, Action: events.ActionDie, Actor: events.Actor{ID: "c1", Attributes: attrs}, TimeNano: 1e18})
	if !ok || ev.Kind != runtime.EventDied || ev.ExitCode != 137 || ev.LeaseID != "l1" || ev.ID != "c1" || !ev.At.Equal(time.Unix(0, 1e18)) {
		t.Errorf("die = %+v %v", ev, ok)
	}
	if ev, ok := toEvent(events.Message{Type: events.ContainerEventType, Action: events.ActionOOM}); !ok || ev.Kind != runtime.EventOOM {
		t.Errorf("oom = %+v", ev)
	}
	if ev, ok := toEvent(events.Message{Type: events.ContainerEventType, Action: events.ActionDestroy}); !ok || ev.Kind != runtime.EventRemoved {
		t.Errorf("destroy = %+v", ev)
	}
	if _, ok := toEvent(events.Message{Type: events.ContainerEventType, Action: events.ActionStart}); ok {
		t.Error("start event translated")
	}
	if _, ok := toEvent(events.Message{Type: events.NetworkEventType, Action: events.ActionDestroy}); ok {
		t.Error("network event translated")
	}
}

func TestWatchClosesOnStreamError(t *testing.T) {
	f := &fakeClient{events: make(chan events.Message, 1), eventErrs: make(chan error, 1),
		containerList: func(container.ListOptions) ([]container.Summary, error) { return nil, nil }}
	r := newFakeRuntime(t, f)
	ch, err := r.Watch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f.events <- events.Message{Type: events.ContainerEventType, Action: events.ActionDie, Actor: events.Actor{ID: "c1", Attributes: map[string]string{"exitCode": "3"}}}
	if ev := <-ch; ev.ExitCode != 3 {
		t.Errorf("event = %+v", ev)
	}
	f.eventErrs <- errors.New("engine restarted")
	select {
	case _, ok := <-ch:
		if ok {
			t.Error("unexpected event")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("channel not closed after a stream error")
	}
}

func TestArchive(t *testing.T) {
	r := newFakeRuntime(t, &fakeClient{})
	var buf bytes.Buffer
	if err := r.writeArchive(&buf, archive{agent: true, token: "s3cret", ws: &workspaceDir{path: "/workspace", uid: 1000, gid: 100}}); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(r.cfg.AgentBinary)
	want := map[string]struct {
		typ      byte
		mode     int64
		size     int64
		uid, gid int
	}{
		".berth/":              {tar.TypeDir, 0o755, 0, 0, 0},
		".berth/sandbox-agent": {tar.TypeReg, 0o755, st.Size(), 0, 0},
		".berth/token":         {tar.TypeReg, 0o400, 6, 0, 0},
		"workspace/":           {tar.TypeDir, 0o755, 0, 1000, 100},
	}
	tr := tar.NewReader(&buf)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		w, ok := want[h.Name]
		if !ok {
			t.Errorf("unexpected entry %s", h.Name)
			continue
		}
		if h.Typeflag != w.typ || h.Mode != w.mode || h.Size != w.size || h.Uid != w.uid || h.Gid != w.gid {
			t.Errorf("%s: type %c mode %o size %d owner %d:%d; want %c %o %d %d:%d", h.Name, h.Typeflag, h.Mode, h.Size, h.Uid, h.Gid, w.typ, w.mode, w.size, w.uid, w.gid)
		}
		if h.Name == ".berth/token" {
			if b, _ := io.ReadAll(tr); string(b) != "s3cret" {
				t.Errorf("token = %q", b)
			}
		}
	}
	if len(names) != len(want) || names[0] != ".berth/" {
		t.Errorf("entries = %v", names)
	}
}

func etcTar(t *testing.T, name, content string) io.ReadCloser {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte(content))
	_ = tw.Close()
	return io.NopCloser(&buf)
}

func TestResolveOwner(t *testing.T) {
	passwd := "root:x:0:0::/root:/bin/sh\n# comment\nnobody:x:65534:65534::/:/bin/false\ndev:x:1000:1001::/home/dev:/bin/sh\n"
	group := "root:x:0:\nstaff:x:50:\n"
	reads := 0
	f := &fakeClient{copyFrom: func(_, path string) (io.ReadCloser, error) {
		reads++
		switch path {
		case "/etc/passwd":
			return etcTar(t, "passwd", passwd), nil
		case "/etc/group":
			return etcTar(t, "group", group), nil
		}
		return nil, cerrdefs.ErrNotFound
	}}
	r := newFakeRuntime(t, f)
	cases := []struct {
		user     string
		uid, gid int
		reads    int
	}{
		{"", 0, 0, 0},
		{"root", 0, 0, 0},
		{"0", 0, 0, 0},
		{"1000:1000", 1000, 1000, 0},
		{"dev", 1000, 1001, 1},
		{"nobody", 65534, 65534, 1},
		{"1000", 1000, 1001, 1},
		{"4242", 4242, 0, 1},
		{"dev:staff", 1000, 50, 2},
		{"ghost", 0, 0, 1},
	}
	for _, c := range cases {
		reads = 0
		uid, gid := r.resolveOwner(context.Background(), "c1", c.user)
		if uid != c.uid || gid != c.gid || reads != c.reads {
			t.Errorf("resolveOwner(%q) = %d:%d after %d reads; want %d:%d after %d", c.user, uid, gid, reads, c.uid, c.gid, c.reads)
		}
	}
}

func TestCreateFailureCleansUp(t *testing.T) {
	var logs bytes.Buffer
	w := stdcopy.NewStdWriter(&logs, stdcopy.Stderr)
	for i := range 30 {
		fmt.Fprintf(w, "log line %d\n", i)
	}
	var gotCfg *container.Config
	var gotHC *container.HostConfig
	f := &fakeClient{
		imageInspect: func(string) (image.InspectResponse, error) {
			return image.InspectResponse{Os: "linux", Config: &dockerspec.DockerOCIImageConfig{ImageConfig: ocispec.ImageConfig{WorkingDir: "/src"}}}, nil
		},
		containerCreate: func(name string, cfg *container.Config, hc *container.HostConfig) (container.CreateResponse, error) {
			gotCfg, gotHC = cfg, hc
			return container.CreateResponse{ID: "cid1"}, nil
		},
		containerStart: func(string) error { return errors.New("runc: exec format error") },
		logs:           logs.Bytes(),
	}
	r := newFakeRuntime(t, f)
	_, err := r.Create(context.Background(), runtime.Spec{LeaseID: "l1", Image: "x/y", AgentToken: "tok", Labels: map[string]string{"team": "a"}})
	if err == nil {
		t.Fatal("Create succeeded")
	}
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "exec format error") {
		t.Errorf("err = %v; want FailedPrecondition with the engine's message", err)
	}
	if !strings.Contains(err.Error(), "log line 29") || !strings.Contains(err.Error(), "log line 10") || strings.Contains(err.Error(), "log line 9\n") {
		t.Errorf("err should carry the last 20 log lines:\n%v", err)
	}
	if !slices.Equal(f.removed, []string{"cid1"}) {
		t.Errorf("removed = %v, want [cid1]", f.removed)
	}
	if len(f.copied) == 0 {
		t.Error("agent not injected before start")
	}
	// What was asked of the engine.
	if gotCfg.WorkingDir != "/src" || !slices.Contains(gotCfg.Entrypoint, "/src") {
		t.Errorf("image WorkingDir not used: %v %q", gotCfg.Entrypoint, gotCfg.WorkingDir)
	}
	if gotCfg.Labels[runtime.LabelUserPrefix+"team"] != "a" || gotCfg.Labels[runtime.LabelManaged] != "true" || gotCfg.Labels[runtime.LabelLease] != "l1" {
		t.Errorf("labels = %v", gotCfg.Labels)
	}
	if string(gotHC.NetworkMode) != "net1" || gotHC.Memory != runtime.DefaultMemoryBytes || gotHC.MemorySwap != runtime.DefaultMemoryBytes || *gotHC.PidsLimit != runtime.DefaultPidsLimit || gotHC.NanoCPUs != runtime.DefaultNanoCPUs {
		t.Errorf("host config = %+v", gotHC)
	}
}

func TestCreateDuplicateLease(t *testing.T) {
	f := &fakeClient{
		imageInspect: func(string) (image.InspectResponse, error) { return image.InspectResponse{}, nil },
		containerCreate: func(name string, _ *container.Config, _ *container.HostConfig) (container.CreateResponse, error) {
			return container.CreateResponse{}, fmt.Errorf("Conflict. The container name %q is already in use: %w", "/"+name, cerrdefs.ErrConflict)
		},
	}
	r := newFakeRuntime(t, f)
	_, err := r.Create(context.Background(), runtime.Spec{LeaseID: "l1", Image: "x", AgentToken: "tok"})
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "lease l1") {
		t.Errorf("err = %v; want AlreadyExists naming the lease", err)
	}
	if len(f.removed) != 0 {
		t.Errorf("removed %v: the existing container must be left alone", f.removed)
	}
}

func TestCreateMissingImage(t *testing.T) {
	f := &fakeClient{imageInspect: func(string) (image.InspectResponse, error) {
		return image.InspectResponse{}, fmt.Errorf("No such image: x: %w", cerrdefs.ErrNotFound)
	}}
	r := newFakeRuntime(t, f)
	_, err := r.Create(context.Background(), runtime.Spec{LeaseID: "l1", Image: "x", AgentToken: "tok"})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "make images") {
		t.Errorf("err = %v", err)
	}
}

func TestListFilters(t *testing.T) {
	var got container.ListOptions
	f := &fakeClient{containerList: func(opts container.ListOptions) ([]container.Summary, error) {
		got = opts
		return []container.Summary{
			{ID: "a", Names: []string{"/berth-l1"}, Labels: map[string]string{runtime.LabelManaged: "true", runtime.LabelLease: "l1"}, State: "exited", Status: "Exited (137) 2 seconds ago"},
			{ID: "foreign", Labels: map[string]string{runtime.LabelLease: "l1"}},
		}, nil
	}}
	r := newFakeRuntime(t, f)
	list, err := r.List(context.Background(), runtime.Selector{runtime.LabelLease: "l1"})
	if err != nil {
		t.Fatal(err)
	}
	labels := got.Filters.Get("label")
	slices.Sort(labels)
	if !got.All || !slices.Equal(labels, []string{runtime.LabelLease + "=l1", runtime.LabelManaged + "=true"}) {
		t.Errorf("list options = %+v %v", got, labels)
	}
	if len(list) != 1 || list[0].ID != "a" || list[0].Name != "berth-l1" || list[0].State != runtime.StateExited || list[0].ExitCode != 137 {
		t.Errorf("list = %+v", list)
	}
	if _, err := r.List(context.Background(), runtime.Selector{"a=b": "c"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad selector key: %v", err)
	}
}

func TestCheckAgentBinary(t *testing.T) {
	dir := t.TempDir()
	if _, err := runtime.CheckAgentBinary(filepath.Join(dir, "missing")); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "CGO_ENABLED=0 go build") {
		t.Errorf("missing: %v", err)
	}
	notELF := filepath.Join(dir, "script")
	_ = os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	if _, err := runtime.CheckAgentBinary(notELF); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "not an ELF") {
		t.Errorf("not ELF: %v", err)
	}
	if _, err := runtime.CheckAgentBinary(dir); !errdefs.IsInvalidArgument(err) {
		t.Errorf("directory: %v", err)
	}
	if _, err := New(context.Background(), Config{}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "agent_binary") {
		t.Errorf("New without AgentBinary: %v", err)
	}
}
