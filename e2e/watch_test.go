package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// watchEv is one watch event as a test sees it, with when it arrived.
type watchEv struct {
	kind  string // "READY", "CREATED", … (the enum name without its prefix)
	path  string
	isDir bool
	at    time.Time
}

func (e watchEv) String() string {
	s := e.kind + " " + e.path
	if e.isDir {
		s += "/"
	}
	return s
}

// watchREST opens GET /v1/sandboxes/{id}/v1/files:watch through the proxy
// and returns its events, read line by line (newline-delimited JSON), and
// what closes it (the test's end does too).
func watchREST(t *testing.T, o *orch, id, tok string, query url.Values) (<-chan watchEv, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.base+sandboxPath(id, "/v1/files:watch")+"?"+query.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	// The API client's overall timeout would cut a long stream.
	resp, err := (&http.Client{Transport: o.http.Transport}).Do(req)
	if err != nil {
		t.Fatalf("GET files:watch: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("GET files:watch: HTTP %d: %s", resp.StatusCode, b)
	}
	out := make(chan watchEv, 4096)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			at := time.Now()
			var line struct {
				Result struct {
					Kind  string `json:"kind"`
					Path  string `json:"path"`
					IsDir bool   `json:"isDir"`
				} `json:"result"`
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Errorf("watch line %q: %v", sc.Bytes(), err)
				return
			}
			r := line.Result
			out <- watchEv{kind: strings.TrimPrefix(r.Kind, "WATCH_EVENT_KIND_"), path: r.Path, isDir: r.IsDir, at: at}
		}
	}()
	return out, cancel
}

// watchGRPC opens FileService.Watch through the proxy (x-berth-lease) and
// returns its events and what cancels it (the test's end does too).
func watchGRPC(t *testing.T, o *orch, id, tok string, req *agentv1.WatchRequest) (<-chan watchEv, context.CancelFunc) {
	t.Helper()
	conn := o.grpcConn(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // before the connection closes
	st, err := agentv1.NewFileServiceClient(conn).Watch(leaseCtx(ctx, id, tok), req)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	out := make(chan watchEv, 4096)
	go func() {
		defer close(out)
		for {
			ev, err := st.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) && ctx.Err() == nil {
					t.Errorf("watch stream: %v", err)
				}
				return
			}
			out <- watchEv{
				kind: strings.TrimPrefix(ev.GetKind().String(), "WATCH_EVENT_KIND_"), path: ev.GetPath(),
				isDir: ev.GetIsDir(), at: time.Now(),
			}
		}
	}()
	return out, cancel
}

// expectWatch reads events until want (rendered by watchEv.String) have
// all come, in order, other events allowed between them.
func expectWatch(t *testing.T, evs <-chan watchEv, want ...string) {
	t.Helper()
	var got []string
	timeout := time.After(30 * time.Second)
	for i := 0; i < len(want); {
		select {
		case ev, ok := <-evs:
			if !ok {
				t.Fatalf("the watch ended before %q; got %q", want[i:], got)
			}
			got = append(got, ev.String())
			if ev.String() == want[i] {
				i++
			}
		case <-timeout:
			t.Fatalf("no %q within 30 s; got %q", want[i:], got)
		}
	}
}

