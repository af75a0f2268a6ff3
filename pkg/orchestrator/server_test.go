package orchestrator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/orchestrator"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const (
	opToken = orchtest.OperatorToken
	tokA    = orchtest.ClientAToken
	tokB    = orchtest.ClientBToken
)

type testServer struct {
	base string
	srv  *orchestrator.Server
}

func start(t *testing.T, mutate func(*orchestrator.Config)) *testServer {
	t.Helper()
	s := orchtest.Start(t, mutate)
	return &testServer{base: s.Base, srv: s.Srv}
}

type reply struct {
	code   int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %s: %v", r.body, err)
	}
	return m
}

func (s *testServer) do(t *testing.T, token, method, path, body string) reply {
	t.Helper()
	req, _ := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// acquire returns the lease id and token.
func (s *testServer) acquire(t *testing.T, token, conv string) (string, string) {
	t.Helper()
	r := s.do(t, token, "POST", "/v1/leases", `{"conversationId":"`+conv+`","ttl":"600s"}`)
	if r.code != 200 {
		t.Fatalf("acquire %s: %d %s", conv, r.code, r.body)
	}
	m := r.json(t)
	l := m["lease"].(map[string]any)
	if l["state"] != "LEASE_STATE_READY" {
		t.Fatalf("acquire %s: state %v", conv, l["state"])
	}
	return l["id"].(string), m["token"].(string)
}

func TestAuthMatrix(t *testing.T) {
	s := start(t, nil)
	idA, leaseTokA := s.acquire(t, tokA, "conv-a")
	idB, _ := s.acquire(t, tokB, "conv-b")

	for _, tc := range []struct {
		name, token, method, path, body string
		want                            int
	}{
		{"no token", "", "GET", "/v1/leases", "", 401},
		{"bad token", "nope", "GET", "/v1/leases/" + idA, "", 401},
		{"operator sees A", opToken, "GET", "/v1/leases/" + idA, "", 200},
		{"client A sees A", tokA, "GET", "/v1/leases/" + idA, "", 200},
		{"client B cannot see A", tokB, "GET", "/v1/leases/" + idA, "", 404},
		{"lease token sees own", leaseTokA, "GET", "/v1/leases/" + idA, "", 200},
		{"lease token cannot see B", leaseTokA, "GET", "/v1/leases/" + idB, "", 404},
		{"lease token cannot acquire", leaseTokA, "POST", "/v1/leases", `{"conversationId":"x"}`, 403},
		{"lease token cannot list", leaseTokA, "GET", "/v1/leases", "", 403},
		{"client cannot reap", tokA, "POST", "/v1/leases:reap", `{"all":true}`, 403},
		{"client cannot list other owner", tokA, "GET", "/v1/leases?owner=team-b", "", 403},
		{"client cannot acquire as other owner", tokA, "POST", "/v1/leases", `{"conversationId":"y","owner":"team-b"}`, 403},
		{"client B cannot release A", tokB, "DELETE", "/v1/leases/" + idA, "", 404},
		{"lease token renews own", leaseTokA, "POST", "/v1/leases/" + idA + ":renew", `{}`, 200},
	} {
		if r := s.do(t, tc.token, tc.method, tc.path, tc.body); r.code != tc.want {
			t.Errorf("%s: %s %s = %d %s, want %d", tc.name, tc.method, tc.path, r.code, r.body, tc.want)
		}
	}
	// Client B's "conv-a" is its own lease: no error, and nothing of A's
	// lease (its id) in the answer.
	if r := s.do(t, tokB, "POST", "/v1/leases", `{"conversationId":"conv-a"}`); r.code != 200 || bytes.Contains(r.body, []byte(idA)) ||
		r.json(t)["lease"].(map[string]any)["owner"] != "team-b" {
		t.Errorf("client B acquires its own conv-a: %d %s", r.code, r.body)
	}
	// Client A lists only its own lease.
	r := s.do(t, tokA, "GET", "/v1/leases", "")
	if bytes.Contains(r.body, []byte(idB)) || !bytes.Contains(r.body, []byte(idA)) {
		t.Errorf("client A list = %s", r.body)
	}
	// The lease token releases its own lease.
	if r := s.do(t, leaseTokA, "DELETE", "/v1/leases/"+idA, ""); r.code != 200 || r.json(t)["state"] != "LEASE_STATE_RELEASED" {
		t.Errorf("release own: %d %s", r.code, r.body)
	}
	// Operator reaps the rest.
	r = s.do(t, opToken, "POST", "/v1/leases:reap", `{"all":true}`)
	if r.code != 200 || !bytes.Contains(r.body, []byte(idB)) {
		t.Errorf("reap: %d %s", r.code, r.body)
	}
}

func TestAcquireValidationAndIdempotency(t *testing.T) {
	s := start(t, nil)
	for _, tc := range []struct{ body, field string }{
		{`{}`, "conversation_id"},
		{`{"conversationId":"c","ttl":"-5s"}`, "ttl"},
		{`{"conversationId":"c","ttl":"1000000000s"}`, "ttl"},
		{`{"conversationId":"c","ttl":"999999h"}`, "ttl"},
		{`{"conversationId":"c","idleTimeout":"-1s"}`, "idle_timeout"},
		{`{"conversationId":"c","labels":{"":"x"}}`, "label"},
		{`{"conversationId":"c","resources":{"cpus":-1}}`, "cpus"},
		{`{"conversationId":"c","nope":1}`, "nope"},
	} {
		r := s.do(t, opToken, "POST", "/v1/leases", tc.body)
		if r.code != 400 || !bytes.Contains(r.body, []byte(tc.field)) {
			t.Errorf("acquire %s = %d %s, want 400 naming %s", tc.body, r.code, r.body, tc.field)
		}
	}
	id1, tok1 := s.acquire(t, opToken, "same")
	id2, tok2 := s.acquire(t, opToken, "same")
	if id1 != id2 || tok1 != tok2 {
		t.Errorf("second acquire gave %s/%s, want %s/%s", id2, tok2, id1, tok1)
	}
	if r := s.do(t, opToken, "GET", "/v1/leases/nope", ""); r.code != 404 && r.code != 400 {
		t.Errorf("unknown id: %d %s", r.code, r.body)
	}
	// Release twice is fine and returns the same ended lease.
	a := s.do(t, opToken, "DELETE", "/v1/leases/"+id1, "")
	b := s.do(t, opToken, "DELETE", "/v1/leases/"+id1, "")
	if a.code != 200 || b.code != 200 || a.json(t)["state"] != b.json(t)["state"] {
		t.Errorf("release twice: %d %s / %d %s", a.code, a.body, b.code, b.body)
	}
	// Renewing a released lease is a failed precondition.
	if r := s.do(t, opToken, "POST", "/v1/leases/"+id1+":renew", `{}`); r.code != 400 || !bytes.Contains(r.body, []byte(`"code":9`)) {
		t.Errorf("renew released: %d %s", r.code, r.body)
	}
}

func TestMaxLeasesRetryAfter(t *testing.T) {
	s := start(t, func(c *orchestrator.Config) { c.Admission.MaxLive = 1 })
	s.acquire(t, opToken, "one")
	r := s.do(t, opToken, "POST", "/v1/leases", `{"conversationId":"two"}`)
	if r.code != 429 || r.header.Get("Retry-After") == "" {
		t.Fatalf("second acquire: %d Retry-After=%q %s", r.code, r.header.Get("Retry-After"), r.body)
	}
}

func TestExecThroughAgentAndMetrics(t *testing.T) {
	s := start(t, nil)
	id, _ := s.acquire(t, opToken, "exec")
	l, err := s.srv.Manager().Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://"+l.Endpoint+"/v1/exec", strings.NewReader(`{"argv":["echo","hi"]}`))
	req.Header.Set("Authorization", "Bearer "+s.srv.Manager().Tokens().AgentToken(id))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"stdout":"hi\n"`)) {
		t.Fatalf("exec: %d %s", resp.StatusCode, body)
	}
	r := s.do(t, "", "GET", "/metrics", "")
	if r.code != 200 || !bytes.Contains(r.body, []byte("berth_leases_live 1")) || !bytes.Contains(r.body, []byte(`berth_leases{state="READY"} 1`)) {
		t.Errorf("metrics: %d %s", r.code, r.body)
	}
	if r := s.do(t, "", "GET", "/healthz", ""); r.code != 200 {
		t.Errorf("healthz: %d", r.code)
	}
}

func TestWatchStreamsTransitions(t *testing.T) {
	s := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.base+"/v1/leases:watch", nil)
	req.Header.Set("Authorization", "Bearer "+tokA)
	// The gateway sends headers with the first event, so wait for the
	// response while leases are acquired.
	type result struct {
		resp *http.Response
		err  error
	}
	rc := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		rc <- result{resp, err}
	}()
	time.Sleep(200 * time.Millisecond) // let the watch subscribe
	s.acquire(t, tokB, "other-owner")  // must not be seen by A
	id, _ := s.acquire(t, tokA, "watched")
	res := <-rc
	if res.err != nil {
		t.Fatal(res.err)
	}
	resp := res.resp
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("watch: %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	var seen []string
	for len(seen) < 2 && sc.Scan() {
		var ev struct {
			Result struct {
				Lease      struct{ ID string } `json:"lease"`
				Transition struct{ To string } `json:"transition"`
			} `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %s: %v", sc.Text(), err)
		}
		if ev.Result.Lease.ID != id {
			t.Fatalf("client A saw event of lease %s: %s", ev.Result.Lease.ID, sc.Text())
		}
		seen = append(seen, ev.Result.Transition.To)
	}
	if strings.Join(seen, ",") != "LEASE_STATE_PENDING,LEASE_STATE_READY" {
		t.Errorf("transitions = %v", seen)
	}
}

