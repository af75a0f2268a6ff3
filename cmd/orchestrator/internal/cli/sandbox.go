package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/berth-dev/berth/pkg/agent/process"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
)

// sandboxConn is a gRPC connection to the orchestrator whose calls carry
// the lease (x-berth-lease), so the proxy forwards them to that sandbox.
type sandboxConn struct {
	conn *grpc.ClientConn
	ctx  context.Context
}

func openSandbox(ctx context.Context, cf clientFlags, lease string) (*sandboxConn, error) {
	if lease == "" {
		return nil, errors.New("a lease id is required")
	}
	conn, err := dial(cf.addr)
	if err != nil {
		return nil, err
	}
	ctx = withToken(ctx, cf.bearer())
	ctx = metadata.AppendToOutgoingContext(ctx, "x-berth-lease", lease)
	return &sandboxConn{conn: conn, ctx: ctx}, nil
}

// RunExec runs `exec LEASE [--cwd DIR] [--timeout D] -- CMD ARGS...`: it
// streams the command's output to stdout/stderr (stdin is forwarded when
// --stdin is set) and returns the command's exit code.
func RunExec(ctx context.Context, args []string, env Env, stdin io.Reader) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	var cf clientFlags
	cf.register(fs, env)
	cwd := fs.String("cwd", "", "working directory in the sandbox (absolute)")
	timeout := fs.Duration("timeout", 0, "kill the command after this long")
	withStdin := fs.Bool("stdin", false, "send this process's stdin to the command")
	shell := fs.Bool("sh", false, "run the arguments as one shell line (/bin/sh -c)")
	pos, argv, err := parseArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) == 2 && argv == nil {
		// "exec LEASE CMD" without "--" and without arguments to CMD.
		argv = pos[1:]
		pos = pos[:1]
	}
	if len(pos) != 1 {
		fmt.Fprintln(env.Stderr, "usage: orchestrator exec [flags] LEASE -- CMD [ARGS...]")
		return 2
	}
	lease := pos[0]
	if len(argv) == 0 {
		fmt.Fprintln(env.Stderr, "orchestrator exec: no command given")
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	sc, err := openSandbox(ctx, cf, lease)
	if err != nil {
		fmt.Fprintln(env.Stderr, "orchestrator:", err)
		return 2
	}
	defer sc.conn.Close()
	req := &agentv1.ExecRequest{Cwd: *cwd}
	if *shell {
		req.Command = strings.Join(argv, " ")
	} else {
		req.Argv = argv
	}
	if *timeout > 0 {
		req.Timeout = durationpb.New(*timeout)
	}
	if *withStdin && stdin != nil {
		b, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintln(env.Stderr, "orchestrator: read stdin:", err)
			return 2
		}
		req.StdinData = b
	}
	stream, err := agentv1.NewProcessServiceClient(sc.conn).ExecStream(sc.ctx, req)
	if err != nil {
		return fail(env, err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				fmt.Fprintln(env.Stderr, "orchestrator: stream ended without an exit status")
				return 1
			}
			return fail(env, err)
		}
		switch e := ev.Event.(type) {
		case *agentv1.ExecEvent_Stdout:
			_, _ = env.Stdout.Write(e.Stdout)
		case *agentv1.ExecEvent_Stderr:
			_, _ = env.Stderr.Write(e.Stderr)
		case *agentv1.ExecEvent_Exited:
			if e.Exited.TimedOut {
				fmt.Fprintf(env.Stderr, "orchestrator: command timed out after %s\n", *timeout)
			}
			if e.Exited.OomKilled {
				fmt.Fprintln(env.Stderr, "killed: out of memory")
				return 137
			}
			if e.Exited.Signal != "" && e.Exited.ExitCode < 0 {
				return 128 + signalNumber(e.Exited.Signal)
			}
			return int(e.Exited.ExitCode)
		}
	}
}

func signalNumber(name string) int {
	sig, err := process.ParseSignal(name)
	if err != nil {
		return 1
	}
	return int(sig)
}

