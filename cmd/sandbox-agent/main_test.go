package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

// agentBin is the sandbox-agent binary the tests run: built once, on first
// use, into a directory TestMain removes.
var agentBin struct {
	once      sync.Once
	dir, path string
	err       error
}

// buildAgent returns the sandbox-agent built from this tree (as `make
// build` does, see testenv.Build); the first call builds it.
func buildAgent(t testing.TB) string {
	t.Helper()
	agentBin.once.Do(func() {
		agentBin.dir, agentBin.err = os.MkdirTemp("", "berth-agent-test-")
		if agentBin.err == nil {
			agentBin.err = testenv.Build(agentBin.dir, "./cmd/sandbox-agent")
			agentBin.path = filepath.Join(agentBin.dir, "sandbox-agent")
		}
	})
	if agentBin.err != nil {
		t.Fatal(agentBin.err)
	}
	return agentBin.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if agentBin.dir != "" {
		os.RemoveAll(agentBin.dir)
	}
	os.Exit(code)
}

func freePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startSupervised runs the agent in --init mode (child subreaper) and waits
// until it answers /healthz.
func startSupervised(t *testing.T, bin string) (*exec.Cmd, string, <-chan struct{}) {
	t.Helper()
	addr := freePort(t)
	cmd := exec.Command(bin, "--init", "--listen", addr, "--workdir", t.TempDir())
	cmd.Env = append(os.Environ(), "BERTH_AGENT_TOKEN=tok")
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			t.Error("agent did not exit 15s after SIGTERM; killing it")
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	base := "http://" + addr
	for i := 0; ; i++ {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if i > 200 {
			t.Fatalf("agent not healthy: %v", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	return cmd, base, exited
}

func post(t *testing.T, url, body string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

type procStat struct {
	pid, ppid int
	state     string
	comm      string
}

func readProcs() []procStat {
	ents, _ := os.ReadDir("/proc")
	var out []procStat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		l, r := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		f := strings.Fields(s[r+1:])
		ppid, _ := strconv.Atoi(f[1])
		out = append(out, procStat{pid: pid, ppid: ppid, state: f[0], comm: s[l+1 : r]})
	}
	return out
}

func childrenOf(pid int) []procStat {
	var out []procStat
	for _, p := range readProcs() {
		if p.ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

func TestSupervisorReapsOrphans(t *testing.T) {
	bin := buildAgent(t)
	cmd, base, _ := startSupervised(t, bin)
	sup := cmd.Process.Pid

	// setsid moves the sleep out of the command's process group, so it
	// outlives the command and is re-parented to the supervisor.
	post(t, base+"/v1/exec", `{"command":"setsid sleep 1.5 >/dev/null 2>&1 & sleep 0.1"}`)
	var orphan *procStat
	for _, p := range childrenOf(sup) {
		if p.comm == "sleep" {
			orphan = &p
		}
	}
	if orphan == nil {
		t.Fatalf("orphaned sleep was not re-parented to the supervisor (children: %v)", childrenOf(sup))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var zombies []procStat
		alive := false
		for _, p := range childrenOf(sup) {
			if p.pid == orphan.pid {
				alive = true
			}
			if p.state == "Z" {
				zombies = append(zombies, p)
			}
		}
		if !alive && len(zombies) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped: zombies %v", orphan.pid, zombies)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSupervisorSIGTERM(t *testing.T) {
	bin := buildAgent(t)
	cmd, base, exited := startSupervised(t, bin)
	sup := cmd.Process.Pid
	body := post(t, base+"/v1/processes", `{"argv":["sleep","1000"]}`)
	var p struct{ Pid int }
	if err := json.Unmarshal([]byte(body), &p); err != nil || p.Pid == 0 {
		t.Fatalf("start: %s %v", body, err)
	}
	servers := childrenOf(sup)
	if len(servers) != 1 {
		t.Fatalf("supervisor children = %v, want the server", servers)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("supervisor did not exit within 10s of SIGTERM")
	}
	if cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("exit code %d, want 0", cmd.ProcessState.ExitCode())
	}
	for _, pid := range []int{servers[0].pid, p.Pid} {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("process %d survived shutdown", pid)
		}
	}
}
