package containerd_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"
	dockerclient "github.com/docker/docker/client"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/conformance"
	"github.com/berth-dev/berth/pkg/runtime/containerd"
	"github.com/berth-dev/berth/pkg/runtime/docker"
)

// The benchmarks compare this backend with the Docker backend in one run:
//
//	go test -run '^$' -bench . -benchtime 20x ./pkg/runtime/containerd/
//
// BenchmarkCreate is a cold Create (create, agent in place, start, GET
// /healthz answers) of the empty image; Remove is not timed. The
// docker-cli sub-benchmark is the DESIGN's yardstick for a cold acquire:
// `docker run -d` plus one `docker exec`.
func BenchmarkCreate(b *testing.B) {
	b.Run("containerd", func(b *testing.B) { benchmarkCreate(b, newRuntime(b), emptyImage) })
	b.Run("docker-copy", func(b *testing.B) {
		benchmarkCreate(b, newDockerRuntime(b, docker.InjectCopy), emptyImage)
	})
	b.Run("docker-volume", func(b *testing.B) {
		benchmarkCreate(b, newDockerRuntime(b, docker.InjectVolume), emptyImage)
	})
	b.Run("docker-cli-run+exec", benchmarkDockerCLI)
}

func benchmarkCreate(b *testing.B, rt runtime.Runtime, img string) {
	conformance.BenchmarkCreate(b, rt, func() runtime.Spec { return testSpec(b, img) })
}

