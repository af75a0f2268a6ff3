package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/berth-dev/berth/pkg/agent/files"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// ArchiveOptions configure DownloadArchive.
type ArchiveOptions struct {
	// Gzip compresses the tar stream. Default false: plain tar.
	Gzip bool
	// FollowLink archives what the path points to when it is a symlink
	// (symlinks below it are never followed). Default false: a symlink is
	// archived as a symlink.
	FollowLink bool
}

// The archive calls of the backends (gRPC and REST).
type archiveBackend interface {
	uploadArchive(ctx context.Context, src io.Reader, dir string) error
	downloadArchive(ctx context.Context, src string, dst io.Writer, opts ArchiveOptions) error
}

// UploadArchive extracts the tar stream src into dir; see Workspace.
func (l *Local) UploadArchive(ctx context.Context, src io.Reader, dir string) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	p, err := l.paths.dir("dir", dir)
	if err != nil {
		return err
	}
	_, err = l.fs.ExtractArchive(ctx, files.ArchiveUploadOptions{Path: p}, src)
	return err
}

// DownloadArchive writes the tar archive of src to dst; see Workspace.
func (l *Local) DownloadArchive(ctx context.Context, src string, dst io.Writer, opts ArchiveOptions) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	p, err := l.paths.dir("path", src)
	if err != nil {
		return err
	}
	if _, err := l.fs.StatArchive(ctx, p, opts.FollowLink); err != nil {
		return err
	}
	return l.fs.WriteArchive(ctx, p, dst, files.ArchiveDownloadOptions{Gzip: opts.Gzip, FollowLink: opts.FollowLink})
}

// UploadArchive extracts the tar stream src into dir in the sandbox; see
// Workspace. It is never retried.
func (r *Remote) UploadArchive(ctx context.Context, src io.Reader, dir string) error {
	if err := r.check(ctx); err != nil {
		return err
	}
	p, err := r.paths.dir("dir", dir)
	if err != nil {
		return err
	}
	return r.closedErr(r.be.uploadArchive(ctx, src, p))
}

// DownloadArchive writes the tar archive of the sandbox's src to dst; see
// Workspace.
func (r *Remote) DownloadArchive(ctx context.Context, src string, dst io.Writer, opts ArchiveOptions) error {
	if err := r.check(ctx); err != nil {
		return err
	}
	p, err := r.paths.dir("path", src)
	if err != nil {
		return err
	}
	return r.closedErr(r.be.downloadArchive(ctx, p, dst, opts))
}

// UploadArchive extracts the tar stream src into dir in the sandbox; see
// Workspace.
func (l *Leased) UploadArchive(ctx context.Context, src io.Reader, dir string) error {
	if err := l.check(); err != nil {
		return err
	}
	return l.remote.UploadArchive(ctx, src, dir)
}

// DownloadArchive writes the tar archive of the sandbox's src to dst; see
// Workspace.
func (l *Leased) DownloadArchive(ctx context.Context, src string, dst io.Writer, opts ArchiveOptions) error {
	if err := l.check(); err != nil {
		return err
	}
	return l.remote.DownloadArchive(ctx, src, dst, opts)
}

func (b *grpcBackend) uploadArchive(ctx context.Context, src io.Reader, dir string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := b.files.UploadArchive(ctx)
	if err != nil {
		return wireErr(err)
	}
	hdr := &agentv1.UploadArchiveRequest{Msg: &agentv1.UploadArchiveRequest_Header{Header: &agentv1.UploadArchiveHeader{Path: dir, NoCreateParents: true}}}
	return sendChunks(ctx, cancel, dir, src, upStream{
		send: func(chunk []byte) error {
			if chunk == nil {
				return stream.Send(hdr)
			}
			return stream.Send(&agentv1.UploadArchiveRequest{Msg: &agentv1.UploadArchiveRequest_Chunk{Chunk: chunk}})
		},
		closeAndRecv: func() error { _, err := stream.CloseAndRecv(); return err },
	})
}

func (b *grpcBackend) downloadArchive(ctx context.Context, src string, dst io.Writer, opts ArchiveOptions) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := b.files.DownloadArchive(ctx, &agentv1.DownloadArchiveRequest{Path: src, Gzip: opts.Gzip, FollowLink: opts.FollowLink})
	if err != nil {
		return wireErr(err)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return wireErr(err)
		}
		if _, err := dst.Write(msg.GetChunk()); err != nil {
			return fmt.Errorf("download archive %s: %w", src, err)
		}
	}
}

// archiveRoute returns the escaped raw archive route of the absolute path p.
func archiveRoute(p string) string {
	return files.ArchiveRoutePrefix + strings.TrimPrefix(fileRoute(p), files.RoutePrefix)
}

func (b *restBackend) uploadArchive(ctx context.Context, src io.Reader, dir string) error {
	// parents=false, as Upload: the parent of a missing dir must exist.
	r := request{method: http.MethodPut, route: archiveRoute(dir), query: url.Values{"parents": {"false"}}, contentType: "application/x-tar", body: onceBody{src}}
	resp, err := b.c.do(ctx, r)
	if err != nil {
		var se *sourceReadError
		if errors.As(err, &se) {
			return uploadSourceError(dir, se.err)
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return nil
}

func (b *restBackend) downloadArchive(ctx context.Context, src string, dst io.Writer, opts ArchiveOptions) error {
	q := url.Values{}
	if opts.Gzip {
		q.Set("gzip", "true")
	}
	if opts.FollowLink {
		q.Set("follow", "true")
	}
	return b.getTo(ctx, request{method: http.MethodGet, route: archiveRoute(src), query: q, retry: true}, "download archive "+src, dst)
}