// TestWatchThroughProxy watches /workspace of a real berth/base sandbox
// through the orchestrator's proxy, over REST (newline-delimited JSON)
// and gRPC, and sees the files a command writes. Then it measures the
// event latency: a command in the sandbox creates ~200 files, 20 ms
// apart, each named by the time it was created (date +%s%N: host and
// container share the clock); the latency of one is when its created
// event reached the test minus that time. With BERTH_WATCH_LATENCY_OUT
// set, the figures are appended to that file.
func TestWatchThroughProxy(t *testing.T) {
	requireImage(t, baseImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir)
	l := o.mustAcquire(t, "c-watch", baseImage, "600s")
	id, tok := l.GetLease().GetId(), l.GetToken()
	t.Cleanup(func() { releaseAll(t, o, instance, id) })

	t.Run("REST", func(t *testing.T) {
		evs, _ := watchREST(t, o, id, tok, url.Values{"path": {"/workspace"}, "recursive": {"true"}, "debounce_ms": {"10"}})
		expectWatch(t, evs, "READY /")
		o.mustProxyExec(t, id, tok, "sh", "-c", "mkdir -p /workspace/rest/sub && echo hi > /workspace/rest/sub/hello.txt")
		expectWatch(t, evs, "CREATED rest/", "CREATED rest/sub/", "CREATED rest/sub/hello.txt")
		o.mustProxyExec(t, id, tok, "sh", "-c", "echo more >> /workspace/rest/sub/hello.txt && mv /workspace/rest/sub/hello.txt /workspace/rest/bye.txt")
		expectWatch(t, evs, "MODIFIED rest/sub/hello.txt", "RENAMED rest/bye.txt")
	})
	t.Run("gRPC", func(t *testing.T) {
		evs, _ := watchGRPC(t, o, id, tok, &agentv1.WatchRequest{Path: "/workspace", Recursive: true, DebounceMs: 10})
		expectWatch(t, evs, "READY /")
		o.mustProxyExec(t, id, tok, "sh", "-c", "echo hi > /workspace/grpc.txt && rm -r /workspace/rest")
		expectWatch(t, evs, "CREATED grpc.txt", "REMOVED rest/")
	})

	// The streams of the subtests above are closed; the sandbox's
	// processes (the agent's) hold one inotify instance per open watch, and
	// none once the clients went. They are counted from the host, whose
	// root may read any process's descriptors.
	t.Run("CancelReleases", func(t *testing.T) {
		pid1 := mustDocker(t, "inspect", "-f", "{{.State.Pid}}", o.mustGet(t, id).GetContainerId())
		if _, err := os.ReadDir("/proc/" + pid1 + "/fd"); err != nil {
			t.Skipf("the sandbox's processes are not readable from here (%v): is the Docker Engine remote or rootless?", err)
		}
		inotifies := func() string { return strconv.Itoa(inotifyInstances(t, pid1)) }
		var cancels []context.CancelFunc
		for i := range 4 {
			var evs <-chan watchEv
			var cancel context.CancelFunc
			if i%2 == 0 {
				evs, cancel = watchREST(t, o, id, tok, url.Values{"path": {"/workspace"}, "recursive": {"true"}})
			} else {
				evs, cancel = watchGRPC(t, o, id, tok, &agentv1.WatchRequest{Path: "/workspace", Recursive: true})
			}
			expectWatch(t, evs, "READY /")
			cancels = append(cancels, cancel)
		}
		var n string
		if !eventually(10*time.Second, 100*time.Millisecond, func() bool { n = inotifies(); return n == "4" }) {
			t.Fatalf("%s inotify instances in the agent with 4 watches open, want 4", n)
		}
		for _, cancel := range cancels {
			cancel()
		}
		if !eventually(10*time.Second, 100*time.Millisecond, func() bool { n = inotifies(); return n == "0" }) {
			t.Fatalf("%s inotify instances in the agent after the clients went, want 0", n)
		}
	})

	var report []string
	for _, tc := range []struct {
		transport string
		debounce  uint32
	}{{"rest", 0}, {"grpc", 0}, {"rest", 1}, {"grpc", 1}} {
		name := fmt.Sprintf("Latency-%s-debounce%dms", tc.transport, tc.debounce)
		t.Run(name, func(t *testing.T) {
			sub := fmt.Sprintf("/workspace/lat-%s-%d", tc.transport, tc.debounce)
			o.mustProxyExec(t, id, tok, "mkdir", "-p", sub)
			var evs <-chan watchEv
			if tc.transport == "rest" {
				q := url.Values{"path": {sub}}
				if tc.debounce != 0 {
					q.Set("debounce_ms", strconv.Itoa(int(tc.debounce)))
				}
				evs, _ = watchREST(t, o, id, tok, q)
			} else {
				evs, _ = watchGRPC(t, o, id, tok, &agentv1.WatchRequest{Path: sub, DebounceMs: tc.debounce})
			}
			expectWatch(t, evs, "READY /")
			const n = 200
			script := fmt.Sprintf("for i in $(seq %d); do : > %s/$(date +%%s%%N); sleep 0.02; done", n, sub)
			writer := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				code, r, err := o.proxyExec(ctx, id, tok, map[string]any{"argv": []string{"sh", "-c", script}, "timeout": "90s"})
				if err == nil && (code != http.StatusOK || r.ExitCode != 0) {
					err = fmt.Errorf("HTTP %d, exit %d, stderr %q", code, r.ExitCode, r.Stderr)
				}
				writer <- err
			}()
			var lat []time.Duration
			timeout := time.After(90 * time.Second)
			for len(lat) < n {
				select {
				case ev, ok := <-evs:
					if !ok {
						t.Fatalf("the watch ended after %d events", len(lat))
					}
					ns, err := strconv.ParseInt(ev.path, 10, 64)
					if ev.kind != "CREATED" || err != nil {
						t.Fatalf("unexpected event %v", ev)
					}
					lat = append(lat, ev.at.Sub(time.Unix(0, ns)))
				case <-timeout:
					t.Fatalf("only %d of %d events within 90 s", len(lat), n)
				}
			}
			if err := <-writer; err != nil {
				t.Fatalf("writer: %v", err)
			}
			line := fmt.Sprintf("watch latency %s, debounce %s: n=%d p50=%.1fms p99=%.1fms max=%.1fms", tc.transport,
				map[bool]string{true: "default (50ms)", false: fmt.Sprintf("%dms", tc.debounce)}[tc.debounce == 0],
				len(lat), ms(percentile(lat, 50)), ms(percentile(lat, 99)), ms(percentile(lat, 100)))
			t.Log(line)
			report = append(report, line)
		})
	}
	if out := os.Getenv("BERTH_WATCH_LATENCY_OUT"); out != "" && len(report) > 0 {
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fmt.Fprintf(f, "%s\n%s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(report, "\n"))
	}
}

// inotifyInstances counts the inotify instances open in process pid and its
// descendants (host pids; /proc of the host).
func inotifyInstances(t *testing.T, pid string) int {
	t.Helper()
	n := 0
	pids := []string{pid}
	for len(pids) > 0 {
		p := pids[0]
		pids = pids[1:]
		fds, _ := os.ReadDir("/proc/" + p + "/fd")
		for _, fd := range fds {
			if target, err := os.Readlink("/proc/" + p + "/fd/" + fd.Name()); err == nil && target == "anon_inode:inotify" {
				n++
			}
		}
		tasks, _ := os.ReadDir("/proc/" + p + "/task")
		for _, task := range tasks {
			if b, err := os.ReadFile("/proc/" + p + "/task/" + task.Name() + "/children"); err == nil {
				pids = append(pids, strings.Fields(string(b))...)
			}
		}
	}
	return n
}
