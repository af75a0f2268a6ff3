package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// newCpCommand is `orchestrator cp SRC DST`.
func newCpCommand(env Env) *cobra.Command {
	sf := &sandboxFlags{}
	var parents bool
	cmd := &cobra.Command{
		Use:   "cp [flags] SRC DST",
		Short: "Copy a file into or out of a lease's sandbox",
		Long: `Copy a file between this machine and a lease's sandbox. Exactly one of SRC
and DST is LEASE:/absolute/path; the other is a local path, or - for stdin
(upload) or stdout (download). A download is written next to DST and renamed
into place, so a failed copy leaves no partial file.`,
		Example: `  orchestrator cp ./report.txt LEASE:/workspace/report.txt
  orchestrator cp LEASE:/workspace/out/result.json ./result.json
  tar c . | orchestrator cp - LEASE:/workspace/src.tar
  orchestrator cp LEASE:/workspace/log.txt - | tail`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usagef("want SRC DST (one side LEASE:/abs/path, the other a local path or -), got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCp(cmd.Context(), env, sf, args[0], args[1], parents)
		},
	}
	sf.register(cmd.Flags(), env, true)
	cmd.Flags().BoolVar(&parents, "parents", true, "create missing parent directories in the sandbox (--parents=false: refuse a missing parent)")
	return cmd
}

func runCp(ctx context.Context, env Env, sf *sandboxFlags, src, dst string, parents bool) error {
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
		return fail(uploadFile(sc.ctx, env, files, src, dstPath, parents))
	}
	return fail(download(sc.ctx, files, srcPath, dst, env))
}

// splitRemote splits "LEASE:/path"; local paths (and "-") are not remote.
func splitRemote(s string) (lease, path string, remote bool) {
	l, p, ok := strings.Cut(s, ":")
	if !ok || l == "" || !strings.HasPrefix(p, "/") || strings.ContainsRune(l, '/') {
		return "", s, false
	}
	return l, p, true
}

// uploadFile copies src (a local file, or - for stdin) to path in the
// sandbox and reports the stored size and digest on stderr.
func uploadFile(ctx context.Context, env Env, files agentv1.FileServiceClient, src, path string, parents bool) error {
	r := env.Stdin
	if src != "-" {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	if r == nil {
		r = strings.NewReader("")
	}
	res, err := upload(ctx, files, r, path, parents)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "%s: %d bytes, sha256 %s\n", safe(res.Path), res.Size, res.Sha256)
	return nil
}

func upload(ctx context.Context, files agentv1.FileServiceClient, r io.Reader, path string, parents bool) (*agentv1.UploadResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a failed read cancels the stream, so nothing is left behind
	st, err := files.Upload(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: path, NoCreateParents: !parents}}}); err != nil {
		_, err = st.CloseAndRecv()
		return nil, err
	}
	buf := make([]byte, 256<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: buf[:n]}}); err != nil {
				_, err = st.CloseAndRecv()
				return nil, err
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return nil, fmt.Errorf("read local file: %w", rerr)
		}
	}
	return st.CloseAndRecv()
}

// download copies path from the sandbox to dst (a local file, or - for
// stdout). A file is written next to dst and renamed, so a failed download
// leaves no partial file.
func download(ctx context.Context, files agentv1.FileServiceClient, path, dst string, env Env) error {
	st, err := files.Download(ctx, &agentv1.DownloadRequest{Path: path})
	if err != nil {
		return err
	}
	first, err := st.Recv()
	if err != nil {
		return err
	}
	var w io.Writer = env.Stdout
	var tmp *os.File
	if dst != "-" {
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
			return err
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
