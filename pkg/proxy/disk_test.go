package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

// diskEnv is a proxy over an orchestrator whose leases have a 2 MiB disk
// limit, measured every 100ms, with a grace long enough never to end.
func diskEnv(t *testing.T) *env {
	t.Helper()
	orch := orchtest.Start(t, func(c *orchestrator.Config) {
		c.DefaultDiskBytes = 2 << 20
		c.Disk.Interval = 100 * time.Millisecond
		c.Disk.Grace = time.Hour
	})
	return mountProxy(t, orch, orch.Srv.Manager(), nil)
}

// workdir returns the sandbox's working directory (in-process: a host
// directory) by running pwd through the proxy.
func (e *env) workdir(t *testing.T, id, tok string) string {
	t.Helper()
	r := do(t, "POST", e.sandboxURL(id, "/v1/exec"), "", bearerHdr(tok), `{"argv":["pwd"]}`)
	if r.code != 200 {
		t.Fatalf("exec pwd: %d %s", r.code, r.body)
	}
	out, _ := r.json(t)["stdout"].(string)
	if out == "" {
		t.Fatalf("exec pwd: %s", r.body)
	}
	return strings.TrimSpace(out)
}

// waitDiskBelow waits until the refused upload's temporary file is gone
// from dir and a disk measurement taken after that puts lease id under n
// bytes: the disk is measured every 100ms, and one taken while the file
// still existed counts it until the next.
func waitDiskBelow(t *testing.T, e *env, id, dir string, n int64) {
	t.Helper()
	eventually(t, 10*time.Second, "no temporary upload file", func() bool {
		entries, _ := os.ReadDir(dir)
		for _, en := range entries {
			if strings.HasPrefix(en.Name(), ".berth-upload-") {
				return false
			}
		}
		return true
	})
	gone := time.Now()
	m := e.orch.Srv.Manager()
	eventually(t, 10*time.Second, "a disk measurement without the refused upload", func() bool {
		l, err := m.Get(context.Background(), id)
		rt, rerr := m.Route(id)
		return err == nil && rerr == nil && l.Usage.MeasuredAt.After(gone) && rt.DiskUsed < n
	})
}

func checkRefused(t *testing.T, r reply, what string) {
	t.Helper()
	if r.code != http.StatusInsufficientStorage {
		t.Fatalf("%s: %d %s, want 507", what, r.code, r.body)
	}
	m := r.json(t)
	if m["code"] != float64(codes.ResourceExhausted) || !strings.HasPrefix(m["message"].(string), "disk limit exceeded: ") {
		t.Fatalf("%s: body %s, want code 8 and a disk limit message", what, r.body)
	}
}