// RunCp runs `cp SRC DST` where one side is LEASE:/abs/path and the other a
// local path or "-" (stdin/stdout).
func RunCp(ctx context.Context, args []string, env Env, stdin io.Reader) int {
	fs := flag.NewFlagSet("cp", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	var cf clientFlags
	cf.register(fs, env)
	parents := fs.Bool("parents", true, "create missing parent directories in the sandbox (--parents=false: refuse a missing parent)")
	pos, rest, err := parseArgs(fs, args)
	if err != nil {
		return 2
	}
	pos = append(pos, rest...)
	if len(pos) != 2 {
		fmt.Fprintln(env.Stderr, "usage: orchestrator cp [flags] SRC DST   (one side LEASE:/abs/path, the other a local path or -)")
		return 2
	}
	src, dst := pos[0], pos[1]
	srcLease, srcPath, srcRemote := splitRemote(src)
	dstLease, dstPath, dstRemote := splitRemote(dst)
	if srcRemote == dstRemote {
		fmt.Fprintln(env.Stderr, "orchestrator cp: exactly one of SRC and DST must be LEASE:/path")
		return 2
	}
	lease := srcLease
	if dstRemote {
		lease = dstLease
	}
	sc, err := openSandbox(ctx, cf, lease)
	if err != nil {
		fmt.Fprintln(env.Stderr, "orchestrator:", err)
		return 2
	}
	defer sc.conn.Close()
	files := agentv1.NewFileServiceClient(sc.conn)
	if dstRemote {
		var r io.Reader = stdin
		if src != "-" {
			f, err := os.Open(src)
			if err != nil {
				fmt.Fprintln(env.Stderr, "orchestrator:", err)
				return 1
			}
			defer f.Close()
			r = f
		}
		res, err := upload(sc.ctx, files, r, dstPath, *parents)
		if err != nil {
			return fail(env, err)
		}
		fmt.Fprintf(env.Stderr, "%s: %d bytes, sha256 %s\n", res.Path, res.Size, res.Sha256)
		return 0
	}
	return download(sc.ctx, files, srcPath, dst, env)
}

// splitRemote splits "LEASE:/path"; local paths (and "-") are not remote.
func splitRemote(s string) (lease, path string, remote bool) {
	l, p, ok := strings.Cut(s, ":")
	if !ok || l == "" || !strings.HasPrefix(p, "/") || strings.ContainsRune(l, '/') {
		return "", s, false
	}
	return l, p, true
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

func download(ctx context.Context, files agentv1.FileServiceClient, path, dst string, env Env) int {
	st, err := files.Download(ctx, &agentv1.DownloadRequest{Path: path})
	if err != nil {
		return fail(env, err)
	}
	first, err := st.Recv()
	if err != nil {
		return fail(env, err)
	}
	var w io.Writer = env.Stdout
	var tmp *os.File
	if dst != "-" {
		// Write next to the destination and rename, so a failed download
		// leaves no partial file.
		tmp, err = os.CreateTemp(dirOf(dst), ".berth-cp-*")
		if err != nil {
			fmt.Fprintln(env.Stderr, "orchestrator:", err)
			return 1
		}
		defer os.Remove(tmp.Name())
		defer tmp.Close()
		w = tmp
	}
	for msg := first; ; {
		if _, err := w.Write(msg.Chunk); err != nil {
			fmt.Fprintln(env.Stderr, "orchestrator:", err)
			return 1
		}
		msg, err = st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(env, err)
		}
	}
	if tmp != nil {
		if err := tmp.Close(); err != nil {
			fmt.Fprintln(env.Stderr, "orchestrator:", err)
			return 1
		}
		if err := os.Rename(tmp.Name(), dst); err != nil {
			fmt.Fprintln(env.Stderr, "orchestrator:", err)
			return 1
		}
	}
	return 0
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

// RunGit runs `git status|diff LEASE [REPO] [--file F]`.
func RunGit(ctx context.Context, args []string, env Env) int {
	if len(args) == 0 || (args[0] != "status" && args[0] != "diff") {
		fmt.Fprintln(env.Stderr, "usage: orchestrator git status|diff [flags] LEASE [REPO]")
		return 2
	}
	sub := args[0]
	fs := flag.NewFlagSet("git "+sub, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	var cf clientFlags
	cf.register(fs, env)
	file := fs.String("file", "", "diff: one file's original and modified text")
	ref := fs.String("ref", "", "diff: compare with this ref (default HEAD)")
	pos, _, err := parseArgs(fs, args[1:])
	if err != nil {
		return 2
	}
	if len(pos) < 1 || len(pos) > 2 {
		fmt.Fprintln(env.Stderr, "usage: orchestrator git status|diff [flags] LEASE [REPO]")
		return 2
	}
	repo := ""
	if len(pos) == 2 {
		repo = pos[1]
	}
	sc, err := openSandbox(ctx, cf, pos[0])
	if err != nil {
		fmt.Fprintln(env.Stderr, "orchestrator:", err)
		return 2
	}
	defer sc.conn.Close()
	ctx, cancel := context.WithTimeout(sc.ctx, 2*time.Minute)
	defer cancel()
	g := agentv1.NewGitServiceClient(sc.conn)
	if sub == "status" {
		st, err := g.Status(ctx, &agentv1.GitStatusRequest{Repo: repo})
		if err != nil {
			return fail(env, err)
		}
		if cf.output == "json" {
			b, _ := protojson.MarshalOptions{EmitUnpopulated: true, Indent: "  "}.Marshal(st)
			fmt.Fprintln(env.Stdout, string(b))
			return 0
		}
		fmt.Fprintf(env.Stdout, "branch %s (ahead %d, behind %d)\n", safe(st.Branch), st.Ahead, st.Behind)
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		for _, f := range st.Files {
			kind := strings.TrimPrefix(f.Kind.String(), "CHANGE_KIND_")
			if f.OldPath != "" {
				fmt.Fprintf(tw, "%s\t%s -> %s\n", kind, safe(f.OldPath), safe(f.Path))
			} else {
				fmt.Fprintf(tw, "%s\t%s\n", kind, safe(f.Path))
			}
		}
		tw.Flush()
		return 0
	}
	d, err := g.Diff(ctx, &agentv1.GitDiffRequest{Repo: repo, File: *file, Ref: *ref})
	if err != nil {
		return fail(env, err)
	}
	if cf.output == "json" {
		b, _ := protojson.MarshalOptions{EmitUnpopulated: true, Indent: "  "}.Marshal(d)
		fmt.Fprintln(env.Stdout, string(b))
		return 0
	}
	if *file != "" && d.Unified == "" {
		if d.Binary {
			fmt.Fprintf(env.Stdout, "%s: binary file differs\n", safe(d.Path))
			return 0
		}
		fmt.Fprintf(env.Stdout, "--- original %s\n%s\n+++ modified %s\n%s", d.Path, d.Original, d.Path, d.Modified)
		return 0
	}
	fmt.Fprint(env.Stdout, d.Unified)
	return 0
}
