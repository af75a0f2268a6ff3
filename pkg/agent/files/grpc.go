package files

import (
	"context"
	"errors"
	"io"
	"io/fs"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Server is the gRPC FileService: a thin adapter that converts messages and
// hands the work to an FS. Register it with agentv1.RegisterFileServiceServer.
type Server struct {
	agentv1.UnimplementedFileServiceServer
	fs *FS
}

// NewServer returns a FileService backed by fsys.
func NewServer(fsys *FS) *Server { return &Server{fs: fsys} }

// Upload reads the header, then streams the chunks into FS.Upload. Missing
// parent directories are created unless the header sets no_create_parents
// (then a missing parent is NOT_FOUND). A stream that breaks (the client
// cancels, the connection drops) fails the upload and leaves nothing behind.
func (s *Server) Upload(stream agentv1.FileService_UploadServer) error {
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return errgrpc.ToGRPC(errdefs.InvalidArgument("header", "the stream is empty; the first message must be the upload header"))
	}
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return errgrpc.ToGRPC(errdefs.InvalidArgument("header", "the first message must be the upload header"))
	}
	mode, err := modeFromUnix("header.mode", h.GetMode())
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	// Missing parents are created unless the header opts out;
	// create_parents is accepted for compatibility.
	if h.GetNoCreateParents() && h.GetCreateParents() {
		return errgrpc.ToGRPC(errdefs.InvalidArgument("header.no_create_parents", "contradicts create_parents; set at most one"))
	}
	opts := UploadOptions{Path: h.GetPath(), Mode: mode, CreateParents: !h.GetNoCreateParents(), NoDigest: h.GetNoDigest()}
	switch h.GetOverwrite() {
	case agentv1.OverwritePolicy_OVERWRITE_POLICY_UNSPECIFIED, agentv1.OverwritePolicy_OVERWRITE_POLICY_REPLACE:
		opts.Overwrite = OverwriteReplace
	case agentv1.OverwritePolicy_OVERWRITE_POLICY_FAIL:
		opts.Overwrite = OverwriteFail
	default:
		return errgrpc.ToGRPC(errdefs.InvalidArgument("header.overwrite", "unknown policy %d", h.GetOverwrite()))
	}
	res, err := s.fs.Upload(stream.Context(), opts, fileUploadStream(stream))
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	return stream.SendAndClose(&agentv1.UploadResponse{Path: res.Path, Size: res.Size, Sha256: res.SHA256})
}

// fileUploadStream reads the chunks of an Upload stream.
func fileUploadStream(stream interface {
	Recv() (*agentv1.UploadRequest, error)
}) *uploadStream {
	return &uploadStream{recv: func() ([]byte, bool, error) {
		msg, err := stream.Recv()
		return msg.GetChunk(), msg.GetHeader() != nil, err
	}}
}

// uploadStream reads the chunks of an upload stream (Upload,
// UploadArchive) as an io.Reader (and, without copying, as an io.WriterTo
// and a chunkSource: every chunk is a message's own, which nothing else
// writes to).
type uploadStream struct {
	// recv returns the next message's chunk and whether it was a header.
	recv    func() (chunk []byte, header bool, err error)
	pending []byte
}

func (u *uploadStream) next() ([]byte, error) {
	for {
		c, header, err := u.recv()
		if err != nil {
			return nil, err // io.EOF at the end
		}
		if header {
			return nil, errdefs.InvalidArgument("header", "sent more than once")
		}
		if len(c) > 0 {
			return c, nil
		}
	}
}

// nextChunk returns what is left of the chunk Read was in, else the next.
func (u *uploadStream) nextChunk() ([]byte, error) {
	if c := u.pending; len(c) > 0 {
		u.pending = nil
		return c, nil
	}
	return u.next()
}

func (u *uploadStream) Read(p []byte) (int, error) {
	if len(u.pending) == 0 {
		c, err := u.next()
		if err != nil {
			return 0, err
		}
		u.pending = c
	}
	n := copy(p, u.pending)
	u.pending = u.pending[n:]
	return n, nil
}