func TestProxyThroughOrchestrator(t *testing.T) {
	s := start(t, nil)
	id, tok := s.acquire(t, opToken, "proxied")
	r := s.do(t, tok, "POST", "/v1/sandboxes/"+id+"/v1/exec", `{"argv":["echo","via-proxy"]}`)
	if r.code != 200 || !bytes.Contains(r.body, []byte(`"stdout":"via-proxy\n"`)) {
		t.Fatalf("REST exec through proxy: %d %s", r.code, r.body)
	}
	other, _ := s.acquire(t, opToken, "other")
	if r := s.do(t, tok, "POST", "/v1/sandboxes/"+other+"/v1/exec", `{"argv":["true"]}`); r.code != 401 {
		t.Errorf("another lease's token: %d %s", r.code, r.body)
	}
	if r := s.do(t, opToken, "GET", "/v1/sandboxes/nope/v1/info", ""); r.code != 404 {
		t.Errorf("unknown lease: %d %s", r.code, r.body)
	}
	// gRPC: dial the orchestrator, name the lease in metadata.
	conn, err := grpc.NewClient(strings.TrimPrefix(s.base, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok, "x-berth-lease", id)
	res, err := agentv1.NewProcessServiceClient(conn).Exec(ctx, &agentv1.ExecRequest{Command: "printf grpc"})
	if err != nil || res.Stdout != "grpc" {
		t.Fatalf("gRPC exec through proxy: %v %v", res, err)
	}
	// The lease API on the same connection still works (and still needs a token).
	_, err = orchv1.NewLeaseServiceClient(conn).Get(metadata.AppendToOutgoingContext(context.Background(), "x-berth-lease", id), &orchv1.GetLeaseRequest{Id: id})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("lease API without token: %v", err)
	}
	if r := s.do(t, "", "GET", "/metrics", ""); !bytes.Contains(r.body, []byte("berth_proxy_")) {
		t.Errorf("metrics lack proxy counters: %s", r.body)
	}
}

