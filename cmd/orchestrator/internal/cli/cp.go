package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	agentfiles "github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/agent/files/archive"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// cpOptions are the flags of cp.
type cpOptions struct {
	parents bool
}

// newCpCommand is `orchestrator cp SRC DST`.
func newCpCommand(env Env) *cobra.Command {
	sf := &sandboxFlags{}
	o := &cpOptions{}
	cmd := &cobra.Command{
		Use:   "cp [flags] SRC DST",
		Short: "Copy files and directories into or out of a lease's sandbox",
		Long: `Copy a file or a directory tree between this machine and a lease's sandbox,
as docker cp does. Exactly one of SRC and DST is LEASE:/absolute/path; the
other is a local path, or - for stdin (upload) or stdout (download).

Files: a download is written next to DST and renamed into place, so a
failed copy leaves no partial file; DST ending in / or naming an existing
directory receives the file under its own name.

Directories are streamed as a tar archive (no temporary copy of the tree on
either side) and keep modes, symlinks, hard links and modification times
(a symlink SRC is followed, those below it are copied as symlinks);
what is created belongs to the lease's user in the sandbox and to you here.
As with docker cp:
  SRC is a directory, DST does not exist:     DST is created with SRC's contents
  SRC is a directory, DST is a directory:     SRC is copied into it, as DST/NAME
  SRC ends with /. and DST is a directory:    SRC's contents are merged into DST
Files already in DST are replaced, other files in it are kept. A copy that
fails (a broken connection, an entry escaping DST, an absolute symlink or
one pointing outside DST) leaves nothing behind.

With -, a directory travels as a tar stream: "cp - LEASE:DIR" extracts the
tar on stdin into the existing directory DIR (a DIR that is no directory
gets stdin as a file, as before), and "cp LEASE:DIR -" writes DIR as tar to
stdout (a file is written as is).`,
		Example: `  orchestrator cp ./report.txt LEASE:/workspace/report.txt
  orchestrator cp LEASE:/workspace/out/result.json ./result.json
  orchestrator cp ./src LEASE:/workspace/src        # a directory, recursively
  orchestrator cp LEASE:/workspace/build ./build
  orchestrator cp ./src/. LEASE:/workspace          # the contents of src
  tar c . | orchestrator cp - LEASE:/workspace      # a tar stream on stdin
  orchestrator cp LEASE:/workspace - | tar t        # a tar stream on stdout
  orchestrator cp LEASE:/workspace/log.txt - | tail`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usagef("want SRC DST (one side LEASE:/abs/path, the other a local path or -), got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCp(cmd.Context(), env, sf, args[0], args[1], o)
		},
	}
	sf.register(cmd.Flags(), env, true)
	cmd.Flags().BoolVar(&o.parents, "parents", true, "create missing parent directories in the sandbox (--parents=false: refuse a missing parent)")
	// docker cp's -L follows a symlink SRC; here SRC is always followed
	// (as file copies always did), and -a's owners from the archive would
	// break the sandbox's model (what is created is the lease's user's):
	// both are accepted for docker cp's scripts and change nothing.
	cmd.Flags().BoolP("follow-link", "L", false, "accepted for docker cp compatibility: a symlink SRC is always followed (symlinks below it are copied as symlinks)")
	cmd.Flags().BoolP("archive", "a", false, "accepted for docker cp compatibility; owners are always the lease's user in the sandbox and you here")
	return cmd
}

func runCp(ctx context.Context, env Env, sf *sandboxFlags, src, dst string, o *cpOptions) error {
	srcLease, srcPath, srcRemote := splitRemote(src)
	dstLease, dstPath, dstRemote := splitRemote(dst)
	if srcRemote == dstRemote {
		return usagef("exactly one of SRC and DST must be LEASE:/path")
	}
	lease := srcLease
	if dstRemote {
		lease = dstLease
	}
	sc, err := sf.open(ctx, lease)
	if err != nil {
		return err
	}
	defer sc.conn.Close()
	files := agentv1.NewFileServiceClient(sc.conn)
	if dstRemote {
		return fail(copyUp(sc.ctx, env, files, src, dstPath, o))
	}
	return fail(copyDown(sc.ctx, env, files, srcPath, dst, o))
}

// splitRemote splits "LEASE:/path"; local paths (and "-") are not remote.
func splitRemote(s string) (lease, path string, remote bool) {
	l, p, ok := strings.Cut(s, ":")
	if !ok || l == "" || !strings.HasPrefix(p, "/") || strings.ContainsRune(l, '/') {
		return "", s, false
	}
	return l, p, true
}