func TestUploadOverDiskLimitRefused(t *testing.T) {
	e := diskEnv(t)
	id, tok := e.acquire(t, "disk", "")
	dir := e.workdir(t, id, tok)
	big := strings.Repeat("x", 3<<20)

	// Declared too large: refused before anything is forwarded.
	r := do(t, "PUT", e.sandboxURL(id, "/v1/files"+dir+"/declared.bin"), "", bearerHdr(tok), big)
	checkRefused(t, r, "upload with Content-Length")

	// Chunked: cut once past the budget.
	req, _ := http.NewRequest("PUT", e.sandboxURL(id, "/v1/files"+dir+"/chunked.bin"), io.MultiReader(strings.NewReader(big)))
	req.Header.Set("Authorization", "Bearer "+tok)
	if req.ContentLength != 0 || req.TransferEncoding != nil && req.TransferEncoding[0] != "chunked" {
		t.Fatalf("request would not be chunked: %d", req.ContentLength)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("chunked upload: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkRefused(t, reply{code: resp.StatusCode, header: resp.Header, body: body}, "chunked upload")

	for _, name := range []string{"declared.bin", "chunked.bin"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want no file", name, err)
		}
		entries, _ := os.ReadDir(dir)
		for _, en := range entries {
			if strings.Contains(en.Name(), name) {
				t.Errorf("left behind: %s", en.Name())
			}
		}
	}

	// A measurement may have run while the cut upload's temporary file was
	// still there: wait for one taken after it went.
	waitDiskBelow(t, e, id, dir, 512<<10)
	// An upload that fits goes through and counts at once.
	small := strings.Repeat("y", 1<<20)
	r = do(t, "PUT", e.sandboxURL(id, "/v1/files"+dir+"/small.bin"), "", bearerHdr(tok), small)
	if r.code/100 != 2 {
		t.Fatalf("small upload: %d %s", r.code, r.body)
	}
	if rt, _ := e.orch.Srv.Manager().Route(id); rt.DiskUsed < 1<<20 {
		t.Fatalf("used after the upload = %d, want at least 1 MiB", rt.DiskUsed)
	}
	// A second one that would pass the limit with the first is refused.
	r = do(t, "PUT", e.sandboxURL(id, "/v1/files"+dir+"/small2.bin"), "", bearerHdr(tok), small+small)
	checkRefused(t, r, "second upload")
	// Leases without the problem are untouched: a neighbour uploads.
	nid, ntok := e.acquire(t, "neighbour", "")
	ndir := e.workdir(t, nid, ntok)
	if r := do(t, "PUT", e.sandboxURL(nid, "/v1/files"+ndir+"/n.bin"), "", bearerHdr(ntok), small); r.code/100 != 2 {
		t.Fatalf("neighbour upload: %d %s", r.code, r.body)
	}
}

func TestUploadRefusedWhileOverLimit(t *testing.T) {
	e := diskEnv(t)
	id, tok := e.acquire(t, "over", "")
	r := do(t, "POST", e.sandboxURL(id, "/v1/exec"), "", bearerHdr(tok), `{"command":"head -c 3000000 /dev/zero > fill.bin"}`)
	if r.code != 200 {
		t.Fatalf("exec: %d %s", r.code, r.body)
	}
	// A measurement may have started while the file was being written:
	// wait for one of the whole file.
	eventually(t, 5*time.Second, "disk warning", func() bool {
		l := e.lease(t, id)
		return len(l.Warnings) > 0 && l.Usage.DiskBytes == 3000000
	})
	if w := e.lease(t, id).Warnings[0]; !strings.HasPrefix(w, "disk limit exceeded: ") {
		t.Fatalf("warning %q", w)
	}
	r = do(t, "PUT", e.sandboxURL(id, "/v1/files/tmp/tiny"), "", bearerHdr(tok), "x")
	checkRefused(t, r, "tiny upload while over")
	if !strings.Contains(r.json(t)["message"].(string), "uploads are refused") {
		t.Fatalf("message %s", r.body)
	}
	// The lease API shows the usage and the warning.
	lr := do(t, "GET", e.orch.Base+"/v1/leases/"+id, "", bearerHdr(opToken), "")
	if lr.code != 200 || !bytes.Contains(lr.body, []byte(`"diskBytes":"3000000"`)) || !bytes.Contains(lr.body, []byte("disk limit exceeded")) {
		t.Fatalf("lease JSON: %d %s", lr.code, lr.body)
	}
}

func TestGRPCUploadOverDiskLimit(t *testing.T) {
	e := diskEnv(t)
	id, tok := e.acquire(t, "grpc-disk", "")
	dir := e.workdir(t, id, tok)
	cc := dialGRPC(t, serveGRPC(t, e.proxy))
	files := agentv1.NewFileServiceClient(cc)
	ctx := leaseCtx(context.Background(), id, tok)

	upload := func(name string, chunks int) error {
		up, err := files.Upload(ctx)
		if err != nil {
			return err
		}
		if err := up.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: filepath.Join(dir, name)}}}); err != nil {
			return err
		}
		chunk := bytes.Repeat([]byte("z"), 512<<10)
		for range chunks {
			if err := up.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk}}); err != nil {
				break // the proxy ended the call: its status comes from CloseAndRecv
			}
		}
		_, err = up.CloseAndRecv()
		return err
	}
	err := upload("big.bin", 6) // 3 MiB
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "disk limit exceeded") {
		t.Fatalf("big upload: %v, want RESOURCE_EXHAUSTED disk limit exceeded", err)
	}
	eventually(t, 2*time.Second, "no partial file", func() bool {
		entries, _ := os.ReadDir(dir)
		for _, en := range entries {
			if strings.Contains(en.Name(), "big.bin") {
				return false
			}
		}
		return true
	})
	waitDiskBelow(t, e, id, dir, 512<<10)
	if err := upload("ok.bin", 2); err != nil { // 1 MiB
		t.Fatalf("small upload: %v", err)
	}
}