// TestOwnErrorMessages pins the codes and exact messages of the server's
// own checks, over REST and gRPC: clients and scripts match them, so moving
// them onto errdefs categories must not change a byte.
func TestOwnErrorMessages(t *testing.T) {
	s := start(t, func(c *orchestrator.Config) { c.MaxWatchesPerPrincipal = 1 })
	idA, leaseTokA := s.acquire(t, tokA, "conv-a")
	const unauth = "missing or invalid bearer token (send 'Authorization: Bearer TOKEN': the operator token, a client token, or a lease token)"
	for _, tc := range []struct {
		name, token, method, path, body string
		status, code                    int
		message                         string
	}{
		{"no token", "", "GET", "/v1/leases", "", 401, 16, unauth},
		{"bad token", "nope", "GET", "/v1/leases/" + idA, "", 401, 16, unauth},
		{"other owner's lease", tokB, "GET", "/v1/leases/" + idA, "", 404, 5, "lease " + idA + " not found"},
		{"lease token acquires", leaseTokA, "POST", "/v1/leases", `{"conversationId":"x"}`, 403, 7, "this token may not make this call"},
		{"client reaps", tokA, "POST", "/v1/leases:reap", `{"all":true}`, 403, 7, "reap needs the operator token"},
		{"client lists another owner", tokA, "GET", "/v1/leases?owner=team-b", "", 403, 7, "owner: a client token lists only its own leases"},
		{"client acquires for another owner", tokA, "POST", "/v1/leases", `{"conversationId":"y","owner":"team-b"}`, 403, 7, "owner: a client token acquires only for its own owner"},
		{"negative page size", opToken, "GET", "/v1/leases?pageSize=-1", "", 400, 3, "page_size: must not be negative"},
		{"negative ttl", opToken, "POST", "/v1/leases", `{"conversationId":"c","ttl":"-5s"}`, 400, 3, "ttl: must not be negative, got -5s"},
		{"negative cpus", opToken, "POST", "/v1/leases", `{"conversationId":"c","resources":{"cpus":-1}}`, 400, 3, "resources.cpus: -1 must not be negative"},
		{"too many cpus", opToken, "POST", "/v1/leases", `{"conversationId":"c","resources":{"cpus":1e9}}`, 400, 3, "resources.cpus: 1e+09 exceeds the maximum 4"},
	} {
		r := s.do(t, tc.token, tc.method, tc.path, tc.body)
		var m struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(r.body, &m)
		if r.code != tc.status || m.Code != tc.code || m.Message != tc.message {
			t.Errorf("%s: %d %s, want %d {code %d, message %q}", tc.name, r.code, r.body, tc.status, tc.code, tc.message)
		}
	}

	conn, err := grpc.NewClient(strings.TrimPrefix(s.base, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lc := orchv1.NewLeaseServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	as := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	check := func(name string, err error, code codes.Code, msg string) {
		t.Helper()
		if st := status.Convert(err); st.Code() != code || st.Message() != msg {
			t.Errorf("%s: %v %q, want %v %q", name, st.Code(), st.Message(), code, msg)
		}
	}
	_, err = lc.Get(ctx, &orchv1.GetLeaseRequest{Id: idA})
	check("gRPC without token", err, codes.Unauthenticated, unauth)
	_, err = lc.Get(as(opToken), &orchv1.GetLeaseRequest{})
	check("empty id", err, codes.InvalidArgument, "id: required")
	_, err = lc.Get(as(tokB), &orchv1.GetLeaseRequest{Id: idA})
	check("other owner's lease", err, codes.NotFound, "lease "+idA+" not found")
	recv := func(tok string, req *orchv1.WatchRequest) error {
		w, err := lc.Watch(as(tok), req)
		if err != nil {
			return err
		}
		_, err = w.Recv()
		return err
	}
	check("client watches another owner", recv(tokA, &orchv1.WatchRequest{Owner: "team-b"}),
		codes.PermissionDenied, "owner: a client token watches only its own leases")
	check("lease token watches another lease", recv(leaseTokA, &orchv1.WatchRequest{LeaseId: "l-other"}),
		codes.PermissionDenied, "this token may not make this call")
	// One watch per principal: the second is refused.
	w, err := lc.Watch(as(opToken), &orchv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil {
		t.Fatal(err)
	}
	check("second watch", recv(opToken, &orchv1.WatchRequest{}),
		codes.ResourceExhausted, "stream limit: at most 1 concurrent streams per caller (lease watches, log follows, terminal attaches and file watches together); 1 are open for this token, close one first")
}
