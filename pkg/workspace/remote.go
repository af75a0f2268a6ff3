package workspace

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Transport selects the wire protocol of a Remote.
type Transport int

const (
	// TransportGRPC speaks gRPC over one HTTP/2 connection (the default).
	// Calls are not retried.
	TransportGRPC Transport = iota
	// TransportREST speaks the agent's JSON/REST API and its raw file
	// routes over HTTP/1.1, retrying only idempotent calls (see
	// RemoteConfig).
	TransportREST
)

// String returns "grpc" or "rest".
func (t Transport) String() string {
	switch t {
	case TransportGRPC:
		return "grpc"
	case TransportREST:
		return "rest"
	}
	return fmt.Sprintf("Transport(%d)", int(t))
}

// Defaults of RemoteConfig.
const (
	// DefaultRetryMax is the default number of retries of an idempotent
	// REST call.
	DefaultRetryMax = 4
	// DefaultRetryWaitMin is the default first backoff of a REST retry.
	DefaultRetryWaitMin = 100 * time.Millisecond
	// DefaultRetryWaitMax is the default longest backoff of a REST retry.
	DefaultRetryWaitMax = 2 * time.Second
)

// RemoteConfig configures a Remote.
//
// # Retries (REST)
//
// A REST Remote retries a call only when repeating it cannot change the
// outcome, only on a connection error (refused, reset, closed before the
// response) or a 502, 503 or 504 answer — never on any 4xx (a 409 or 410
// from the proxy says the lease is not ready or gone; retrying would not
// help), never after the response body started streaming, and never once
// ctx is done — with exponential backoff from RetryWaitMin to RetryWaitMax,
// at most RetryMax times:
//
//   - GET and HEAD calls (info, stat, list, git status and diff, download)
//     are retried;
//   - POST /v1/exec and /v1/exec:stream are never retried: the command
//     may have run;
//   - the raw-file PUT of Upload is idempotent (the same bytes to the same
//     path give the same file, and the agent renames atomically) but only
//     replayable when the bytes can be sent again: an upload from an
//     io.ReadSeeker (*os.File, *bytes.Reader, *strings.Reader) is retried
//     after seeking back to where it started; an upload from any other
//     reader is streamed once and not retried, since replaying it would
//     mean buffering an arbitrarily large body in memory.
//
// gRPC calls are never retried; the gRPC channel reconnects by itself.
type RemoteConfig struct {
	// Target is where the agent API is served: "host:port", or a URL
	// "http://host:port" or "https://host:port" (TLS). For REST a URL may
	// carry a path prefix. Required. Through the orchestrator this is the
	// orchestrator's address, with LeaseID set.
	Target string
	// Token is the bearer token sent with every call: the agent's token
	// when talking to an agent directly, the lease token (or operator
	// token) through the orchestrator's proxy.
	Token string
	// LeaseID, when set, routes calls through the orchestrator's proxy to
	// that lease's sandbox: gRPC calls carry "x-berth-lease: LEASE_ID"
	// metadata, and REST paths are prefixed with /v1/sandboxes/LEASE_ID.
	LeaseID string
	// Transport is the wire protocol; default TransportGRPC.
	Transport Transport
	// Root, when set, is the workspace directory; default: the agent's
	// workspace_dir, asked with GetInfo by NewRemote.
	Root string
	// TLSConfig is used for https targets; default: the system's roots.
	TLSConfig *tls.Config
	// HTTPClient sends REST requests; default: a client with its own
	// connection pool and no overall timeout (streams may be long). Its
	// Timeout, if set, bounds every call including downloads.
	HTTPClient *http.Client
	// DialOptions are added to the gRPC connection's options (after
	// berth's own: transport credentials, per-call token, message sizes).
	DialOptions []grpc.DialOption
	// RetryMax is the number of retries of an idempotent REST call;
	// default 4. Negative disables retries.
	RetryMax int
	// RetryWaitMin and RetryWaitMax bound the exponential backoff between
	// REST retries; default 100ms and 2s.
	RetryWaitMin, RetryWaitMax time.Duration
	// Logger receives the workspace's logs (retries at debug, failed
	// attempts at warn); default slog.Default().
	Logger *slog.Logger
}

