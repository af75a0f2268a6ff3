package files

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

const benchSize = 256 << 20

// benchBlock is 1 MiB of random data that the benchmarks send repeatedly,
// so that generating data costs nothing measurable.
func benchBlock() []byte {
	b := make([]byte, 1<<20)
	r := rand.NewChaCha8([32]byte{9})
	_, _ = r.Read(b)
	return b
}

// BenchmarkUpload256MiB uploads 256 MiB over gRPC on loopback per
// iteration (to a real file, hashed, renamed into place).
func BenchmarkUpload256MiB(b *testing.B) {
	dir := b.TempDir()
	c := startGRPC(b, newBenchFS(b))
	block := benchBlock()
	p := filepath.Join(dir, "bench.bin")
	ctx := context.Background()
	b.SetBytes(benchSize)
	b.ResetTimer()
	for i := range b.N {
		if i > 0 {
			// Measure the transfer, not the freeing of the last file.
			b.StopTimer()
			_ = os.Remove(p)
			b.StartTimer()
		}
		st, err := c.Upload(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: p}}}); err != nil {
			b.Fatal(err)
		}
		msg := &agentv1.UploadRequest_Chunk{}
		for sent := 0; sent < benchSize; sent += ChunkSize {
			off := sent % len(block)
			msg.Chunk = block[off : off+ChunkSize]
			if err := st.Send(&agentv1.UploadRequest{Msg: msg}); err != nil {
				b.Fatal(err)
			}
		}
		res, err := st.CloseAndRecv()
		if err != nil || res.GetSize() != benchSize {
			b.Fatalf("%v %v", res, err)
		}
	}
}

// BenchmarkDownload256MiB downloads a 256 MiB file over gRPC on loopback
// per iteration.
func BenchmarkDownload256MiB(b *testing.B) {
	dir := b.TempDir()
	fsys := newBenchFS(b)
	c := startGRPC(b, fsys)
	block := benchBlock()
	p := filepath.Join(dir, "bench.bin")
	pr, pw := io.Pipe()
	go func() {
		for range benchSize / len(block) {
			_, _ = pw.Write(block)
		}
		pw.Close()
	}()
	if _, err := fsys.Upload(context.Background(), UploadOptions{Path: p}, pr); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.SetBytes(benchSize)
	b.ResetTimer()
	for range b.N {
		st, err := c.Download(ctx, &agentv1.DownloadRequest{Path: p})
		if err != nil {
			b.Fatal(err)
		}
		var n int
		for {
			m, err := st.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n += len(m.GetChunk())
		}
		if n != benchSize {
			b.Fatalf("downloaded %d bytes", n)
		}
	}
}

func newBenchFS(b *testing.B) *FS {
	return New(Config{Logger: discardLogger()})
}
