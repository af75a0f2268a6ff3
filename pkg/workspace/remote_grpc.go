package workspace

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// LeaseMetadataKey is the gRPC metadata key that names the lease whose
// sandbox the orchestrator's proxy routes a call to.
const LeaseMetadataKey = "x-berth-lease"

// maxMessage bounds one gRPC message either way (the agent accepts up to
// 24 MiB; an Exec response with large output limits can be big).
const maxMessage = 64 << 20

// uploadChunk is the size of the chunks an upload sends.
const uploadChunk = 256 << 10

// bearerCreds sends the bearer token and the lease id with every call.
type bearerCreds struct {
	md     map[string]string
	secure bool
}

func (c bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return c.md, nil
}

func (c bearerCreds) RequireTransportSecurity() bool { return c.secure }

// dialGRPC opens a gRPC connection to target ("host:port" or an http(s)
// URL), sending token and, when set, the lease id with every call.
func dialGRPC(target, token, leaseID string, tlsConfig *tls.Config, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	u, err := parseTarget(target)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "https" {
		creds = credentials.NewTLS(tlsConfig)
	}
	md := map[string]string{}
	if token != "" {
		md["authorization"] = "Bearer " + token
	}
	if leaseID != "" {
		md[LeaseMetadataKey] = leaseID
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
	}
	if len(md) > 0 {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerCreds{md: md, secure: u.Scheme == "https"}))
	}
	conn, err := grpc.NewClient(u.Host, append(opts, extra...)...)
	if err != nil {
		return nil, errdefs.InvalidArgument("target", "%v", err)
	}
	return conn, nil
}

// grpcBackend speaks the agent's gRPC API over one connection.
type grpcBackend struct {
	conn  *grpc.ClientConn
	proc  agentv1.ProcessServiceClient
	files agentv1.FileServiceClient
	git   agentv1.GitServiceClient
	inf   agentv1.InfoServiceClient
}

func newGRPCBackend(cfg RemoteConfig) (*grpcBackend, error) {
	conn, err := dialGRPC(cfg.Target, cfg.Token, cfg.LeaseID, cfg.TLSConfig, cfg.DialOptions)
	if err != nil {
		return nil, err
	}
	return &grpcBackend{
		conn:  conn,
		proc:  agentv1.NewProcessServiceClient(conn),
		files: agentv1.NewFileServiceClient(conn),
		git:   agentv1.NewGitServiceClient(conn),
		inf:   agentv1.NewInfoServiceClient(conn),
	}, nil
}

// wireErr maps a gRPC error to its errdefs category.
func wireErr(err error) error { return errgrpc.FromGRPC(err) }

func (b *grpcBackend) close() error { return b.conn.Close() }

func (b *grpcBackend) info(ctx context.Context) (*agentv1.Info, error) {
	resp, err := b.inf.GetInfo(ctx, &agentv1.GetInfoRequest{})
	return resp, wireErr(err)
}

func (b *grpcBackend) exec(ctx context.Context, req *agentv1.ExecRequest) (*agentv1.ExecResponse, error) {
	resp, err := b.proc.Exec(ctx, req)
	return resp, wireErr(err)
}

func (b *grpcBackend) execStream(ctx context.Context, req *agentv1.ExecRequest, fn func(*agentv1.ExecEvent) error) error {
	// Cancelling the stream's context tells the agent to kill the
	// command's process group.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := b.proc.ExecStream(ctx, req)
	if err != nil {
		return wireErr(err)
	}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return wireErr(err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

func (b *grpcBackend) upload(ctx context.Context, src io.Reader, dst string) error {
	// On any failure the stream is cancelled, never half-closed: the agent
	// then removes its temporary file instead of committing a short one.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := b.files.Upload(ctx)
	if err != nil {
		return wireErr(err)
	}
	// Workspace.Upload requires the parent to exist (the agent would
	// create it by default).
	hdr := &agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: dst, NoCreateParents: true}}}
	return sendChunks(ctx, cancel, dst, src, upStream{
		send: func(chunk []byte) error {
			if chunk == nil {
				return stream.Send(hdr)
			}
			return stream.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk}})
		},
		closeAndRecv: func() error { _, err := stream.CloseAndRecv(); return err },
	})
}

