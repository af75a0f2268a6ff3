package git

import (
	"context"
	"math"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Server is the gRPC adapter of Git for berth.agent.v1.GitService. It only
// converts messages; errors go through errgrpc.ToGRPC. Every string it
// returns is valid UTF-8 (invalid bytes, as in paths or a unified diff of a
// non-UTF-8 file, become U+FFFD), as protobuf requires.
type Server struct {
	agentv1.UnimplementedGitServiceServer
	g *Git
}

var _ agentv1.GitServiceServer = (*Server)(nil)

// NewServer returns a Server over g.
func NewServer(g *Git) *Server { return &Server{g: g} }

// Status implements GitService.Status.
func (s *Server) Status(ctx context.Context, req *agentv1.GitStatusRequest) (*agentv1.GitStatusResponse, error) {
	st, err := s.g.Status(ctx, req.GetRepo())
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	resp := &agentv1.GitStatusResponse{
		Branch:   utf(st.Branch),
		Head:     st.Head,
		Upstream: utf(st.Upstream),
		Ahead:    int32Of(st.Ahead),
		Behind:   int32Of(st.Behind),
		Detached: st.Detached,
		Files:    make([]*agentv1.GitFileChange, 0, len(st.Files)),
	}
	for _, f := range st.Files {
		resp.Files = append(resp.Files, &agentv1.GitFileChange{
			Path:     utf(f.Path),
			OldPath:  utf(f.OldPath),
			Kind:     kindToProto(f.Kind),
			Staged:   f.Staged,
			Unstaged: f.Unstaged,
		})
	}
	return resp, nil
}

// Diff implements GitService.Diff.
func (s *Server) Diff(ctx context.Context, req *agentv1.GitDiffRequest) (*agentv1.GitDiffResponse, error) {
	d, err := s.g.Diff(ctx, DiffOptions{Repo: req.GetRepo(), Ref: req.GetRef(), File: req.GetFile()})
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.GitDiffResponse{
		Unified:  utf(d.Unified),
		Path:     utf(d.Path),
		OldPath:  utf(d.OldPath),
		Original: utf(d.Original), // valid already unless Binary, which empties it
		Modified: utf(d.Modified),
		Binary:   d.Binary,
		Kind:     kindToProto(d.Kind),
	}, nil
}

// Clone implements GitService.Clone.
func (s *Server) Clone(ctx context.Context, req *agentv1.GitCloneRequest) (*agentv1.GitCloneResponse, error) {
	res, err := s.g.Clone(ctx, CloneOptions{URL: req.GetUrl(), Dir: req.GetDir(), Branch: req.GetBranch(), Depth: int(req.GetDepth())})
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.GitCloneResponse{Dir: utf(res.Dir), Head: res.Head, Branch: utf(res.Branch)}, nil
}

// Checkout implements GitService.Checkout.
func (s *Server) Checkout(ctx context.Context, req *agentv1.GitCheckoutRequest) (*agentv1.GitCheckoutResponse, error) {
	res, err := s.g.Checkout(ctx, req.GetRepo(), req.GetBranch(), req.GetCreate(), req.GetStartPoint())
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.GitCheckoutResponse{Branch: utf(res.Branch), Head: res.Head}, nil
}

// Commit implements GitService.Commit.
func (s *Server) Commit(ctx context.Context, req *agentv1.GitCommitRequest) (*agentv1.GitCommitResponse, error) {
	hash, err := s.g.Commit(ctx, CommitOptions{
		Repo:        req.GetRepo(),
		Message:     req.GetMessage(),
		Paths:       req.GetPaths(),
		All:         req.GetAll(),
		AuthorName:  req.GetAuthorName(),
		AuthorEmail: req.GetAuthorEmail(),
		AllowEmpty:  req.GetAllowEmpty(),
	})
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.GitCommitResponse{Hash: hash}, nil
}

// Log implements GitService.Log.
func (s *Server) Log(ctx context.Context, req *agentv1.GitLogRequest) (*agentv1.GitLogResponse, error) {
	commits, err := s.g.Log(ctx, req.GetRepo(), req.GetRef(), int(req.GetLimit()))
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	resp := &agentv1.GitLogResponse{Commits: make([]*agentv1.GitCommit, 0, len(commits))}
	for _, c := range commits {
		resp.Commits = append(resp.Commits, &agentv1.GitCommit{
			Hash:        c.Hash,
			AuthorName:  utf(c.AuthorName),
			AuthorEmail: utf(c.AuthorEmail),
			Time:        timestamppb.New(c.Time),
			Subject:     utf(c.Subject),
			Parents:     c.Parents,
		})
	}
	return resp, nil
}

// kindToProto maps a ChangeKind to its protobuf enum.
func kindToProto(k ChangeKind) agentv1.ChangeKind {
	switch k {
	case KindAdded:
		return agentv1.ChangeKind_CHANGE_KIND_ADDED
	case KindModified:
		return agentv1.ChangeKind_CHANGE_KIND_MODIFIED
	case KindDeleted:
		return agentv1.ChangeKind_CHANGE_KIND_DELETED
	case KindRenamed:
		return agentv1.ChangeKind_CHANGE_KIND_RENAMED
	case KindCopied:
		return agentv1.ChangeKind_CHANGE_KIND_COPIED
	case KindUntracked:
		return agentv1.ChangeKind_CHANGE_KIND_UNTRACKED
	case KindConflicted:
		return agentv1.ChangeKind_CHANGE_KIND_CONFLICTED
	case KindTypeChanged:
		return agentv1.ChangeKind_CHANGE_KIND_TYPE_CHANGED
	default:
		return agentv1.ChangeKind_CHANGE_KIND_UNSPECIFIED
	}
}

// utf makes s valid UTF-8 for a protobuf string field.
func utf(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

func int32Of(n int) int32 {
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(n)
}
