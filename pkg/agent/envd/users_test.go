package envd

import (
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/pkg/agent/users"
	fspb "github.com/berth-dev/berth/proto/e2b/envd/filesystem"
	pb "github.com/berth-dev/berth/proto/e2b/envd/process"
)

// TestOtherUser: with a users resolver and the agent as root, Basic
// authorization naming "nobody" runs the process as nobody and the file
// service acts as nobody: an upload is nobody's, and a directory only root
// may write to is refused.
func TestOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	us, err := users.NewResolver("0", true)
	if err != nil {
		t.Fatal(err)
	}
	nobody, err := us.Resolve("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	e := newEnvWith(t, "", func(c *Config) { c.Users = us })
	ctx := ctxT(t)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("nobody:"))
	// A directory nobody may write to, and one inside it only root may.
	open, err := os.MkdirTemp("", "envd-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(open) })
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	rootOnly := filepath.Join(open, "root-only")
	if err := os.Mkdir(rootOnly, 0o755); err != nil {
		t.Fatal(err)
	}

	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "id", Args: []string{"-u"}, Cwd: &open}})
	req.Header().Set("Authorization", basic)
	st, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ch, errc := collect(st)
	if ev, ok := <-ch; !ok || ev.GetStart() == nil {
		t.Fatalf("start as nobody: %v %v", ev, <-errc)
	}
	if stdout, _, _, end := untilEnd(t, ch); strings.TrimSpace(stdout) != strconv.Itoa(int(nobody.UID)) || end.ExitCode != 0 {
		t.Fatalf("id -u as nobody: %q %v", stdout, end)
	}

	up := func(p string) *http.Response {
		hr, _ := http.NewRequest("POST", filesURL(e, p)+"&username=nobody", strings.NewReader("data"))
		hr.Header.Set("Content-Type", "application/octet-stream")
		return httpDo(t, e, hr)
	}
	decodeWrites(t, up(filepath.Join(open, "f.txt")))
	var sys syscall.Stat_t
	if err := syscall.Stat(filepath.Join(open, "f.txt"), &sys); err != nil {
		t.Fatal(err)
	}
	if sys.Uid != nobody.UID {
		t.Fatalf("upload owned by uid %d, want nobody (%d)", sys.Uid, nobody.UID)
	}
	sreq := connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(open, "f.txt")})
	sreq.Header().Set("Authorization", basic)
	if res, err := e.fs.Stat(ctx, sreq); err != nil || res.Msg.Entry.Owner != "nobody" {
		t.Fatalf("stat as nobody: %v %v", res, err)
	}
	resp := up(filepath.Join(rootOnly, "denied.txt"))
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("upload into a directory of root's as nobody: %d %s, want 403", resp.StatusCode, b)
	}
	// Relative paths of a user other than the default resolve in its home.
	svc := New(Config{Users: us, WorkDir: e.workDir})
	defer svc.Close()
	id, err := svc.resolveUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	if got := id.abs("x"); got != filepath.Join(nobody.Home, "x") {
		t.Fatalf("relative path of nobody: %s", got)
	}
	def, err := svc.resolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	if got := def.abs("x"); got != filepath.Join(e.workDir, "x") {
		t.Fatalf("relative path of the default user: %s", got)
	}
}
