package orchestrator_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/lease"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// drainIDs returns the drained and failed lease ids of a drain answer.
func drainIDs(t *testing.T, r reply) (drained, failed []string) {
	t.Helper()
	m := r.json(t)
	for _, v := range m["drained"].([]any) {
		drained = append(drained, v.(string))
	}
	if fs, ok := m["failed"].([]any); ok {
		for _, f := range fs {
			failed = append(failed, f.(map[string]any)["leaseId"].(string))
		}
	}
	return drained, failed
}

// Only the operator drains: a tenant (client token, over REST and gRPC) and
// a lease token are denied, a bad mode is INVALID_ARGUMENT naming mode, and
// none of them starts draining.
func TestDrainAuthAndValidation(t *testing.T) {
	s := start(t, nil)
	id, leaseTok := s.acquire(t, tokA, "conv-a")
	for _, tc := range []struct {
		name, token, body string
		want              int
		wantBody          string
	}{
		{"no token", "", `{"mode":"hibernate"}`, 401, ""},
		{"tenant", tokA, `{"mode":"release"}`, 403, "operator token"},
		{"lease token", leaseTok, `{"mode":"release"}`, 403, "operator token"},
		{"unknown mode", opToken, `{"mode":"freeze"}`, 400, `mode: unknown drain mode \"freeze\"`},
		{"no mode", opToken, `{}`, 400, "mode: required"},
	} {
		if r := s.do(t, tc.token, "POST", "/v1/admin/drain", tc.body); r.code != tc.want || !bytes.Contains(r.body, []byte(tc.wantBody)) {
			t.Errorf("%s: %d %s; want %d with %q", tc.name, r.code, r.body, tc.want, tc.wantBody)
		}
	}
	conn, err := grpc.NewClient(strings.TrimPrefix(s.base, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tokB)
	if _, err := orchv1.NewLeaseServiceClient(conn).Drain(ctx, &orchv1.DrainRequest{Mode: "release"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("tenant drain over gRPC: %v; want PERMISSION_DENIED", err)
	}
	if s.srv.Manager().Draining() {
		t.Fatal("a refused drain started draining")
	}
	if l, err := s.srv.Manager().Get(context.Background(), id); err != nil || l.State != lease.StateReady {
		t.Fatalf("lease after refused drains: %v %v", l.State, err)
	}
	s.acquire(t, tokB, "conv-b") // acquires still work
}

// Drain with hibernate: every lease ends PAUSED (hibernate) with its files,
// new acquires, an acquire of a drained conversation and a request through
// the proxy are refused with 503, and the drain is listed per lease.
func TestDrainHibernateREST(t *testing.T) {
	s := start(t, nil)
	idA, tokLeaseA := s.acquire(t, tokA, "conv-a")
	idB, _ := s.acquire(t, tokB, "conv-b")
	if r := s.do(t, tokLeaseA, "POST", "/v1/sandboxes/"+idA+"/v1/exec", `{"argv":["sh","-c","echo kept > /workspace/f"]}`); r.code != 200 {
		t.Fatalf("write a file: %d %s", r.code, r.body)
	}

	r := s.do(t, opToken, "POST", "/v1/admin/drain", `{"mode":"hibernate"}`)
	if r.code != 200 {
		t.Fatalf("drain: %d %s", r.code, r.body)
	}
	drained, failed := drainIDs(t, r)
	want := []string{idA, idB}
	slices.Sort(want)
	if !slices.Equal(drained, want) || len(failed) != 0 {
		t.Fatalf("drain answer %s; want drained %v", r.body, want)
	}
	for _, id := range want {
		l, err := s.srv.Manager().Get(context.Background(), id)
		if err != nil || l.State != lease.StatePaused || l.Paused != lease.PauseHibernate {
			t.Errorf("lease %s after drain: %s (%s) %v; want PAUSED (hibernate)", id, l.State, l.Paused, err)
		}
	}
	if r := s.do(t, tokA, "POST", "/v1/leases", `{"conversationId":"new"}`); r.code != 503 || !bytes.Contains(r.body, []byte("draining")) {
		t.Errorf("acquire while draining: %d %s; want 503 saying draining", r.code, r.body)
	}
	if r := s.do(t, tokA, "POST", "/v1/leases", `{"conversationId":"conv-a"}`); r.code != 503 {
		t.Errorf("acquire of a hibernated conversation while draining: %d %s; want 503", r.code, r.body)
	}
	if r := s.do(t, tokLeaseA, "POST", "/v1/sandboxes/"+idA+"/v1/exec", `{"argv":["cat","/workspace/f"]}`); r.code != 503 || !bytes.Contains(r.body, []byte("draining")) {
		t.Errorf("proxied request to a drained lease: %d %s; want 503 saying draining", r.code, r.body)
	}
	if r := s.do(t, opToken, "POST", "/v1/leases/"+idA+":resume", `{}`); r.code != 503 {
		t.Errorf("resume while draining: %d %s; want 503", r.code, r.body)
	}
	if l, _ := s.srv.Manager().Get(context.Background(), idA); l.State != lease.StatePaused {
		t.Fatalf("a refused call woke lease A: %s", l.State)
	}
}

// Drain with release: every lease is RELEASED with the reason given, its
// sandbox removed, and later acquires are refused.
func TestDrainReleaseGRPC(t *testing.T) {
	o := orchtest.Start(t, nil)
	s := &testServer{base: o.Base, srv: o.Srv}
	idA, _ := s.acquire(t, tokA, "conv-a")
	idB, _ := s.acquire(t, tokB, "conv-b")
	conn, err := grpc.NewClient(o.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+opToken)
	c := orchv1.NewLeaseServiceClient(conn)
	res, err := c.Drain(ctx, &orchv1.DrainRequest{Mode: "release", Reason: "host out"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{idA, idB}
	slices.Sort(want)
	if !slices.Equal(res.Drained, want) || len(res.Failed) != 0 {
		t.Fatalf("drain = %v; want drained %v", res, want)
	}
	for _, id := range want {
		l, err := s.srv.Manager().Get(context.Background(), id)
		if err != nil || l.State != lease.StateReleased || !slices.ContainsFunc(l.Transitions, func(tr lease.Transition) bool { return tr.Reason == "host out" }) {
			t.Errorf("lease %s after drain: %s %+v %v; want RELEASED with the reason", id, l.State, l.Transitions, err)
		}
	}
	if boxes, err := o.Runtime.List(context.Background(), nil); err != nil || len(boxes) != 0 {
		t.Errorf("%d sandboxes left after a release drain (%v)", len(boxes), err)
	}
	_, err = c.Acquire(ctx, &orchv1.AcquireRequest{ConversationId: "conv-a"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "draining") {
		t.Fatalf("acquire after the drain: %v; want UNAVAILABLE saying draining", err)
	}
}