func (u *uploadStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		c := u.pending
		u.pending = nil
		if len(c) == 0 {
			var err error
			if c, err = u.next(); err != nil {
				if errors.Is(err, io.EOF) {
					return total, nil
				}
				return total, err
			}
		}
		n, err := w.Write(c)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
}

// Download sends the file's info in a first message of its own, then the
// data in chunks of up to ChunkSize bytes. An empty range sends only the
// info.
func (s *Server) Download(req *agentv1.DownloadRequest, stream agentv1.FileService_DownloadServer) error {
	rd, err := s.fs.Open(stream.Context(), req.GetPath(), req.GetOffset(), req.GetLength())
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	defer rd.Close()
	if err := stream.Send(&agentv1.DownloadResponse{Info: toProtoInfo(rd.Info)}); err != nil {
		return err
	}
	bufp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bufp)
	buf := *bufp
	msg := &agentv1.DownloadResponse{}
	for {
		n, rerr := fill(rd, buf)
		if n > 0 {
			// Send marshals the message before it returns, so the buffer
			// can be reused for the next chunk.
			msg.Chunk = buf[:n]
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return errgrpc.ToGRPC(rerr)
		}
	}
}

// fill reads into buf until it is full or r fails; at the end it returns io.EOF.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Stat describes one path (symlinks are not followed).
func (s *Server) Stat(ctx context.Context, req *agentv1.StatRequest) (*agentv1.FileInfo, error) {
	info, err := s.fs.Stat(ctx, req.GetPath())
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return toProtoInfo(info), nil
}

// List lists a directory down to depth levels.
func (s *Server) List(ctx context.Context, req *agentv1.ListRequest) (*agentv1.ListResponse, error) {
	res, err := s.fs.List(ctx, req.GetPath(), int(req.GetDepth()))
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	out := &agentv1.ListResponse{Entries: make([]*agentv1.FileInfo, len(res.Entries)), Truncated: res.Truncated}
	for i, e := range res.Entries {
		out.Entries[i] = toProtoInfo(e)
	}
	return out, nil
}

// MakeDir creates a directory.
func (s *Server) MakeDir(ctx context.Context, req *agentv1.MakeDirRequest) (*agentv1.MakeDirResponse, error) {
	mode, err := modeFromUnix("mode", req.GetMode())
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if err := s.fs.MakeDir(ctx, req.GetPath(), req.GetParents(), mode); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.MakeDirResponse{}, nil
}

// Move renames a file or directory.
func (s *Server) Move(ctx context.Context, req *agentv1.MoveRequest) (*agentv1.MoveResponse, error) {
	if err := s.fs.Move(ctx, req.GetSource(), req.GetDestination(), req.GetOverwrite()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.MoveResponse{}, nil
}

// Remove deletes a file, or a directory (recursively when asked).
func (s *Server) Remove(ctx context.Context, req *agentv1.RemoveRequest) (*agentv1.RemoveResponse, error) {
	if err := s.fs.Remove(ctx, req.GetPath(), req.GetRecursive()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &agentv1.RemoveResponse{}, nil
}

func toProtoInfo(i FileInfo) *agentv1.FileInfo {
	return &agentv1.FileInfo{
		Path:          i.Path,
		Name:          i.Name,
		Type:          agentv1.FileType(i.Type), // same order as the enum
		Size:          i.Size,
		Mode:          ModeToUnix(i.Mode),
		ModifiedAt:    timestamppb.New(i.ModTime),
		SymlinkTarget: i.SymlinkTarget,
	}
}

// ModeToUnix converts the permission, setuid, setgid and sticky bits of m
// to their Unix values (0o4000, 0o2000, 0o1000), as the API carries them.
func ModeToUnix(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// modeFromUnix is the inverse of ModeToUnix; bits above 0o7777 are
// InvalidArgument(field).
func modeFromUnix(field string, u uint32) (fs.FileMode, error) {
	if u&^0o7777 != 0 {
		return 0, errdefs.InvalidArgument(field, "%#o has bits outside 07777", u)
	}
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
	return m, nil
}
