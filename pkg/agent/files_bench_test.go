package agent_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	// benchClientEnv, set to "agent addr|envd addr|source file|its sha256",
	// makes the test binary the benchmark's client (TestMain).
	benchClientEnv = "BERTH_BENCH_FILES_CLIENT"
	benchFileSize  = 256 << 20
	// benchGRPCChunk is the chunk size of a gRPC upload: what orchestrator
	// cp sends.
	benchGRPCChunk = 256 << 10
)

// procCPU is the user+system CPU time this process has used.
func procCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// xferStats collects one kind of transfer over the rounds.
type xferStats struct {
	walls     []time.Duration
	cpu       []time.Duration // the agent's process
	clientCPU []time.Duration // the client's process
}

// median returns the median of d (the upper one of an even count).
func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

func (s *xferStats) mibps() (best, med float64) {
	mib := float64(benchFileSize) / (1 << 20)
	return mib / slices.Min(s.walls).Seconds(), mib / median(s.walls).Seconds()
}

// cpuPerGiB returns the agent's CPU seconds per GiB moved, least and
// median of the rounds, and the client's median.
func (s *xferStats) cpuPerGiB() (least, med, client float64) {
	gib := float64(benchFileSize) / (1 << 30)
	return slices.Min(s.cpu).Seconds() / gib, median(s.cpu).Seconds() / gib, median(s.clientCPU).Seconds() / gib
}

