package proxy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// tarOf is a tar of n files of size bytes each.
func tarOf(t *testing.T, n, size int) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := bytes.Repeat([]byte("a"), size)
	for i := range n {
		if err := tw.WriteHeader(&tar.Header{Name: "d/f" + string(rune('a'+i)), Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	return buf.Bytes()
}

// Archive uploads (REST, plain and gzip, and gRPC) are held to the lease's
// disk limit like file uploads; a gzip body counts decompressed.
func TestArchiveUploadOverDiskLimit(t *testing.T) {
	e := diskEnv(t) // 2 MiB
	id, tok := e.acquire(t, "disk-archive", "")
	dir := e.workdir(t, id, tok)
	big := tarOf(t, 3, 1<<20) // 3 MiB of files

	r := do(t, "PUT", e.sandboxURL(id, "/v1/archive"+dir+"/plain"), "", bearerHdr(tok), string(big))
	checkRefused(t, r, "archive upload with Content-Length")

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(big)
	zw.Close()
	if gz.Len() > 100<<10 {
		t.Fatalf("gzip body is %d bytes; the test wants a small one", gz.Len())
	}
	req, _ := http.NewRequest("PUT", e.sandboxURL(id, "/v1/archive"+dir+"/gz"), bytes.NewReader(gz.Bytes()))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("gzip archive of 3 MiB in a 2 MiB budget: HTTP %d, want 507", resp.StatusCode)
	}

	// A small gzip archive goes through and is extracted.
	gz.Reset()
	zw = gzip.NewWriter(&gz)
	zw.Write(tarOf(t, 2, 1000))
	zw.Close()
	req, _ = http.NewRequest("PUT", e.sandboxURL(id, "/v1/archive"+dir+"/small"), bytes.NewReader(gz.Bytes()))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Encoding", "gzip")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("small gzip archive: HTTP %d", resp.StatusCode)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "small", "d", "fb")); err != nil || len(b) != 1000 {
		t.Fatalf("extracted file: %d bytes, %v", len(b), err)
	}

	cc := dialGRPC(t, serveGRPC(t, e.proxy))
	files := agentv1.NewFileServiceClient(cc)
	up, err := files.UploadArchive(leaseCtx(context.Background(), id, tok))
	if err != nil {
		t.Fatal(err)
	}
	up.Send(&agentv1.UploadArchiveRequest{Msg: &agentv1.UploadArchiveRequest_Header{Header: &agentv1.UploadArchiveHeader{Path: filepath.Join(dir, "grpc")}}})
	for off := 0; off < len(big); off += 256 << 10 {
		if err := up.Send(&agentv1.UploadArchiveRequest{Msg: &agentv1.UploadArchiveRequest_Chunk{Chunk: big[off:min(off+256<<10, len(big))]}}); err != nil {
			break
		}
	}
	_, err = up.CloseAndRecv()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "disk limit exceeded") {
		t.Fatalf("gRPC archive upload: %v, want RESOURCE_EXHAUSTED", err)
	}
	for _, name := range []string{"plain", "gz", "grpc"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			t.Errorf("a refused archive upload left %s", name)
		}
	}
}
