package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/pkg/runtime"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// previewDomain is orchestrator.Defaults().PreviewDomain, the suffix of
// host-form preview URLs ({port}-{lease}.sandbox.localhost).
const previewDomain = "sandbox.localhost"

// sandboxPath is the proxy path of an agent API path of lease id.
func sandboxPath(id, agentPath string) string { return "/v1/sandboxes/" + id + agentPath }

// acquireBody posts an arbitrary acquire body (e.g. with publicPorts) and
// requires a READY lease.
func (a *api) acquireBody(tb testing.TB, body map[string]any) *orchv1.AcquireResponse {
	tb.Helper()
	code, _, b := a.mustCall(tb, http.MethodPost, "/v1/leases", body)
	if code != http.StatusOK {
		tb.Fatalf("POST /v1/leases %v: HTTP %d: %s", body, code, b)
	}
	var r orchv1.AcquireResponse
	if err := decode(b, &r); err != nil {
		tb.Fatal(err)
	}
	if r.GetLease().GetState() != orchv1.LeaseState_LEASE_STATE_READY || r.GetToken() == "" {
		tb.Fatalf("acquire %v: state %s, token %t", body, r.GetLease().GetState(), r.GetToken() != "")
	}
	return &r
}

// proxyExec runs a command in lease id's sandbox through the proxy's REST
// route (POST /v1/sandboxes/{id}/v1/exec) with token. req holds the exec
// fields ("argv" or "command", ...). Safe in any goroutine.
func (a *api) proxyExec(ctx context.Context, id, token string, req map[string]any) (int, execResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, execResult{}, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+sandboxPath(id, "/v1/exec"), bytes.NewReader(body))
	if err != nil {
		return 0, execResult{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := a.http.Do(hr)
	if err != nil {
		return 0, execResult{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, execResult{}, err
	}
	var r execResult
	if resp.StatusCode != http.StatusOK {
		r.Stderr = string(b)
		return resp.StatusCode, r, nil
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return resp.StatusCode, r, fmt.Errorf("decode exec response: %w: %s", err, b)
	}
	return resp.StatusCode, r, nil
}

// mustProxyExec runs argv through the proxy and requires HTTP 200 and exit 0.
func (a *api) mustProxyExec(tb testing.TB, id, token string, argv ...string) execResult {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, r, err := a.proxyExec(ctx, id, token, map[string]any{"argv": argv, "timeout": "30s"})
	if err != nil {
		tb.Fatalf("proxy exec %q in %s: %v", argv, id, err)
	}
	if code != http.StatusOK || r.ExitCode != 0 {
		tb.Fatalf("proxy exec %q in %s: HTTP %d, exit %d, stdout %q, stderr %q", argv, id, code, r.ExitCode, r.Stdout, r.Stderr)
	}
	return r
}

// putFile uploads body to the absolute path dst of lease id's sandbox with
// the raw-bytes route (PUT /v1/sandboxes/{id}/v1/files{dst}?parents=true).
func (a *api) putFile(tb testing.TB, id, token, dst string, body []byte) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPut, a.base+sandboxPath(id, "/v1/files"+dst)+"?parents=true", bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := a.http.Do(req)
	if err != nil {
		tb.Fatalf("PUT %s in %s: %v", dst, id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		tb.Fatalf("PUT %s in %s: HTTP %d: %s", dst, id, resp.StatusCode, b)
	}
}

// grpcConn dials the orchestrator's listener for agent calls through the
// proxy; the lease and the token travel per call (see leaseCtx).
func (a *api) grpcConn(tb testing.TB) *grpc.ClientConn {
	tb.Helper()
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// leaseCtx returns ctx carrying the metadata that routes a gRPC call
// through the proxy to lease id, with token.
func leaseCtx(ctx context.Context, id, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-berth-lease", id, "authorization", "Bearer "+token)
}

// httpGet sends a GET to the orchestrator at path with an optional Host
// header, extra headers and cookies, without following redirects.
func (a *api) httpGet(host, path string, header http.Header, cookies ...*http.Cookie) (int, http.Header, string, error) {
	req, err := http.NewRequest(http.MethodGet, a.base+path, nil)
	if err != nil {
		return 0, nil, "", err
	}
	if host != "" {
		req.Host = host
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	c := *a.http
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

func bearerHeader(token string) http.Header {
	if token == "" {
		return nil
	}
	return http.Header{"Authorization": {"Bearer " + token}}
}

// releaseAll releases the leases and checks that no container of instance
// is left.
func releaseAll(tb testing.TB, o *orch, instance string, ids ...string) {
	tb.Helper()
	for _, id := range ids {
		if l := o.mustRelease(tb, id); l.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
			tb.Errorf("release %s: %s", id, l.GetState())
		}
	}
	if left := containersWith(tb, runtime.LabelInstance+"="+instance); len(left) != 0 {
		tb.Errorf("%d container(s) of instance %s left after releasing every lease: %v", len(left), instance, left)
	}
}

// TestProxyPreview: a web server started in a berth/minimal sandbox
// (busybox httpd on port 8000, as a background process through the proxy)
// is served through its preview URLs — path form
// /v1/sandboxes/{lease}/ports/8000/… and host form 8000-{lease}.sandbox.localhost
// — with the lease's token (header, or the ?berth_token bootstrap cookie)
// or the operator token, returns the uploaded page, and answers 401 to
// another lease's token and to no token. A lease acquired with
// publicPorts [8000] serves that port (and only that one) without a token.
func TestProxyPreview(t *testing.T) {
	requireImage(t, minimalImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir)

	a := o.mustAcquire(t, "c-preview-a", minimalImage, "600s")
	other := o.mustAcquire(t, "c-preview-b", minimalImage, "600s")
	pub := o.acquireBody(t, map[string]any{"conversationId": "c-preview-public", "image": minimalImage, "ttl": "600s", "publicPorts": []int{8000}})
	if got := pub.GetLease().GetPublicPorts(); len(got) != 1 || got[0] != 8000 {
		t.Fatalf("lease acquired with publicPorts [8000] reports public ports %v", got)
	}
	aID, aTok := a.GetLease().GetId(), a.GetToken()
	pubID, pubTok := pub.GetLease().GetId(), pub.GetToken()

	// Serve a page from each sandbox; the pages differ, so a response
	// proves which sandbox answered.
	pages := map[string]string{}
	for _, l := range []*orchv1.AcquireResponse{a, pub} {
		id := l.GetLease().GetId()
		pages[id] = fmt.Sprintf("<html><body>hello from %s %s</body></html>\n", id, randHex(8))
		o.putFile(t, id, l.GetToken(), "/workspace/www/index.html", []byte(pages[id]))
		code, _, b := o.mustCall(t, http.MethodPost, sandboxPath(id, "/v1/processes"),
			map[string]any{"argv": []string{"busybox", "httpd", "-f", "-p", "8000", "-h", "/workspace/www"}}, l.GetToken())
		var proc struct {
			ID  string `json:"id"`
			Pid int    `json:"pid"`
		}
		if code != http.StatusOK || json.Unmarshal(b, &proc) != nil || proc.ID == "" {
			t.Fatalf("start httpd in %s: HTTP %d: %s", id, code, b)
		}
		t.Logf("lease %s: httpd is background process %s (pid %d)", id, proc.ID, proc.Pid)
	}

	pathURL := func(id string) string { return "/v1/sandboxes/" + id + "/ports/8000/index.html" }
	hostOf := func(id string, port int) string { return fmt.Sprintf("%d-%s.%s", port, id, previewDomain) }

	// Until httpd listens the proxy answers 502.
	var lastCode int
	var lastBody string
	for _, l := range []*orchv1.AcquireResponse{a, pub} {
		id, tok := l.GetLease().GetId(), l.GetToken()
		if !eventually(15*time.Second, 50*time.Millisecond, func() bool {
			code, _, body, err := o.httpGet("", pathURL(id), bearerHeader(tok))
			lastCode, lastBody = code, body
			return err == nil && code == http.StatusOK
		}) {
			t.Fatalf("preview of %s never answered 200: last HTTP %d: %s", id, lastCode, lastBody)
		}
	}

	type check struct {
		name       string
		host, path string
		header     http.Header
		cookies    []*http.Cookie
		wantCode   int
		wantBody   string // for 200
	}
	checks := []check{
		{name: "path form, lease token", path: pathURL(aID), header: bearerHeader(aTok), wantCode: 200, wantBody: pages[aID]},
		{name: "host form, lease token", host: hostOf(aID, 8000), path: "/index.html", header: bearerHeader(aTok), wantCode: 200, wantBody: pages[aID]},
		{name: "host form with port in Host, lease token", host: hostOf(aID, 8000) + ":7070", path: "/index.html", header: bearerHeader(aTok), wantCode: 200, wantBody: pages[aID]},
		{name: "path form, X-Berth-Token", path: pathURL(aID), header: http.Header{"X-Berth-Token": {aTok}}, wantCode: 200, wantBody: pages[aID]},
		{name: "path form, operator token", path: pathURL(aID), header: bearerHeader(operatorToken), wantCode: 200, wantBody: pages[aID]},
		{name: "path form, another lease's token", path: pathURL(aID), header: bearerHeader(other.GetToken()), wantCode: 401},
		{name: "host form, another lease's token", host: hostOf(aID, 8000), path: "/index.html", header: bearerHeader(other.GetToken()), wantCode: 401},
		{name: "path form, the public lease's token", path: pathURL(aID), header: bearerHeader(pubTok), wantCode: 401},
		{name: "path form, no token", path: pathURL(aID), wantCode: 401},
		{name: "host form, no token", host: hostOf(aID, 8000), path: "/index.html", wantCode: 401},
		{name: "path form, bad token", path: pathURL(aID), header: bearerHeader("not-a-token"), wantCode: 401},
		{name: "path form, another lease's token as cookie", path: pathURL(aID), cookies: []*http.Cookie{{Name: "berth_token", Value: other.GetToken()}}, wantCode: 401},
		{name: "public port, path form, no token", path: pathURL(pubID), wantCode: 200, wantBody: pages[pubID]},
		{name: "public port, host form, no token", host: hostOf(pubID, 8000), path: "/index.html", wantCode: 200, wantBody: pages[pubID]},
		{name: "public port, host form, another lease's token", host: hostOf(pubID, 8000), path: "/index.html", header: bearerHeader(aTok), wantCode: 200, wantBody: pages[pubID]},
		{name: "public lease, other port, no token", host: hostOf(pubID, 8001), path: "/index.html", wantCode: 401},
	}
	for _, c := range checks {
		code, _, body, err := o.httpGet(c.host, c.path, c.header, c.cookies...)
		switch {
		case err != nil:
			t.Errorf("%s: GET %s (Host %q): %v", c.name, c.path, c.host, err)
		case code != c.wantCode:
			t.Errorf("%s: GET %s (Host %q): HTTP %d, want %d: %.200s", c.name, c.path, c.host, code, c.wantCode, body)
		case c.wantCode == http.StatusOK && body != c.wantBody:
			t.Errorf("%s: GET %s (Host %q): body %q, want %q", c.name, c.path, c.host, body, c.wantBody)
		case c.wantCode != http.StatusOK && (strings.Contains(body, "hello from")):
			t.Errorf("%s: a %d answer carries the page: %q", c.name, code, body)
		}
	}

	// A browser's bootstrap: ?berth_token=TOKEN sets a cookie scoped to
	// the preview and redirects to the URL without the token; the cookie
	// then opens the page.
	code, h, body, err := o.httpGet("", pathURL(aID)+"?x=1&berth_token="+url.QueryEscape(aTok), nil)
	if err != nil || code != http.StatusFound {
		t.Fatalf("bootstrap GET: HTTP %d, %v: %s", code, err, body)
	}
	if loc := h.Get("Location"); loc != pathURL(aID)+"?x=1" {
		t.Errorf("bootstrap redirects to %q, want %q", loc, pathURL(aID)+"?x=1")
	}
	var cookie *http.Cookie
	for _, c := range (&http.Response{Header: h}).Cookies() {
		if c.Name == "berth_token" {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || !strings.HasPrefix(pathURL(aID), cookie.Path) {
		t.Fatalf("bootstrap cookie %+v, want an HttpOnly berth_token scoped to the preview prefix", cookie)
	}
	if code, _, body, err := o.httpGet("", pathURL(aID), nil, &http.Cookie{Name: cookie.Name, Value: cookie.Value}); err != nil || code != http.StatusOK || body != pages[aID] {
		t.Errorf("GET with the bootstrap cookie: HTTP %d, %v: %q", code, err, body)
	}

	// After release, the preview is gone: 410 with the lease's own token.
	releaseAll(t, o, instance, aID, other.GetLease().GetId(), pubID)
	if code, _, body, err := o.httpGet("", pathURL(aID), bearerHeader(aTok)); err != nil || code != http.StatusGone {
		t.Errorf("preview of a released lease: HTTP %d, %v, want 410: %.200s", code, err, body)
	}
	if code, _, body, err := o.httpGet("", pathURL(pubID), nil); err != nil || code != http.StatusGone {
		t.Errorf("public preview of a released lease: HTTP %d, %v, want 410: %.200s", code, err, body)
	}
}

// TestProxyConcurrentExecs: 50 execs at once across 10 berth/minimal
// leases through the proxy, half over REST and half over gRPC, each with its
// lease's token. Every one succeeds, prints its own unique string, and ran
// in its own lease's sandbox (each sandbox holds a file naming its lease).
func TestProxyConcurrentExecs(t *testing.T) {
	requireImage(t, minimalImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir)

	const nLeases, nExecs = 10, 50
	leases := make([]*orchv1.AcquireResponse, nLeases)
	errs := make([]error, nLeases)
	var wg sync.WaitGroup
	for i := range nLeases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], errs[i] = o.acquire(fmt.Sprintf("c-conc-%02d", i), minimalImage, "600s")
		}()
	}
	wg.Wait()
	var ids []string
	for i, err := range errs {
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		ids = append(ids, leases[i].GetLease().GetId())
		o.putFile(t, ids[i], leases[i].GetToken(), "/workspace/whoami", []byte(ids[i]))
	}
	conn := o.grpcConn(t)
	proc := agentv1.NewProcessServiceClient(conn)

	type outcome struct {
		transport string
		lease     string
		want      string
		got       string
		exit      int
		dur       time.Duration
		err       error
	}
	out := make([]outcome, nExecs)
	start := make(chan struct{})
	for i := range nExecs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := leases[i%nLeases]
			id := l.GetLease().GetId()
			unique := fmt.Sprintf("exec-%02d-%s", i, randHex(6))
			// sleep 0.2 keeps them overlapping.
			argv := []string{"sh", "-c", `sleep 0.2; echo "$0"; cat /workspace/whoami`, unique}
			oc := outcome{lease: id, want: unique + "\n" + id}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			<-start
			t0 := time.Now()
			if i%2 == 0 {
				oc.transport = "rest"
				code, r, err := o.proxyExec(ctx, id, l.GetToken(), map[string]any{"argv": argv, "timeout": "30s"})
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("HTTP %d: %s", code, r.Stderr)
				}
				oc.got, oc.exit, oc.err = r.Stdout, r.ExitCode, err
			} else {
				oc.transport = "grpc"
				r, err := proc.Exec(leaseCtx(ctx, id, l.GetToken()), &agentv1.ExecRequest{Argv: argv})
				oc.got, oc.exit, oc.err = r.GetStdout(), int(r.GetExitCode()), err
			}
			oc.dur = time.Since(t0)
			out[i] = oc
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	total := time.Since(t0)
	var durs []time.Duration
	for i, oc := range out {
		switch {
		case oc.err != nil:
			t.Errorf("exec %d (%s, lease %s): %v", i, oc.transport, oc.lease, oc.err)
		case oc.exit != 0 || oc.got != oc.want:
			t.Errorf("exec %d (%s, lease %s): exit %d, stdout %q, want %q", i, oc.transport, oc.lease, oc.exit, oc.got, oc.want)
		}
		durs = append(durs, oc.dur)
	}
	t.Logf("%d concurrent execs (sleep 0.2 each) across %d leases: all done in %s; per exec p50 %s max %s",
		nExecs, nLeases, total.Round(time.Millisecond), percentile(durs, 50).Round(time.Millisecond), percentile(durs, 100).Round(time.Millisecond))
	releaseAll(t, o, instance, ids...)
}

// TestProxyCancelKillsCommand: a caller that goes away while its exec runs
// through the proxy gets its cancellation, and the sandboxed command (its
// whole process group) is killed: `ps` in the same sandbox no longer shows
// it. Over REST (the proxy sees the client go away: 499) and gRPC (the
// cancellation propagates to the agent).
func TestProxyCancelKillsCommand(t *testing.T) {
	requireImage(t, minimalImage)
	dir, instance := newDataDir(t)
	o := startOrch(t, dir)
	l := o.mustAcquire(t, "c-cancel", minimalImage, "600s")
	id, tok := l.GetLease().GetId(), l.GetToken()
	proc := agentv1.NewProcessServiceClient(o.grpcConn(t))

	// ps lists the sandbox's processes; sleeps with a unique duration
	// (300.<random digits> seconds) are recognisable.
	psHas := func(t *testing.T, markers ...string) []string {
		t.Helper()
		res := o.mustProxyExec(t, id, tok, "ps", "-o", "pid,args")
		var found []string
		for _, m := range markers {
			if strings.Contains(res.Stdout, "sleep "+m) {
				found = append(found, m)
			}
		}
		return found
	}
	marker := func() string { return fmt.Sprintf("300.%08d", 1+mrand.IntN(99999998)) }

	cases := []struct {
		name  string
		nproc int // sleeps the command starts
		run   func(ctx context.Context, marks []string) error
	}{
		{"REST argv", 1, func(ctx context.Context, marks []string) error {
			_, _, err := o.proxyExec(ctx, id, tok, map[string]any{"argv": []string{"sleep", marks[0]}})
			return err
		}},
		{"REST shell with a background child", 2, func(ctx context.Context, marks []string) error {
			_, _, err := o.proxyExec(ctx, id, tok, map[string]any{"command": "sleep " + marks[0] + " & sleep " + marks[1] + "; wait"})
			return err
		}},
		{"gRPC argv", 1, func(ctx context.Context, marks []string) error {
			_, err := proc.Exec(leaseCtx(ctx, id, tok), &agentv1.ExecRequest{Argv: []string{"sleep", marks[0]}})
			return err
		}},
		{"gRPC stream", 1, func(ctx context.Context, marks []string) error {
			s, err := proc.ExecStream(leaseCtx(ctx, id, tok), &agentv1.ExecRequest{Argv: []string{"sleep", marks[0]}})
			if err != nil {
				return err
			}
			for {
				if _, err := s.Recv(); err != nil {
					return err
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var marks []string
			for range c.nproc {
				marks = append(marks, marker())
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			t0 := time.Now()
			go func() { done <- c.run(ctx, marks) }()
			time.Sleep(300 * time.Millisecond)
			if got := psHas(t, marks...); len(got) != len(marks) {
				t.Fatalf("300ms after the exec started, ps shows %v of %v", got, marks)
			}
			cancel()
			tc := time.Now()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the exec did not return within 10s of the cancel")
			}
			if isGRPC := strings.HasPrefix(c.name, "gRPC"); isGRPC && status.Code(err) != codes.Canceled ||
				!isGRPC && !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled exec returned %v, want a cancellation", err)
			}
			returned := time.Since(tc)
			var left []string
			if !eventually(5*time.Second, 50*time.Millisecond, func() bool {
				left = psHas(t, marks...)
				return len(left) == 0
			}) {
				t.Fatalf("5s after the cancel the sandbox still runs %v", left)
			}
			t.Logf("cancelled after %s; the exec returned %s later; ps showed the command gone %s after the cancel",
				tc.Sub(t0).Round(time.Millisecond), returned.Round(time.Millisecond), time.Since(tc).Round(10*time.Millisecond))
		})
	}
	// The sandbox still works after the cancellations.
	if res := o.mustProxyExec(t, id, tok, "echo", "still here"); res.Stdout != "still here\n" {
		t.Errorf("exec after the cancellations: %q", res.Stdout)
	}
	releaseAll(t, o, instance, id)
}
