package files

import (
	"bufio"
	"errors"
	"io"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// UploadArchive reads the header, then extracts the tar stream of the
// chunks into the header's directory (FS.ExtractArchive). A stream that
// breaks fails the extraction and leaves nothing behind.
func (s *Server) UploadArchive(stream agentv1.FileService_UploadArchiveServer) error {
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return errgrpc.ToGRPC(errdefs.InvalidArgument("header", "the stream is empty; the first message must be the archive header"))
	}
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return errgrpc.ToGRPC(errdefs.InvalidArgument("header", "the first message must be the archive header"))
	}
	body := &uploadStream{recv: func() ([]byte, bool, error) {
		msg, err := stream.Recv()
		return msg.GetChunk(), msg.GetHeader() != nil, err
	}}
	res, err := s.fs.ExtractArchive(stream.Context(), ArchiveUploadOptions{Path: h.GetPath(), CreateParents: !h.GetNoCreateParents()}, body)
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	return stream.SendAndClose(&agentv1.UploadArchiveResponse{Path: res.Path, Entries: res.Entries, Bytes: res.Bytes, Created: res.Created})
}

// DownloadArchive streams the archive of a file or directory
// (FS.WriteArchive) in chunks of up to ChunkSize bytes. A missing path is
// NOT_FOUND before any chunk; an error later ends the stream with its
// status, so the client never takes a cut archive for a whole one.
func (s *Server) DownloadArchive(req *agentv1.DownloadArchiveRequest, stream agentv1.FileService_DownloadArchiveServer) error {
	if _, err := s.fs.StatArchive(stream.Context(), req.GetPath(), req.GetFollowLink()); err != nil {
		return errgrpc.ToGRPC(err)
	}
	bw := bufio.NewWriterSize(chunkSender{stream}, ChunkSize)
	err := s.fs.WriteArchive(stream.Context(), req.GetPath(), bw, ArchiveDownloadOptions{Gzip: req.GetGzip(), FollowLink: req.GetFollowLink()})
	if err == nil {
		err = bw.Flush()
	}
	return errgrpc.ToGRPC(err)
}

// chunkSender sends each write as one DownloadArchiveResponse (Send
// marshals before it returns, so the buffer may be reused).
type chunkSender struct {
	stream agentv1.FileService_DownloadArchiveServer
}

func (c chunkSender) Write(p []byte) (int, error) {
	if err := c.stream.Send(&agentv1.DownloadArchiveResponse{Chunk: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}
