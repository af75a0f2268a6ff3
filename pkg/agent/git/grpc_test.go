package git

import (
	"context"
	"net"
	"strings"
	"testing"
	"unicode/utf8"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// serve starts a gRPC server with a GitService over g on 127.0.0.1:0 and
// returns a client.
func serve(t *testing.T, g *Git) agentv1.GitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterGitServiceServer(srv, NewServer(g))
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return agentv1.NewGitServiceClient(conn)
}

func TestGRPC(t *testing.T) {
	t.Parallel()
	dir := newRepo(t)
	write(t, dir, "a.txt", "a\n")
	write(t, dir, "old.txt", lines("old", 10))
	write(t, dir, "latin1.txt", "caf\xe9\n")
	commitAll(t, dir, "base")
	write(t, dir, "a.txt", "a2\n")
	mustGit(t, dir, "mv", "old.txt", "new.txt")
	write(t, dir, "latin1.txt", "caf\xe9 2\n")
	write(t, dir, "bad-\xff-name.txt", "x\xff\n") // neither name nor content is UTF-8
	c := serve(t, New(Config{WorkDir: dir}))
	ctx := context.Background()

	st, err := c.Status(ctx, &agentv1.GitStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]agentv1.ChangeKind{}
	for _, f := range st.Files {
		kinds[f.Path] = f.Kind
		if f.Path == "new.txt" && (f.OldPath != "old.txt" || !f.Staged || f.Unstaged) {
			t.Errorf("rename = %v", f)
		}
	}
	want := map[string]agentv1.ChangeKind{
		"a.txt":               agentv1.ChangeKind_CHANGE_KIND_MODIFIED,
		"new.txt":             agentv1.ChangeKind_CHANGE_KIND_RENAMED,
		"latin1.txt":          agentv1.ChangeKind_CHANGE_KIND_MODIFIED,
		"bad-\uFFFD-name.txt": agentv1.ChangeKind_CHANGE_KIND_UNTRACKED,
	}
	if len(kinds) != len(want) {
		t.Errorf("kinds = %v", kinds)
	}
	for p, k := range want {
		if kinds[p] != k {
			t.Errorf("%q: kind %v, want %v", p, kinds[p], k)
		}
	}
	if st.Branch != "main" || st.Detached || len(st.Head) != 40 {
		t.Errorf("status = %v", st)
	}

	d, err := c.Diff(ctx, &agentv1.GitDiffRequest{Repo: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !utf8.ValidString(d.Unified) || !strings.Contains(d.Unified, "+a2\n") || !strings.Contains(d.Unified, "rename to new.txt") {
		t.Errorf("unified = %q", d.Unified)
	}
	d, err = c.Diff(ctx, &agentv1.GitDiffRequest{File: "new.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Kind != agentv1.ChangeKind_CHANGE_KIND_RENAMED || d.Path != "new.txt" || d.OldPath != "old.txt" || d.Original != lines("old", 10) || d.Modified != d.Original || d.Binary {
		t.Errorf("file diff = %v", d)
	}
	d, err = c.Diff(ctx, &agentv1.GitDiffRequest{File: "latin1.txt"})
	if err != nil || !d.Binary || d.Original != "" || d.Modified != "" {
		t.Errorf("latin1 diff = %v, %v", d, err)
	}

	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"non-repo", func() error {
			_, err := c.Status(ctx, &agentv1.GitStatusRequest{Repo: t.TempDir()})
			return err
		}, codes.FailedPrecondition, "is not a git repository"},
		{"relative repo", func() error {
			_, err := c.Status(ctx, &agentv1.GitStatusRequest{Repo: "rel"})
			return err
		}, codes.InvalidArgument, "repo"},
		{"unknown ref", func() error {
			_, err := c.Diff(ctx, &agentv1.GitDiffRequest{Ref: "nope"})
			return err
		}, codes.NotFound, "ref"},
		{"missing file", func() error {
			_, err := c.Diff(ctx, &agentv1.GitDiffRequest{File: "nope.txt"})
			return err
		}, codes.NotFound, "nope.txt"},
	} {
		err := tc.call()
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: err = %v, want %v mentioning %q", tc.name, err, tc.code, tc.msg)
		}
	}

	// The other RPCs, end to end.
	h, err := c.Commit(ctx, &agentv1.GitCommitRequest{Message: "all", All: true, AuthorName: "Bob", AuthorEmail: "bob@example.com"})
	if err != nil || len(h.Hash) != 40 {
		t.Fatalf("commit = %v, %v", h, err)
	}
	lg, err := c.Log(ctx, &agentv1.GitLogRequest{Limit: 1})
	if err != nil || len(lg.Commits) != 1 || lg.Commits[0].Hash != h.Hash || lg.Commits[0].AuthorName != "Bob" || lg.Commits[0].Time.AsTime().IsZero() || len(lg.Commits[0].Parents) != 1 {
		t.Fatalf("log = %v, %v", lg, err)
	}
	co, err := c.Checkout(ctx, &agentv1.GitCheckoutRequest{Branch: "topic", Create: true})
	if err != nil || co.Branch != "topic" || co.Head != h.Hash {
		t.Fatalf("checkout = %v, %v", co, err)
	}
	cl, err := c.Clone(ctx, &agentv1.GitCloneRequest{Url: dir, Dir: t.TempDir() + "/clone", Branch: "topic"})
	if err != nil || cl.Branch != "topic" || cl.Head != h.Hash {
		t.Fatalf("clone = %v, %v", cl, err)
	}
	_, err = c.Commit(ctx, &agentv1.GitCommitRequest{Message: "again"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("empty commit err = %v", err)
	}
}