// backend is one wire protocol of a Remote. It takes absolute paths and
// returns the agent's messages; errors carry errdefs categories.
type backend interface {
	info(ctx context.Context) (*agentv1.Info, error)
	exec(ctx context.Context, req *agentv1.ExecRequest) (*agentv1.ExecResponse, error)
	// execStream calls fn for each event until the stream ends; fn's error
	// ends the stream (and the command) and is returned as is.
	execStream(ctx context.Context, req *agentv1.ExecRequest, fn func(*agentv1.ExecEvent) error) error
	upload(ctx context.Context, src io.Reader, dst string) error
	download(ctx context.Context, src string, dst io.Writer) error
	archiveBackend
	stat(ctx context.Context, path string) (*agentv1.FileInfo, error)
	list(ctx context.Context, path string, depth int) (*agentv1.ListResponse, error)
	gitStatus(ctx context.Context, repo string) (*agentv1.GitStatusResponse, error)
	gitDiff(ctx context.Context, repo, file string) (*agentv1.GitDiffResponse, error)
	// watch starts a watch stream: recv returns its events (io.EOF at
	// its end), stop ends it.
	watch(ctx context.Context, req *agentv1.WatchRequest) (recv func() (*agentv1.WatchEvent, error), stop func(), err error)
	close() error
}

