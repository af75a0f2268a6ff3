package workspace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// restBackend speaks the agent's REST API: grpc-gateway JSON routes and the
// raw file routes, optionally through the proxy's /v1/sandboxes/{lease}.
type restBackend struct {
	c *restClient
}

// SandboxPathPrefix returns the URL path prefix under which the
// orchestrator's proxy serves the agent API of lease leaseID.
func SandboxPathPrefix(leaseID string) string {
	return "/v1/sandboxes/" + url.PathEscape(leaseID)
}

func newRESTBackend(cfg RemoteConfig) (*restBackend, error) {
	prefix := ""
	if cfg.LeaseID != "" {
		prefix = SandboxPathPrefix(cfg.LeaseID)
	}
	c, err := newRESTClient(restOptions{
		target: cfg.Target, prefix: prefix, token: cfg.Token, tlsConfig: cfg.TLSConfig,
		httpClient: cfg.HTTPClient, retryMax: cfg.RetryMax, waitMin: cfg.RetryWaitMin, waitMax: cfg.RetryWaitMax,
		log: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &restBackend{c: c}, nil
}

func (b *restBackend) close() error {
	b.c.close()
	return nil
}

func (b *restBackend) info(ctx context.Context) (*agentv1.Info, error) {
	out := &agentv1.Info{}
	return out, b.c.getJSON(ctx, "/v1/info", nil, out)
}

func (b *restBackend) exec(ctx context.Context, req *agentv1.ExecRequest) (*agentv1.ExecResponse, error) {
	out := &agentv1.ExecResponse{}
	// Never retried: the command may have run.
	return out, b.c.callJSON(ctx, request{method: http.MethodPost, route: "/v1/exec"}, req, out)
}

// streamLine is one line of a grpc-gateway server stream.
type streamLine struct {
	Result json.RawMessage `json:"result"`
	Error  *errorBody      `json:"error"`
}

func (b *restBackend) execStream(ctx context.Context, req *agentv1.ExecRequest, fn func(*agentv1.ExecEvent) error) error {
	// Cancelling the request closes the connection, which tells the agent
	// to kill the command's process group.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	body, err := protojson.Marshal(req)
	if err != nil {
		return fmt.Errorf("%w: encode request: %v", errdefs.ErrInternal, err)
	}
	r := request{method: http.MethodPost, route: "/v1/exec:stream", body: bytes.NewReader(body), contentType: "application/json"}
	s, err := b.stream(ctx, r)
	if err != nil {
		return err
	}
	defer s.close()
	for {
		ev := &agentv1.ExecEvent{}
		if err := s.next(ctx, ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

func (b *restBackend) watch(ctx context.Context, req *agentv1.WatchRequest) (func() (*agentv1.WatchEvent, error), func(), error) {
	// Cancelling the request closes the connection, which ends the watch
	// in the agent. Never retried: a stream.
	ctx, cancel := context.WithCancel(ctx)
	q := url.Values{"path": {req.GetPath()}}
	if req.GetRecursive() {
		q.Set("recursive", "true")
	}
	if req.GetDebounceMs() != 0 {
		q.Set("debounce_ms", strconv.FormatUint(uint64(req.GetDebounceMs()), 10))
	}
	s, err := b.stream(ctx, request{method: http.MethodGet, route: "/v1/files:watch", query: q})
	if err != nil {
		cancel()
		return nil, nil, err
	}
	recv := func() (*agentv1.WatchEvent, error) {
		ev := &agentv1.WatchEvent{}
		return ev, s.next(ctx, ev)
	}
	return recv, func() { s.close(); cancel() }, nil
}

// restStream reads a grpc-gateway server stream: newline-delimited JSON,
// one {"result": MESSAGE} or {"error": STATUS} per line.
type restStream struct {
	c    *restClient
	r    request
	resp *http.Response
	dec  *json.Decoder
}

// stream sends r and returns its stream of messages.
func (b *restBackend) stream(ctx context.Context, r request) (*restStream, error) {
	resp, err := b.c.do(ctx, r)
	if err != nil {
		return nil, err
	}
	return &restStream{c: b.c, r: r, resp: resp, dec: json.NewDecoder(resp.Body)}, nil
}

func (s *restStream) close() { s.resp.Body.Close() }

// next decodes the next message into msg: io.EOF at the end of the
// stream, the error a line carries, or a transport error.
func (s *restStream) next(ctx context.Context, msg proto.Message) error {
	for {
		var line streamLine
		if err := s.dec.Decode(&line); err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			return s.c.transportErr(ctx, s.r, err)
		}
		if line.Error != nil {
			code := codes.Unknown
			if line.Error.Code != nil {
				code = codes.Code(*line.Error.Code)
			}
			return errgrpc.FromGRPC(status.Error(code, line.Error.Message))
		}
		if len(line.Result) == 0 {
			continue
		}
		if err := s.c.jsonIn.Unmarshal(line.Result, msg); err != nil {
			return fmt.Errorf("%w: decode stream event: %v", errdefs.ErrInternal, err)
		}
		return nil
	}
}

// fileRoute returns the escaped raw-file route of the absolute path p.
func fileRoute(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/v1/files" + strings.Join(segs, "/")
}

func (b *restBackend) upload(ctx context.Context, src io.Reader, dst string) error {
	// parents=false: Workspace.Upload requires the parent to exist (the
	// agent would create it by default).
	r := request{method: http.MethodPut, route: fileRoute(dst), query: url.Values{"parents": {"false"}}, contentType: "application/octet-stream"}
	if rb, ok := replayable(src); ok {
		// Idempotent and replayable: retried (see RemoteConfig).
		r.replay, r.retry = rb, true
	} else {
		r.body = onceBody{src}
	}
	resp, err := b.c.do(ctx, r)
	if err != nil {
		var se *sourceReadError
		if errors.As(err, &se) {
			return uploadSourceError(dst, se.err)
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return nil
}

// dstWriter records the download destination's own errors.
type dstWriter struct {
	w   io.Writer
	err error
}

func (d *dstWriter) Write(p []byte) (int, error) {
	n, err := d.w.Write(p)
	if err != nil {
		d.err = err
	}
	return n, err
}

func (b *restBackend) download(ctx context.Context, src string, dst io.Writer) error {
	return b.getTo(ctx, request{method: http.MethodGet, route: fileRoute(src), retry: true}, "download "+src, dst)
}

// getTo streams the body of the GET r into dst; what names the call in
// errors. A body that breaks after it started is not retried, since dst
// already holds part of it.
func (b *restBackend) getTo(ctx context.Context, r request, what string, dst io.Writer) error {
	resp, err := b.c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	w := &dstWriter{w: dst}
	if _, err := io.Copy(w, resp.Body); err != nil {
		if w.err != nil {
			return fmt.Errorf("%s: %w", what, w.err)
		}
		return b.c.transportErr(ctx, r, err)
	}
	return nil
}

func (b *restBackend) stat(ctx context.Context, p string) (*agentv1.FileInfo, error) {
	out := &agentv1.FileInfo{}
	return out, b.c.getJSON(ctx, "/v1/fs:stat", url.Values{"path": {p}}, out)
}

func (b *restBackend) list(ctx context.Context, p string, depth int) (*agentv1.ListResponse, error) {
	q := url.Values{"path": {p}}
	if depth != 0 {
		q.Set("depth", strconv.Itoa(min(depth, 1<<30)))
	}
	out := &agentv1.ListResponse{}
	return out, b.c.getJSON(ctx, "/v1/fs:list", q, out)
}

func (b *restBackend) gitStatus(ctx context.Context, repo string) (*agentv1.GitStatusResponse, error) {
	out := &agentv1.GitStatusResponse{}
	return out, b.c.getJSON(ctx, "/v1/git/status", url.Values{"repo": {repo}}, out)
}

func (b *restBackend) gitDiff(ctx context.Context, repo, file string) (*agentv1.GitDiffResponse, error) {
	q := url.Values{"repo": {repo}}
	if file != "" {
		q.Set("file", file)
	}
	out := &agentv1.GitDiffResponse{}
	return out, b.c.getJSON(ctx, "/v1/git/diff", q, out)
}
