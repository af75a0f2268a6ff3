package envd

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	fspb "github.com/berth-dev/berth/proto/e2b/envd/filesystem"
	"github.com/berth-dev/berth/proto/e2b/envd/filesystem/filesystemconnect"
	pb "github.com/berth-dev/berth/proto/e2b/envd/process"
	"github.com/berth-dev/berth/proto/e2b/envd/process/processconnect"
)

func filesURL(e *testEnv, path string) string {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	return e.url + "/files?" + q.Encode()
}

func decodeWrites(t *testing.T, resp *http.Response) []writeInfo {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	var out []writeInfo
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("upload answer %s: %v", b, err)
	}
	return out
}

func download(t *testing.T, e *testEnv, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", filesURL(e, path), nil)
	resp := httpDo(t, e, req)
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestFilesOctetStream uploads a raw body to a relative path (parents
// created) and downloads it; gzip both ways.
func TestFilesOctetStream(t *testing.T) {
	e := newEnv(t, "")
	req, _ := http.NewRequest("POST", filesURL(e, "up/dir/raw.bin"), strings.NewReader("raw bytes\x00\x01"))
	req.Header.Set("Content-Type", "application/octet-stream")
	got := decodeWrites(t, httpDo(t, e, req))
	want := filepath.Join(e.workDir, "up/dir/raw.bin")
	if len(got) != 1 || got[0] != (writeInfo{Path: want, Name: "raw.bin", Type: "file"}) {
		t.Fatalf("upload answer %v", got)
	}
	if code, body := download(t, e, "up/dir/raw.bin"); code != 200 || body != "raw bytes\x00\x01" {
		t.Fatalf("download: %d %q", code, body)
	}
	if code, body := download(t, e, want); code != 200 || body != "raw bytes\x00\x01" {
		t.Fatalf("download by absolute path: %d %q", code, body)
	}

	// A gzip-encoded upload, and a gzip download.
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = zw.Write([]byte("compressed"))
	_ = zw.Close()
	req, _ = http.NewRequest("POST", filesURL(e, "z.txt"), &zb)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Encoding", "gzip")
	decodeWrites(t, httpDo(t, e, req))
	req, _ = http.NewRequest("GET", filesURL(e, "z.txt"), nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp := httpDo(t, e, req)
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("download not gzip-encoded: %v", resp.Header)
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(zr); string(b) != "compressed" {
		t.Fatalf("gzip download: %q", b)
	}

	// Without a path: 400 naming it; a missing file: 404.
	req, _ = http.NewRequest("POST", filesURL(e, ""), strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp = httpDo(t, e, req)
	var eb struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	if resp.StatusCode != 400 || eb.Code != 400 || !strings.Contains(eb.Message, "path") {
		t.Fatalf("upload without path: %d %+v", resp.StatusCode, eb)
	}
	if code, _ := download(t, e, "nope.txt"); code != 404 {
		t.Fatalf("download missing: %d", code)
	}
}

// TestFilesMultipart uploads one file at the path parameter, then two
// files at their filenames, as E2B's SDK sends them.
func TestFilesMultipart(t *testing.T) {
	e := newEnv(t, "")
	post := func(path string, parts map[string]string, order []string) []writeInfo {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		for _, name := range order {
			fw, err := mw.CreateFormFile("file", name)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = fw.Write([]byte(parts[name]))
		}
		_ = mw.Close()
		req, _ := http.NewRequest("POST", filesURL(e, path), &body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		return decodeWrites(t, httpDo(t, e, req))
	}
	got := post("one/single.txt", map[string]string{"ignored-name": "single"}, []string{"ignored-name"})
	if len(got) != 1 || got[0].Path != filepath.Join(e.workDir, "one/single.txt") {
		t.Fatalf("single: %v", got)
	}
	abs := filepath.Join(e.workDir, "abs/second.txt")
	got = post("", map[string]string{"multi/first.txt": "first", abs: "second"}, []string{"multi/first.txt", abs})
	if len(got) != 2 || got[0].Path != filepath.Join(e.workDir, "multi/first.txt") || got[1].Path != abs || got[1].Name != "second.txt" {
		t.Fatalf("multi: %v", got)
	}
	for p, want := range map[string]string{"one/single.txt": "single", "multi/first.txt": "first", abs: "second"} {
		if code, body := download(t, e, p); code != 200 || body != want {
			t.Errorf("%s: %d %q, want %q", p, code, body, want)
		}
	}
}

// TestHealthAndEnvs: /health answers 204, /envs the environment as JSON,
// /metrics the machine's figures.
func TestHealthAndEnvs(t *testing.T) {
	e := newEnv(t, "")
	req, _ := http.NewRequest("GET", e.url+"/health", nil)
	if resp := httpDo(t, e, req); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health: %d", resp.StatusCode)
	}
	req, _ = http.NewRequest("GET", e.url+"/envs", nil)
	resp := httpDo(t, e, req)
	var env map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil || env["BERTH_ENVD_TEST"] != "yes" {
		t.Fatalf("envs: %v %v", env, err)
	}
	req, _ = http.NewRequest("GET", e.url+"/metrics", nil)
	resp = httpDo(t, e, req)
	var m map[string]float64
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m["cpu_count"] != float64(runtime.NumCPU()) || m["mem_total"] <= 0 || m["mem_used"] <= 0 || m["mem_used"] > m["mem_total"] ||
		m["disk_total"] <= 0 || m["disk_used"] > m["disk_total"] || m["cpu_used_pct"] < 0 || m["cpu_used_pct"] > 100 ||
		math.Abs(m["ts"]-float64(time.Now().Unix())) > 60 {
		t.Fatalf("metrics = %v", m)
	}
}

// TestAccessToken: with an access token, calls without it or with a wrong
// one are unauthenticated (Connect) or 401 (HTTP); /health stays open.
func TestAccessToken(t *testing.T) {
	e := newEnv(t, "s3cret")
	ctx := ctxT(t)
	hc := http.DefaultClient
	for name, token := range map[string]string{"missing": "", "wrong": "s3cres"} {
		t.Run(name, func(t *testing.T) {
			var opts []connect.ClientOption
			if token != "" {
				opts = append(opts, connect.WithInterceptors(headerInterceptor{AccessTokenHeader, token}))
			}
			for _, codec := range codecs {
				fs := filesystemconnect.NewFilesystemClient(hc, e.url, append(opts, codec.opts...)...)
				if _, err := fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/"})); codeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("%s Stat: %v, want unauthenticated", codec.name, err)
				}
				proc := processconnect.NewProcessClient(hc, e.url, append(opts, codec.opts...)...)
				st, err := proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true"}}))
				if err != nil {
					t.Fatal(err)
				}
				if st.Receive() || codeOf(st.Err()) != connect.CodeUnauthenticated {
					t.Errorf("%s Start: %v, want unauthenticated", codec.name, st.Err())
				}
				st.Close()
			}
			for _, method := range []string{"GET", "POST"} {
				req, _ := http.NewRequest(method, filesURL(e, "x.txt"), strings.NewReader("x"))
				req.Header.Set(AccessTokenHeader, token)
				if token == "" {
					req.Header.Set(AccessTokenHeader, "")
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s /files: %d, want 401", method, resp.StatusCode)
				}
			}
			req, _ := http.NewRequest("GET", e.url+"/envs", nil)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("/envs: %d, want 401", resp.StatusCode)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(e.workDir, "x.txt")); !os.IsNotExist(err) {
		t.Fatalf("a refused upload wrote its file: %v", err)
	}
	// The right token passes; /health needs none.
	if _, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/"})); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	resp, err := hc.Get(e.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health without token: %d", resp.StatusCode)
	}
}

// TestBasicUser: Basic authorization naming the agent's own user is
// accepted, another user is unauthenticated (the test's agent is not
// given a users resolver), and username on /files the same.
func TestBasicUser(t *testing.T) {
	e := newEnv(t, "")
	ctx := ctxT(t)
	self, err := currentUser()
	if err != nil {
		t.Fatal(err)
	}
	basic := func(name string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":")) }
	for name, want := range map[string]connect.Code{self.Name: 0, "no-such-user-envd": connect.CodeUnauthenticated} {
		req := connect.NewRequest(&fspb.StatRequest{Path: "."})
		req.Header().Set("Authorization", basic(name))
		_, err := e.fs.Stat(ctx, req)
		if want == 0 && err != nil || want != 0 && codeOf(err) != want {
			t.Errorf("user %q: %v, want %v", name, err, want)
		}
	}
	req, _ := http.NewRequest("GET", filesURL(e, "x")+"&username=no-such-user-envd", nil)
	if resp := httpDo(t, e, req); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/files with an unknown username: %d, want 401", resp.StatusCode)
	}
}
