package agent_test

import (
	"context"
	"crypto/rand"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// percentile returns the p-th percentile (0..100) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

func reportLatency(b *testing.B, name string, d []time.Duration) (p50 time.Duration) {
	slices.Sort(d)
	p50 = percentile(d, 50)
	b.ReportMetric(float64(p50.Microseconds()), name+"-p50-µs")
	b.ReportMetric(float64(percentile(d, 99).Microseconds()), name+"-p99-µs")
	return p50
}

// BenchmarkExecTrueVsForkExec runs /bin/true over gRPC on loopback and as a
// bare fork/exec on the host, interleaved in one run, and reports p50/p99 of
// both and their ratio (target: within 3x).
func BenchmarkExecTrueVsForkExec(b *testing.B) {
	a := startAgentB(b)
	client := agentv1.NewProcessServiceClient(a.conn)
	ctx := authed(context.Background(), testToken)
	req := &agentv1.ExecRequest{Argv: []string{"/bin/true"}}
	if _, err := client.Exec(ctx, req); err != nil {
		b.Fatal(err)
	}
	agentD := make([]time.Duration, 0, b.N)
	forkD := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
		forkD = append(forkD, time.Since(s))
		s = time.Now()
		res, err := client.Exec(ctx, req)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
		agentD = append(agentD, time.Since(s))
	}
	b.StopTimer()
	ap := reportLatency(b, "agent-grpc", agentD)
	fp := reportLatency(b, "forkexec", forkD)
	b.ReportMetric(float64(ap)/float64(fp), "ratio-p50")
}

// BenchmarkUploadDownload256MiB moves 256 MiB through the agent's gRPC
// Upload and Download on loopback.
func BenchmarkUploadDownload256MiB(b *testing.B) {
	const size = 256 << 20
	a := startAgentB(b)
	files := agentv1.NewFileServiceClient(a.conn)
	ctx := authed(context.Background(), testToken)
	chunk := make([]byte, 1<<20)
	rand.Read(chunk)
	path := filepath.Join(a.workDir, "big.bin")
	var up, down time.Duration
	b.SetBytes(2 * size)
	for i := 0; i < b.N; i++ {
		s := time.Now()
		st, err := files.Upload(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: path}}}); err != nil {
			b.Fatal(err)
		}
		for n := 0; n < size; n += len(chunk) {
			if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk}}); err != nil {
				b.Fatal(err)
			}
		}
		if res, err := st.CloseAndRecv(); err != nil || res.Size != size {
			b.Fatal(res, err)
		}
		up += time.Since(s)
		s = time.Now()
		ds, err := files.Download(ctx, &agentv1.DownloadRequest{Path: path})
		if err != nil {
			b.Fatal(err)
		}
		var got int
		for {
			m, err := ds.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			got += len(m.Chunk)
		}
		if got != size {
			b.Fatalf("downloaded %d bytes", got)
		}
		down += time.Since(s)
	}
	mb := float64(size) / (1 << 20) * float64(b.N)
	b.ReportMetric(mb/up.Seconds(), "upload-MiB/s")
	b.ReportMetric(mb/down.Seconds(), "download-MiB/s")
}