// benchmarkDockerCLI times `docker run -d` of berth/minimal plus one
// `docker exec true`; `docker rm -f` is not timed.
func benchmarkDockerCLI(b *testing.B) {
	requireDockerImage(b, shellImage)
	run := func(args ...string) string {
		out, err := exec.Command("docker", args...).CombinedOutput()
		if err != nil {
			b.Fatalf("docker %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for i := 0; i <= b.N; i++ {
		if i == 1 {
			b.ResetTimer() // the first round warms up
		}
		id := run("run", "-d", "--network", "none", shellImage, "sleep", "300")
		run("exec", id, "true")
		b.StopTimer()
		run("rm", "-f", id)
		b.StartTimer()
	}
}

// BenchmarkExecTrue is one round trip of POST /v1/exec {"argv":["true"]}
// straight to the agent of a berth/minimal sandbox, over a kept-alive
// connection, on each backend.
func BenchmarkExecTrue(b *testing.B) {
	b.Run("containerd", func(b *testing.B) {
		if !shellOK {
			testenv.SkipOrFailf(b, "%s not in the namespace", shellImage)
		}
		benchmarkExec(b, newRuntime(b))
	})
	b.Run("docker", func(b *testing.B) {
		requireDockerImage(b, shellImage)
		benchmarkExec(b, newDockerRuntime(b, docker.InjectVolume))
	})
}

func benchmarkExec(b *testing.B, rt runtime.Runtime) {
	ctx := context.Background()
	spec := testSpec(b, shellImage)
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rt.Remove(context.Background(), sb.ID) })
	c := &http.Client{Transport: &http.Transport{Proxy: nil}}
	exec := func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+sb.Endpoint+"/v1/exec", strings.NewReader(`{"argv":["true"]}`))
		req.Header.Set("Authorization", "Bearer "+spec.AgentToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var res struct {
			ExitCode int `json:"exitCode"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &res) != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: HTTP %d: %s", resp.StatusCode, body)
		}
	}
	for range 10 {
		exec()
	}
	b.ResetTimer()
	for range b.N {
		exec()
	}
}

// newDockerRuntime returns the Docker backend for comparison, skipping when
// no Docker Engine answers. The empty image is created there if missing.
func newDockerRuntime(b *testing.B, mode docker.Injection) *docker.Runtime {
	b.Helper()
	requireContainerd(b) // for the agent binary
	cli := dockerCLI(b)
	ctx := context.Background()
	if _, err := cli.ImageInspect(ctx, emptyImage); err != nil {
		var buf bytes.Buffer
		_ = tar.NewWriter(&buf).Close()
		rc, err := cli.ImageImport(ctx, image.ImportSource{Source: &buf, SourceName: "-"}, emptyImage, image.ImportOptions{})
		if err != nil {
			b.Fatalf("docker import %s: %v", emptyImage, err)
		}
		_, _ = io.Copy(io.Discard, rc)
		rc.Close()
	}
	rt, err := docker.New(ctx, docker.Config{
		AgentBinary: agentBinary,
		InstanceID:  "containerd-bench",
		Injection:   mode,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rt.Close() })
	if mode == docker.InjectVolume {
		// The volume injection caches the agent in a volume per agent
		// build, which the engine keeps; the benchmark's is removed (a
		// volume still in use stays).
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if name, err := docker.AgentVolumeName(agentBinary); err == nil {
				_ = cli.VolumeRemove(ctx, name, false)
			}
		})
	}
	return rt
}

func dockerCLI(b *testing.B) *dockerclient.Client {
	b.Helper()
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = cli.Ping(ctx)
		cancel()
	}
	if err != nil {
		testenv.SkipOrFailf(b, "Docker Engine unreachable: %v", err)
	}
	b.Cleanup(func() { _ = cli.Close() })
	return cli
}

func requireDockerImage(b *testing.B, ref string) {
	b.Helper()
	if _, err := dockerCLI(b).ImageInspect(context.Background(), ref); err != nil {
		testenv.SkipOrFailf(b, "%s not in the Docker Engine (make images)", ref)
	}
}

// BenchmarkCreateUserNS is the cold-start cost of user namespaces: a cold
// Create of berth/base without and with Config.UserNamespaces (the image's
// remapped snapshot made by the warm-up, as in steady state), and
// "userns-first": the first sandbox of an image, which also remaps the
// image (chowns every file into the range; the remapped snapshot is removed
// before each iteration). It logs the ratio userns/plain.
//
//	go test -run '^$' -bench CreateUserNS -benchtime 5x ./pkg/runtime/containerd/
func BenchmarkCreateUserNS(b *testing.B) {
	if !baseOK {
		testenv.SkipOrFailf(b, "%s is not present (make images)", baseImage)
	}
	const base = 300000
	perOp := map[string]time.Duration{}
	for _, mode := range []string{"plain", "userns", "userns-first"} {
		b.Run(mode, func(b *testing.B) {
			rt := newRuntime(b, func(c *containerd.Config) {
				c.UserNamespaces, c.UserNSBase = mode != "plain", base
			})
			ctx := context.Background()
			removeRemapped := func() { removeRemappedSnapshots(b, rt, base) }
			if mode != "plain" {
				b.Cleanup(removeRemapped)
			}
			create := func(i int) {
				spec := testSpec(b, baseImage)
				spec.LeaseID = fmt.Sprintf("bench-%s-%d-%d", mode, time.Now().UnixNano(), i)
				spec.ReadyTimeout = 10 * time.Minute
				sb, err := rt.Create(ctx, spec)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := rt.Remove(ctx, sb.ID); err != nil {
					b.Fatal(err)
				}
				if mode == "userns-first" {
					removeRemapped()
				}
				b.StartTimer()
			}
			create(-1) // warm-up: host setup, image unpacked (and remapped)
			if mode == "userns-first" {
				removeRemapped()
			}
			b.ResetTimer()
			for i := range b.N {
				create(i)
			}
			b.StopTimer()
			perOp[mode] = b.Elapsed() / time.Duration(b.N)
		})
	}
	if p, u := perOp["plain"], perOp["userns"]; p > 0 && u > 0 {
		b.Logf("cold Create of %s: plain %s, userns %s (ratio %.2f), first sandbox of the image with userns %s (ratio %.2f)",
			baseImage, p.Round(time.Millisecond), u.Round(time.Millisecond), float64(u)/float64(p),
			perOp["userns-first"].Round(time.Millisecond), float64(perOp["userns-first"])/float64(p))
	}
}