// upStream is a client stream of an upload: send(nil) sends the header,
// send(chunk) a chunk.
type upStream struct {
	send         func(chunk []byte) error
	closeAndRecv func() error
}

// sendChunks sends the header and then src in chunks on an upload stream,
// and returns the agent's answer. A failure of src cancels the stream.
func sendChunks(ctx context.Context, cancel context.CancelFunc, dst string, src io.Reader, st upStream) error {
	// A send fails with io.EOF when the agent has already answered (for
	// example, NotFound for a missing parent); the answer is then what
	// CloseAndRecv returns.
	answer := func() error {
		err := st.closeAndRecv()
		if err == nil {
			return fmt.Errorf("%w: upload %s: the agent ended the upload early", errdefs.ErrInternal, dst)
		}
		return wireErr(err)
	}
	if err := st.send(nil); err != nil {
		if errors.Is(err, io.EOF) {
			return answer()
		}
		return wireErr(err)
	}
	buf := make([]byte, uploadChunk)
	for {
		n, rerr := io.ReadFull(src, buf)
		if n > 0 {
			if err := st.send(buf[:n]); err != nil {
				if errors.Is(err, io.EOF) {
					return answer()
				}
				return wireErr(err)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			cancel()
			return uploadSourceError(dst, rerr)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return wireErr(st.closeAndRecv())
}

func (b *grpcBackend) download(ctx context.Context, src string, dst io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := b.files.Download(ctx, &agentv1.DownloadRequest{Path: src})
	if err != nil {
		return wireErr(err)
	}
	var want, got int64 = -1, 0
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return wireErr(err)
		}
		if info := msg.GetInfo(); info != nil && want < 0 {
			want = info.GetSize()
		}
		if c := msg.GetChunk(); len(c) > 0 {
			n, err := dst.Write(c)
			got += int64(n)
			if err != nil {
				return fmt.Errorf("download %s: %w", src, err)
			}
		}
	}
	if want >= 0 && got != want {
		return fmt.Errorf("download %s: got %d of %d bytes: %w", src, got, want, io.ErrUnexpectedEOF)
	}
	return nil
}

func (b *grpcBackend) stat(ctx context.Context, p string) (*agentv1.FileInfo, error) {
	resp, err := b.files.Stat(ctx, &agentv1.StatRequest{Path: p})
	return resp, wireErr(err)
}

func (b *grpcBackend) list(ctx context.Context, p string, depth int) (*agentv1.ListResponse, error) {
	resp, err := b.files.List(ctx, &agentv1.ListRequest{Path: p, Depth: int32(min(depth, 1<<30))})
	return resp, wireErr(err)
}

func (b *grpcBackend) gitStatus(ctx context.Context, repo string) (*agentv1.GitStatusResponse, error) {
	resp, err := b.git.Status(ctx, &agentv1.GitStatusRequest{Repo: repo})
	return resp, wireErr(err)
}

func (b *grpcBackend) gitDiff(ctx context.Context, repo, file string) (*agentv1.GitDiffResponse, error) {
	resp, err := b.git.Diff(ctx, &agentv1.GitDiffRequest{Repo: repo, File: file})
	return resp, wireErr(err)
}

func (b *grpcBackend) watch(ctx context.Context, req *agentv1.WatchRequest) (func() (*agentv1.WatchEvent, error), func(), error) {
	// Cancelling the stream's context ends the watch in the agent.
	ctx, cancel := context.WithCancel(ctx)
	stream, err := b.files.Watch(ctx, req)
	if err != nil {
		cancel()
		return nil, nil, wireErr(err)
	}
	recv := func() (*agentv1.WatchEvent, error) {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return ev, wireErr(err)
	}
	return recv, cancel, nil
}