// BenchmarkFilesUpDown256MiB moves a 256 MiB file up and down through an
// in-process agent on loopback, over the REST raw routes (PUT and GET
// /v1/files/{path}: what users and the orchestrator's proxy send; once
// as is and once with digest=none, which computes no SHA-256), over
// gRPC (FileService Upload and Download, 256 KiB chunks; the upload as is
// and once with no_digest) and over the
// envd-compatible /files routes (POST of a raw body and GET: what E2B's
// SDKs send, and the one upload that computes no SHA-256, since envd's
// answer has none), the ten interleaved in every round, to and from a
// real directory. The client is
// a separate process (this test binary re-executed, see TestMain), so the
// CPU time measured around each transfer (getrusage RUSAGE_SELF, user+sys,
// after a runtime.GC so that each transfer pays for its own garbage) is the
// agent's alone; the client reports its own. The line UPLOAD-BENCH gives,
// per protocol, MiB/s (best and median of the rounds), CPU seconds per GiB
// (least and median of the rounds), and the ratios of issue 25's targets:
// upload MiB/s / download MiB/s (target >= 0.65) and upload CPU per byte /
// download CPU per byte (target <= 1.2), of the best and of the median
// rounds. The least CPU is the code's own cost: on a virtual machine that
// hands free memory back to its host (free page reporting), an upload
// whose new page-cache pages the host must map again costs about twice
// the CPU, and which rounds do varies from run to run.
func BenchmarkFilesUpDown256MiB(b *testing.B) {
	work := b.TempDir()
	srv, err := agent.New(agent.Config{Token: testToken, WorkDir: work, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	addr := testserve.Serve(b, srv.Serve)
	envdAddr := testserve.Serve(b, srv.ServeEnvd)
	src := filepath.Join(b.TempDir(), "src.bin")
	sum := writeBenchFile(b, src)
	cl := startBenchClient(b, addr, envdAddr, src, sum)
	type op struct{ name, cmd, path string }
	restPath := filepath.Join(work, "rest.bin")
	restNDPath := filepath.Join(work, "rest-nodigest.bin")
	grpcPath := filepath.Join(work, "grpc.bin")
	grpcNDPath := filepath.Join(work, "grpc-nodigest.bin")
	envdPath := filepath.Join(work, "envd.bin")
	ops := []op{
		{"rest-up", "rest-put", restPath}, {"rest-down", "rest-get", restPath},
		{"rest-nodigest-up", "rest-put-nodigest", restNDPath}, {"rest-nodigest-down", "rest-get", restNDPath},
		{"grpc-up", "grpc-put", grpcPath}, {"grpc-down", "grpc-get", grpcPath},
		{"grpc-nodigest-up", "grpc-put-nodigest", grpcNDPath}, {"grpc-nodigest-down", "grpc-get", grpcNDPath},
		{"envd-up", "envd-put", envdPath}, {"envd-down", "envd-get", envdPath},
	}
	stats := map[string]*xferStats{}
	for _, o := range ops {
		stats[o.name] = &xferStats{}
	}
	round := func(record bool) {
		for _, o := range ops {
			runtime.GC()
			c0 := procCPU()
			t0 := time.Now()
			n, clientCPU, err := cl.do(o.cmd, o.path)
			wall := time.Since(t0)
			cpu := procCPU() - c0
			if err != nil {
				b.Fatalf("%s: %v", o.name, err)
			}
			if n != benchFileSize {
				b.Fatalf("%s: moved %d bytes, want %d", o.name, n, benchFileSize)
			}
			if record {
				s := stats[o.name]
				s.walls = append(s.walls, wall)
				s.cpu = append(s.cpu, cpu)
				s.clientCPU = append(s.clientCPU, clientCPU)
			}
			if strings.HasSuffix(o.name, "-down") {
				// The next upload creates the file anew; freeing this one
				// is not part of a transfer.
				if err := os.Remove(o.path); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	round(false) // warm-up: connections, the source file's page cache
	b.ResetTimer()
	for range b.N {
		round(true)
	}
	b.StopTimer()

	var line strings.Builder
	line.WriteString("UPLOAD-BENCH")
	for _, proto := range []string{"rest", "rest-nodigest", "grpc", "grpc-nodigest", "envd"} {
		up, down := stats[proto+"-up"], stats[proto+"-down"]
		upBest, upMed := up.mibps()
		downBest, downMed := down.mibps()
		upLeast, upCPU, upClient := up.cpuPerGiB()
		downLeast, downCPU, downClient := down.cpuPerGiB()
		speed, cpuRatio := upMed/downMed, upCPU/downCPU
		fmt.Fprintf(&line, " | %s: up %.0f MiB/s best, %.0f median; down %.0f best, %.0f median;"+
			" up/down %.2f best, %.2f median (target >= 0.65);"+
			" agent CPU s/GiB up %.3f least, %.3f median; down %.3f least, %.3f median;"+
			" up/down %.2f least, %.2f median (target <= 1.2);"+
			" client CPU s/GiB (median) up %.3f, down %.3f",
			proto, upBest, upMed, downBest, downMed, upBest/downBest, speed,
			upLeast, upCPU, downLeast, downCPU, upLeast/downLeast, cpuRatio, upClient, downClient)
		b.ReportMetric(upMed, proto+"-up-MiB/s")
		b.ReportMetric(downMed, proto+"-down-MiB/s")
		b.ReportMetric(speed, proto+"-up/down-speed")
		b.ReportMetric(cpuRatio, proto+"-up/down-cpu")
		b.ReportMetric(upLeast/downLeast, proto+"-up/down-cpu-least")
	}
	fmt.Fprintf(&line, " | %d rounds of 256 MiB each way", b.N)
	fmt.Println(line.String())
}

// writeBenchFile writes benchFileSize random bytes (one random MiB
// repeated) to p and returns their hex SHA-256.
func writeBenchFile(b *testing.B, p string) string {
	block := make([]byte, 1<<20)
	rand.Read(block)
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	h := sha256.New()
	for range benchFileSize / len(block) {
		h.Write(block)
		if _, err := f.Write(block); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// benchClient drives the client process: one command line in, one answer
// line out.
type benchClient struct {
	in  io.Writer
	out *bufio.Reader
}

func startBenchClient(b *testing.B, addr, envdAddr, src, sum string) *benchClient {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), benchClientEnv+"="+addr+"|"+envdAddr+"|"+src+"|"+sum)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close() // the client exits at the end of its input
		if err := cmd.Wait(); err != nil {
			b.Errorf("bench client: %v", err)
		}
	})
	return &benchClient{in: in, out: bufio.NewReader(out)}
}

// do runs one transfer in the client and returns the bytes moved and the
// client's CPU time.
func (c *benchClient) do(cmd, path string) (int64, time.Duration, error) {
	if _, err := fmt.Fprintf(c.in, "%s %s\n", cmd, path); err != nil {
		return 0, 0, err
	}
	line, err := c.out.ReadString('\n')
	if err != nil {
		return 0, 0, fmt.Errorf("bench client: %w", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "ok" {
		return 0, 0, errors.New(strings.TrimSpace(line))
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	cpu, _ := strconv.ParseInt(f[2], 10, 64)
	return n, time.Duration(cpu), nil
}

// runBenchClient is the client process: it reads "<command> <path>" lines
// (rest-put, rest-put-nodigest, rest-get, grpc-put, grpc-get, envd-put,
// envd-get) and answers
// each with
// "ok <bytes> <its CPU ns>" or "err <message>".
func runBenchClient() int {
	cfg := strings.Split(os.Getenv(benchClientEnv), "|")
	if len(cfg) != 4 {
		fmt.Fprintln(os.Stderr, "bench client: bad", benchClientEnv)
		return 2
	}
	c := &xferClient{
		addr: cfg[0], envdAddr: cfg[1], src: cfg[2], sum: cfg[3],
		http: &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 4}},
		buf:  make([]byte, 1<<20),
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench client:", err)
		return 2
	}
	defer conn.Close()
	c.files = agentv1.NewFileServiceClient(conn)
	ctx := authed(context.Background(), testToken)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, p, _ := strings.Cut(in.Text(), " ")
		c0 := procCPU()
		var n int64
		var err error
		switch cmd {
		case "rest-put":
			n, err = c.restPut(ctx, p, true)
		case "rest-put-nodigest":
			n, err = c.restPut(ctx, p, false)
		case "rest-get":
			n, err = c.restGet(ctx, p)
		case "grpc-put":
			n, err = c.grpcPut(ctx, p, true)
		case "grpc-put-nodigest":
			n, err = c.grpcPut(ctx, p, false)
		case "grpc-get":
			n, err = c.grpcGet(ctx, p)
		case "envd-put":
			n, err = c.envdPut(ctx, p)
		case "envd-get":
			n, err = c.envdGet(ctx, p)
		default:
			err = fmt.Errorf("unknown command %q", cmd)
		}
		cpu := procCPU() - c0
		if err != nil {
			fmt.Printf("err %s: %s\n", cmd, strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Printf("ok %d %d\n", n, cpu.Nanoseconds())
	}
	return 0
}

type xferClient struct {
	addr, envdAddr, src, sum string
	http                     *http.Client
	files                    agentv1.FileServiceClient
	buf                      []byte
}

// putFile sends the source file as the body of req and returns the
// answer's body, which must come with status want.
func (c *xferClient) putFile(req *http.Request, want int) ([]byte, error) {
	f, err := os.Open(c.src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	req.Body = f
	req.ContentLength = benchFileSize
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		return nil, fmt.Errorf("%s: HTTP %d: %s", req.Method, resp.StatusCode, body)
	}
	return body, nil
}

// getFile reads the body of the answer to req (status 200) and returns
// its length.
func (c *xferClient) getFile(req *http.Request) (int64, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("GET: HTTP %d: %s", resp.StatusCode, body)
	}
	// A plain writer: io.Discard's ReadFrom would read in 8 KiB pieces.
	return io.CopyBuffer(struct{ io.Writer }{io.Discard}, resp.Body, c.buf)
}

// restPut uploads over REST; without digest it asks for none (digest=none)
// and checks that the answer has none.
func (c *xferClient) restPut(ctx context.Context, p string, digest bool) (int64, error) {
	u := "http://" + c.addr + "/v1/files" + p
	want := c.sum
	if !digest {
		u, want = u+"?digest=none", ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	body, err := c.putFile(req, http.StatusCreated)
	if err != nil {
		return 0, err
	}
	var res struct {
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	if err := json.Unmarshal(body, &res); err != nil {
		return 0, err
	}
	if res.SHA256 != want {
		return 0, fmt.Errorf("PUT: sha256 %q, want %q", res.SHA256, want)
	}
	return res.Size, nil
}

func (c *xferClient) restGet(ctx context.Context, p string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.addr+"/v1/files"+p, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	return c.getFile(req)
}

func (c *xferClient) envdURL(p string) string {
	return "http://" + c.envdAddr + "/files?" + url.Values{"path": {p}}.Encode()
}

func (c *xferClient) envdPut(ctx context.Context, p string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.envdURL(p), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Access-Token", testToken)
	if _, err := c.putFile(req, http.StatusOK); err != nil {
		return 0, err
	}
	fi, err := os.Stat(p) // envd's answer has no size
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (c *xferClient) envdGet(ctx context.Context, p string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.envdURL(p), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Access-Token", testToken)
	return c.getFile(req)
}

// grpcPut uploads over gRPC; without digest it asks for none
// (UploadHeader.no_digest) and checks none.
func (c *xferClient) grpcPut(ctx context.Context, p string, digest bool) (int64, error) {
	f, err := os.Open(c.src)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := c.files.Upload(ctx)
	if err != nil {
		return 0, err
	}
	if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: p, NoDigest: !digest}}}); err != nil {
		return 0, err
	}
	chunk := c.buf[:benchGRPCChunk]
	msg := &agentv1.UploadRequest_Chunk{}
	for {
		n, rerr := io.ReadFull(f, chunk)
		if n > 0 {
			msg.Chunk = chunk[:n]
			if err := st.Send(&agentv1.UploadRequest{Msg: msg}); err != nil {
				return 0, err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return 0, rerr
		}
	}
	res, err := st.CloseAndRecv()
	if err != nil {
		return 0, err
	}
	want := "" // no digest asked for, none answered
	if digest {
		want = c.sum
	}
	if res.GetSha256() != want {
		return 0, fmt.Errorf("Upload: sha256 %q, want %q", res.GetSha256(), want)
	}
	return res.GetSize(), nil
}

func (c *xferClient) grpcGet(ctx context.Context, p string) (int64, error) {
	st, err := c.files.Download(ctx, &agentv1.DownloadRequest{Path: p})
	if err != nil {
		return 0, err
	}
	var n int64
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n += int64(len(m.GetChunk()))
	}
}