// Remote is a Workspace in a sandbox, reached through the agent's API
// directly or through the orchestrator's proxy. Create it with NewRemote.
type Remote struct {
	cfg   RemoteConfig
	root  string
	paths resolver
	be    backend

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ Workspace = (*Remote)(nil)

// NewRemote connects to the agent that cfg names and, unless cfg.Root is
// set, asks it for its workspace directory (GetInfo), which checks the
// address and the token: a wrong token is errdefs.ErrUnauthenticated, an
// unreachable agent errdefs.ErrUnavailable.
func NewRemote(ctx context.Context, cfg RemoteConfig) (*Remote, error) {
	if cfg.Target == "" {
		return nil, errdefs.InvalidArgument("target", "required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With("component", "workspace")
	if cfg.LeaseID != "" {
		cfg.Logger = cfg.Logger.With("lease_id", cfg.LeaseID)
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = DefaultRetryMax
	}
	if cfg.RetryWaitMin <= 0 {
		cfg.RetryWaitMin = DefaultRetryWaitMin
	}
	if cfg.RetryWaitMax <= 0 {
		cfg.RetryWaitMax = DefaultRetryWaitMax
	}
	if cfg.RetryWaitMax < cfg.RetryWaitMin {
		cfg.RetryWaitMax = cfg.RetryWaitMin
	}
	var (
		be  backend
		err error
	)
	switch cfg.Transport {
	case TransportGRPC:
		be, err = newGRPCBackend(cfg)
	case TransportREST:
		be, err = newRESTBackend(cfg)
	default:
		return nil, errdefs.InvalidArgument("transport", "unknown transport %d", cfg.Transport)
	}
	if err != nil {
		return nil, err
	}
	root := cfg.Root
	if root == "" {
		info, err := be.info(ctx)
		if err != nil {
			be.close()
			return nil, fmt.Errorf("workspace: get agent info from %s: %w", cfg.Target, err)
		}
		root = info.GetWorkspaceDir()
	}
	if !path.IsAbs(root) {
		be.close()
		return nil, errdefs.InvalidArgument("root", "must be an absolute path, got %q", root)
	}
	root = path.Clean(root)
	return &Remote{cfg: cfg, root: root, paths: resolver{root: root}, be: be}, nil
}

// parseTarget splits a Target into a URL (scheme http or https, host, path
// prefix).
func parseTarget(target string) (*url.URL, error) {
	if !strings.Contains(target, "://") {
		target = "http://" + target
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, errdefs.InvalidArgument("target", "%v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, errdefs.InvalidArgument("target", "scheme must be http or https, got %q", u.Scheme)
	}
	if u.Host == "" {
		return nil, errdefs.InvalidArgument("target", "no host in %q", target)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	u.RawQuery, u.Fragment = "", ""
	return u, nil
}

// Root returns the workspace directory.
func (r *Remote) Root() string { return r.root }

// Close closes the connections; calls in progress are cancelled. Later
// calls fail with ErrClosed.
func (r *Remote) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		r.closeErr = r.be.close()
	})
	return r.closeErr
}

func (r *Remote) check(ctx context.Context) error {
	if r.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// closedErr replaces the error of a call cut short by Close.
func (r *Remote) closedErr(err error) error {
	if err != nil && r.closed.Load() {
		return fmt.Errorf("%w (%v)", ErrClosed, err)
	}
	return err
}

func (r *Remote) execRequest(cmd Command) (*agentv1.ExecRequest, error) {
	cwd, err := r.paths.dir("cwd", cmd.Cwd)
	if err != nil {
		return nil, err
	}
	req := &agentv1.ExecRequest{
		Argv: cmd.Argv, Command: cmd.Shell, Cwd: cwd, Env: cmd.Env, StdinData: cmd.Stdin,
		OutputLimit: cmd.OutputLimit,
	}
	if cmd.Timeout != 0 {
		req.Timeout = durationpb.New(cmd.Timeout)
	}
	return req, nil
}

// Exec runs a command and waits for it; see Workspace.
func (r *Remote) Exec(ctx context.Context, cmd Command) (Result, error) {
	if err := r.check(ctx); err != nil {
		return Result{}, err
	}
	req, err := r.execRequest(cmd)
	if err != nil {
		return Result{}, err
	}
	resp, err := r.be.exec(ctx, req)
	if err != nil {
		return Result{}, r.closedErr(err)
	}
	return Result{
		ExitStatus: ExitStatus{
			ExitCode: int(resp.GetExitCode()), Signal: resp.GetSignal(), TimedOut: resp.GetTimedOut(),
			OOMKilled: resp.GetOomKilled(), Duration: resp.GetDuration().AsDuration(),
		},
		Pid:             int(resp.GetPid()),
		Stdout:          resp.GetStdout(),
		Stderr:          resp.GetStderr(),
		StdoutTruncated: resp.GetStdoutTruncated(),
		StderrTruncated: resp.GetStderrTruncated(),
		StdoutDropped:   resp.GetStdoutDroppedBytes(),
		StderrDropped:   resp.GetStderrDroppedBytes(),
	}, nil
}

// errStreamEnded reports a stream that ended before its Exited event.
var errStreamEnded = errdefs.Unavailable("the event stream ended before the command exited")

// ExecStream runs a command and streams its events to fn; see Workspace.
func (r *Remote) ExecStream(ctx context.Context, cmd Command, fn func(Event) error) (Result, error) {
	if err := r.check(ctx); err != nil {
		return Result{}, err
	}
	req, err := r.execRequest(cmd)
	if err != nil {
		return Result{}, err
	}
	var (
		res    Result
		exited bool
		fnErr  error
	)
	err = r.be.execStream(ctx, req, func(pe *agentv1.ExecEvent) error {
		var ev Event
		switch e := pe.GetEvent().(type) {
		case *agentv1.ExecEvent_Started:
			res.Pid = int(e.Started.GetPid())
			ev = Event{Kind: EventStarted, Pid: res.Pid}
		case *agentv1.ExecEvent_Stdout:
			ev = Event{Kind: EventStdout, Data: e.Stdout}
		case *agentv1.ExecEvent_Stderr:
			ev = Event{Kind: EventStderr, Data: e.Stderr}
		case *agentv1.ExecEvent_Exited:
			res.ExitStatus = ExitStatus{
				ExitCode: int(e.Exited.GetExitCode()), Signal: e.Exited.GetSignal(),
				TimedOut: e.Exited.GetTimedOut(), OOMKilled: e.Exited.GetOomKilled(),
				Duration: e.Exited.GetDuration().AsDuration(),
			}
			exited = true
			st := res.ExitStatus
			ev = Event{Kind: EventExited, Exit: &st}
		default:
			return nil // unknown or gap events: not part of ExecStream
		}
		if err := fn(ev); err != nil {
			fnErr = err
			return err
		}
		return nil
	})
	switch {
	case fnErr != nil:
		return res, fnErr
	case err != nil:
		return res, r.closedErr(err)
	case !exited:
		return res, errStreamEnded
	}
	return res, nil
}

// Upload writes src to dst atomically; see Workspace and, for retries,
// RemoteConfig.
func (r *Remote) Upload(ctx context.Context, src io.Reader, dst string) error {
	if err := r.check(ctx); err != nil {
		return err
	}
	p, err := r.paths.file("path", dst)
	if err != nil {
		return err
	}
	return r.closedErr(r.be.upload(ctx, src, p))
}

// Download writes the file src to dst; see Workspace.
func (r *Remote) Download(ctx context.Context, src string, dst io.Writer) error {
	if err := r.check(ctx); err != nil {
		return err
	}
	p, err := r.paths.file("path", src)
	if err != nil {
		return err
	}
	return r.closedErr(r.be.download(ctx, p, dst))
}

// Stat describes a path; see Workspace.
func (r *Remote) Stat(ctx context.Context, path string) (FileInfo, error) {
	if err := r.check(ctx); err != nil {
		return FileInfo{}, err
	}
	p, err := r.paths.dir("path", path)
	if err != nil {
		return FileInfo{}, err
	}
	fi, err := r.be.stat(ctx, p)
	if err != nil {
		return FileInfo{}, r.closedErr(err)
	}
	return fileInfoFromProto(fi), nil
}

// List lists a directory; see Workspace.
func (r *Remote) List(ctx context.Context, path string, depth int) ([]FileInfo, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	p, err := r.paths.dir("path", path)
	if err != nil {
		return nil, err
	}
	if depth < 0 {
		return nil, errdefs.InvalidArgument("depth", "must not be negative, got %d", depth)
	}
	resp, err := r.be.list(ctx, p, depth)
	if err != nil {
		return nil, r.closedErr(err)
	}
	out := make([]FileInfo, len(resp.GetEntries()))
	for i, e := range resp.GetEntries() {
		out[i] = fileInfoFromProto(e)
	}
	return out, nil
}

func fileInfoFromProto(fi *agentv1.FileInfo) FileInfo {
	out := FileInfo{
		Path: fi.GetPath(), Name: fi.GetName(), Type: fileTypeOf(int(fi.GetType())), Size: fi.GetSize(),
		Mode: modeFromUnix(fi.GetMode()), SymlinkTarget: fi.GetSymlinkTarget(),
	}
	if fi.GetModifiedAt() != nil {
		out.ModTime = fi.GetModifiedAt().AsTime()
	}
	return out
}

// modeFromUnix converts the API's Unix mode bits to an fs.FileMode.
func modeFromUnix(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// GitChanges returns the changed paths of a work tree; see Workspace.
func (r *Remote) GitChanges(ctx context.Context, repo string) ([]GitChange, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	dir, err := r.paths.dir("repo", repo)
	if err != nil {
		return nil, err
	}
	st, err := r.be.gitStatus(ctx, dir)
	if err != nil {
		return nil, r.closedErr(err)
	}
	out := make([]GitChange, 0, len(st.GetFiles()))
	for _, f := range st.GetFiles() {
		out = append(out, GitChange{
			Path: f.GetPath(), OldPath: f.GetOldPath(), Kind: changeKindOf(int(f.GetKind())),
			Staged: f.GetStaged(), Unstaged: f.GetUnstaged(),
		})
	}
	return out, nil
}

// GitDiff returns a diff of a work tree, or one file's versions; see
// Workspace.
func (r *Remote) GitDiff(ctx context.Context, repo, file string) (GitDiff, error) {
	if err := r.check(ctx); err != nil {
		return GitDiff{}, err
	}
	dir, err := r.paths.dir("repo", repo)
	if err != nil {
		return GitDiff{}, err
	}
	d, err := r.be.gitDiff(ctx, dir, file)
	if err != nil {
		return GitDiff{}, r.closedErr(err)
	}
	out := GitDiff{Unified: d.GetUnified(), Original: d.GetOriginal(), Modified: d.GetModified(), Binary: d.GetBinary()}
	if file != "" {
		out.Path, out.OldPath, out.Kind = d.GetPath(), d.GetOldPath(), changeKindOf(int(d.GetKind()))
	}
	return out, nil
}

// uploadSourceError wraps the error of an upload's source.
func uploadSourceError(dst string, err error) error {
	return fmt.Errorf("upload %s: reading the source: %w", dst, err)
}