// remoteStat describes path in the sandbox (lstat); nil when it does not
// exist.
func remoteStat(ctx context.Context, files agentv1.FileServiceClient, p string) (*agentv1.FileInfo, error) {
	fi, err := files.Stat(ctx, &agentv1.StatRequest{Path: p})
	if err != nil {
		if err = errgrpc.FromGRPC(err); errdefs.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return fi, nil
}

// copyUp copies src (a local file or directory, or - for stdin) to dst in
// the sandbox.
func copyUp(ctx context.Context, env Env, files agentv1.FileServiceClient, src, dst string, o *cpOptions) error {
	if src == "-" {
		fi, err := remoteStat(ctx, files, dst)
		if err != nil {
			return err
		}
		if fi.GetType() == agentv1.FileType_FILE_TYPE_DIRECTORY || strings.HasSuffix(dst, "/") {
			return uploadTar(ctx, env, files, stdinOf(env), dst, o.parents)
		}
		return uploadFile(ctx, env, files, src, dst, o.parents)
	}
	lfi, err := os.Stat(src) // a symlink SRC is followed

	if err != nil {
		return err
	}
	if !lfi.IsDir() {
		if strings.HasSuffix(dst, "/") {
			dst += filepath.Base(src)
		}
		err := uploadFile(ctx, env, files, src, dst, o.parents)
		if errdefs.IsFailedPrecondition(err) {
			// DST is a directory: the file goes into it, as docker cp does.
			if fi, serr := remoteStat(ctx, files, dst); serr == nil && fi.GetType() == agentv1.FileType_FILE_TYPE_DIRECTORY {
				return uploadFile(ctx, env, files, src, path.Join(dst, filepath.Base(src)), o.parents)
			}
		}
		return err
	}
	fi, err := remoteStat(ctx, files, dst)
	if err != nil {
		return err
	}
	name := "." // DST is created with SRC's contents
	switch {
	case fi == nil:
	case fi.GetType() != agentv1.FileType_FILE_TYPE_DIRECTORY:
		return errdefs.FailedPrecondition("cannot copy directory %s onto %s: not a directory", src, dst)
	case !isDotSrc(src):
		name = filepath.Base(filepath.Clean(src)) // into DST, as DST/NAME
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(archive.Write(ctx, pw, abs, archive.WriteOptions{Name: name, FollowLink: true}))
	}()
	defer pr.Close()
	return uploadTar(ctx, env, files, pr, dst, o.parents)
}

// isDotSrc reports whether a local or sandbox path ends with "/." (copy
// the directory's contents, not the directory).
func isDotSrc(p string) bool { return p == "." || strings.HasSuffix(p, "/.") }

func stdinOf(env Env) io.Reader {
	if env.Stdin == nil {
		return strings.NewReader("")
	}
	return env.Stdin
}

// uploadFile copies src (a local file, or - for stdin) to path in the
// sandbox and reports the stored size and digest on stderr.
func uploadFile(ctx context.Context, env Env, files agentv1.FileServiceClient, src, path string, parents bool) error {
	r := stdinOf(env)
	if src != "-" {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	st := upStream[agentv1.UploadRequest, agentv1.UploadResponse]{
		open:   files.Upload,
		header: &agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: path, NoCreateParents: !parents}}},
		chunk: func(c []byte) *agentv1.UploadRequest {
			return &agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: c}}
		},
	}
	res, err := st.send(ctx, r)
	if err != nil {
		return errgrpc.FromGRPC(err)
	}
	fmt.Fprintf(env.Stderr, "%s: %d bytes, sha256 %s\n", safe(res.Path), res.Size, res.Sha256)
	return nil
}

// uploadTar extracts the tar stream r into the directory dir in the
// sandbox and reports what it wrote on stderr.
func uploadTar(ctx context.Context, env Env, files agentv1.FileServiceClient, r io.Reader, dir string, parents bool) error {
	st := upStream[agentv1.UploadArchiveRequest, agentv1.UploadArchiveResponse]{
		open: files.UploadArchive,
		header: &agentv1.UploadArchiveRequest{Msg: &agentv1.UploadArchiveRequest_Header{
			Header: &agentv1.UploadArchiveHeader{Path: dir, NoCreateParents: !parents}}},
		chunk: func(c []byte) *agentv1.UploadArchiveRequest {
			return &agentv1.UploadArchiveRequest{Msg: &agentv1.UploadArchiveRequest_Chunk{Chunk: c}}
		},
	}
	res, err := st.send(ctx, r)
	if err != nil {
		return errgrpc.FromGRPC(err)
	}
	fmt.Fprintf(env.Stderr, "%s: %d entries, %d bytes\n", safe(res.Path), res.Entries, res.Bytes)
	return nil
}

// upStream is a client-streaming upload RPC: a header, then chunks.
type upStream[Req, Resp any] struct {
	open   func(context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[Req, Resp], error)
	header *Req
	chunk  func([]byte) *Req
}

// send streams the header and then r in chunks, and returns the answer.
// A failed read cancels the stream, so the agent leaves nothing behind.
func (u upStream[Req, Resp]) send(ctx context.Context, r io.Reader) (*Resp, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := u.open(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(u.header); err != nil {
		return st.CloseAndRecv() // the agent's answer (io.EOF: it answered early)
	}
	buf := make([]byte, 256<<10)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := st.Send(u.chunk(buf[:n])); err != nil {
				return st.CloseAndRecv()
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return nil, fmt.Errorf("read local data: %w", rerr)
		}
	}
	return st.CloseAndRecv()
}

// copyDown copies src from the sandbox to dst (a local path, or - for
// stdout): a file as it is, a directory as a tar stream.
func copyDown(ctx context.Context, env Env, files agentv1.FileServiceClient, src, dst string, o *cpOptions) error {
	fi, err := remoteStat(ctx, files, src)
	if err != nil {
		return err
	}
	if fi == nil {
		return errdefs.NotFound("%s: no such file or directory in the sandbox", src)
	}
	switch fi.GetType() {
	case agentv1.FileType_FILE_TYPE_DIRECTORY:
	case agentv1.FileType_FILE_TYPE_SYMLINK:
		// Followed: a file is downloaded as before; a directory (the
		// download refuses it before writing anything) travels as tar.
		if err := download(ctx, files, src, dst, env); !errdefs.IsFailedPrecondition(err) {
			return err
		}
	default:
		return download(ctx, files, src, dst, env)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := files.DownloadArchive(ctx, &agentv1.DownloadArchiveRequest{Path: src, FollowLink: true})
	if err != nil {
		return errgrpc.FromGRPC(err)
	}
	if dst == "-" {
		return recvChunks(st, env.Stdout)
	}
	abs, err := filepath.Abs(dst)
	if err != nil {
		return err
	}
	// The archive's entries start with SRC's name: stripped when DST is
	// created (or SRC ends with /.), kept when SRC goes into DST.
	strip := 1
	switch lfi, err := os.Stat(abs); {
	case err == nil && !lfi.IsDir():
		return errdefs.FailedPrecondition("cannot copy directory %s onto %s: not a directory", src, dst)
	case err == nil && !isDotSrc(src):
		strip = 0
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := archive.Extract(ctx, abs, pr, archive.ExtractOptions{StripComponents: strip, Parallel: agentfiles.ArchiveWriters})
		pr.CloseWithError(err)
		done <- err
	}()
	rerr := recvChunks(st, pw)
	pw.CloseWithError(rerr)
	if err := <-done; err != nil {
		if rerr != nil {
			return rerr
		}
		return err
	}
	return rerr
}

// recvChunks writes the chunks of an archive download to w.
func recvChunks(st grpc.ServerStreamingClient[agentv1.DownloadArchiveResponse], w io.Writer) error {
	for {
		msg, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errgrpc.FromGRPC(err)
		}
		if _, err := w.Write(msg.GetChunk()); err != nil {
			return err
		}
	}
}

// download copies the file path from the sandbox to dst (a local file, or
// - for stdout; an existing directory receives it under its own name). It
// is written next to dst and renamed, so a failed download leaves no
// partial file.
func download(ctx context.Context, files agentv1.FileServiceClient, path, dst string, env Env) error {
	st, err := files.Download(ctx, &agentv1.DownloadRequest{Path: path})
	if err != nil {
		return errgrpc.FromGRPC(err)
	}
	first, err := st.Recv()
	if err != nil {
		return errgrpc.FromGRPC(err)
	}
	var w io.Writer = env.Stdout
	var tmp *os.File
	if dst != "-" {
		if fi, err := os.Stat(dst); (err == nil && fi.IsDir()) || strings.HasSuffix(dst, "/") {
			dst = filepath.Join(dst, filepath.Base(path))
		}
		tmp, err = os.CreateTemp(dirOf(dst), ".berth-cp-*")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		defer tmp.Close()
		w = tmp
	}
	for msg := first; ; {
		if _, err := w.Write(msg.Chunk); err != nil {
			return err
		}
		msg, err = st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return errgrpc.FromGRPC(err)
		}
	}
	if tmp == nil {
		return nil
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		if i == 0 {
			return "/"
		}
		return p[:i]
	}
	return "."
}
