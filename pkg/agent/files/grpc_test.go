package files

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/iotest"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// startGRPC serves a FileService over fsys on a real loopback listener and
// returns a client for it.
func startGRPC(t testing.TB, fsys *FS) agentv1.FileServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ForceServerCodecV2(NewCodec())) // as the agent's
	agentv1.RegisterFileServiceServer(gs, NewServer(fsys))
	go gs.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
	})
	return agentv1.NewFileServiceClient(conn)
}

// grpcUpload uploads r under hdr in ChunkSize chunks.
func grpcUpload(ctx context.Context, c agentv1.FileServiceClient, hdr *agentv1.UploadHeader, r io.Reader) (*agentv1.UploadResponse, error) {
	st, err := c.Upload(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: hdr}}); err != nil {
		return st.CloseAndRecv()
	}
	buf := make([]byte, ChunkSize)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: buf[:n]}}); err != nil {
				return st.CloseAndRecv() // the server's status
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return nil, rerr
		}
	}
	return st.CloseAndRecv()
}

// grpcDownload writes the download's data to w and returns the info.
func grpcDownload(ctx context.Context, c agentv1.FileServiceClient, req *agentv1.DownloadRequest, w io.Writer) (*agentv1.FileInfo, int, error) {
	st, err := c.Download(ctx, req)
	if err != nil {
		return nil, 0, err
	}
	first, err := st.Recv()
	if err != nil {
		return nil, 0, err
	}
	if first.GetInfo() == nil || len(first.GetChunk()) != 0 {
		return nil, 0, errors.New("first message must carry only the info")
	}
	msgs := 0
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return first.GetInfo(), msgs, nil
		}
		if err != nil {
			return first.GetInfo(), msgs, err
		}
		if m.GetInfo() != nil {
			return nil, 0, errors.New("info sent twice")
		}
		msgs++
		if len(m.GetChunk()) > ChunkSize {
			return nil, 0, errors.New("chunk larger than ChunkSize")
		}
		if _, err := w.Write(m.GetChunk()); err != nil {
			return nil, 0, err
		}
	}
}

func wantCode(t testing.TB, err error, code codes.Code, parts ...string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("want %v, got %v", code, err)
	}
	for _, p := range parts {
		if !bytes.Contains([]byte(st.Message()), []byte(p)) {
			t.Fatalf("message %q does not mention %q", st.Message(), p)
		}
	}
}

func TestGRPCUploadDownloadLarge(t *testing.T) {
	dir := t.TempDir()
	c := startGRPC(t, newTestFS(t, Config{}))
	ctx := context.Background()
	size := bigSize()
	want := prngSum(t, 2, size)
	p := filepath.Join(dir, "big.bin")

	start := time.Now()
	res, err := grpcUpload(ctx, c, &agentv1.UploadHeader{Path: p, Mode: 0o600}, prng(2, size))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gRPC upload of %d MiB: %v", size>>20, time.Since(start))
	if res.GetSize() != size || res.GetSha256() != want || res.GetPath() != p {
		t.Fatalf("response %v, want size %d sha256 %s", res, size, want)
	}

	start = time.Now()
	h := sha256.New()
	info, msgs, err := grpcDownload(ctx, c, &agentv1.DownloadRequest{Path: p}, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gRPC download of %d MiB: %v in %d messages", size>>20, time.Since(start), msgs)
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		t.Fatalf("download sha256 %s, want %s", got, want)
	}
	if info.GetSize() != size || info.GetMode() != 0o600 || info.GetType() != agentv1.FileType_FILE_TYPE_FILE || info.GetName() != "big.bin" {
		t.Fatalf("info %v", info)
	}
	if msgs != int((size+ChunkSize-1)/ChunkSize) {
		t.Fatalf("%d chunk messages", msgs)
	}
}

// TestGRPCUploadNoDigest: with UploadHeader.no_digest the file is written
// whole and the response carries no SHA-256.
func TestGRPCUploadNoDigest(t *testing.T) {
	dir := t.TempDir()
	c := startGRPC(t, newTestFS(t, Config{}))
	ctx := context.Background()
	const size = 3*ChunkSize + 7
	want := prngSum(t, 5, size)
	p := filepath.Join(dir, "nodigest.bin")
	res, err := grpcUpload(ctx, c, &agentv1.UploadHeader{Path: p, NoDigest: true}, prng(5, size))
	if err != nil {
		t.Fatal(err)
	}
	if res.GetSize() != size || res.GetSha256() != "" || res.GetPath() != p {
		t.Fatalf("response %v, want size %d and no sha256", res, size)
	}
	h := sha256.New()
	if _, _, err := grpcDownload(ctx, c, &agentv1.DownloadRequest{Path: p}, h); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		t.Fatalf("file sha256 %s, want %s", got, want)
	}
}

func TestGRPCUploadClientCancelsMidStream(t *testing.T) {
	dir := t.TempDir()
	c := startGRPC(t, newTestFS(t, Config{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.Upload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "partial.bin")
	if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: p}}}); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{7}, ChunkSize)
	for range 8 {
		if err := st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: chunk}}); err != nil {
			t.Fatal(err)
		}
	}
	waitTemp(t, dir) // the server is writing
	cancel()
	_, err = st.CloseAndRecv()
	wantCode(t, err, codes.Canceled)
	waitEmpty(t, dir)
	if exists(p) {
		t.Fatal("cancelled upload created the file")
	}
}

func TestGRPCUploadProtocolErrors(t *testing.T) {
	dir := t.TempDir()
	c := startGRPC(t, newTestFS(t, Config{}))
	ctx := context.Background()

	// Empty stream.
	st, _ := c.Upload(ctx)
	_, err := st.CloseAndRecv()
	wantCode(t, err, codes.InvalidArgument, "header")

	// Chunk before header.
	st, _ = c.Upload(ctx)
	_ = st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: []byte("x")}})
	_, err = st.CloseAndRecv()
	wantCode(t, err, codes.InvalidArgument, "header")

	// Header twice: the upload fails and nothing is left.
	p := filepath.Join(dir, "twice")
	st, _ = c.Upload(ctx)
	hdr := &agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{Path: p}}}
	_ = st.Send(hdr)
	_ = st.Send(&agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: []byte("x")}})
	_ = st.Send(hdr)
	_, err = st.CloseAndRecv()
	wantCode(t, err, codes.InvalidArgument, "header")

	// Bad header fields name the field.
	_, err = grpcUpload(ctx, c, &agentv1.UploadHeader{Path: "relative"}, bytes.NewReader(nil))
	wantCode(t, err, codes.InvalidArgument, "path")
	_, err = grpcUpload(ctx, c, &agentv1.UploadHeader{Path: p, Mode: 0o10644}, bytes.NewReader(nil))
	wantCode(t, err, codes.InvalidArgument, "mode")
	_, err = grpcUpload(ctx, c, &agentv1.UploadHeader{Path: p, Overwrite: 9}, bytes.NewReader(nil))
	wantCode(t, err, codes.InvalidArgument, "overwrite")
	waitEmpty(t, dir)

	// Overwrite FAIL, and parents.
	if _, err := grpcUpload(ctx, c, &agentv1.UploadHeader{Path: p, Overwrite: agentv1.OverwritePolicy_OVERWRITE_POLICY_FAIL}, bytes.NewReader([]byte("one"))); err != nil {
		t.Fatal(err)
	}
	_, err = grpcUpload(ctx, c, &agentv1.UploadHeader{Path: p, Overwrite: agentv1.OverwritePolicy_OVERWRITE_POLICY_FAIL}, bytes.NewReader([]byte("two")))
	wantCode(t, err, codes.AlreadyExists, p)
	if !errdefs.IsAlreadyExists(errgrpc.FromGRPC(err)) {
		t.Fatal("FromGRPC lost the category")
	}
	if readFile(t, p) != "one" {
		t.Fatal("overwrite=fail replaced the file")
	}
	_, err = grpcUpload(ctx, c, &agentv1.UploadHeader{Path: filepath.Join(dir, "a", "b"), NoCreateParents: true}, bytes.NewReader(nil))
	wantCode(t, err, codes.NotFound, filepath.Join(dir, "a"))
	_, err = grpcUpload(ctx, c, &agentv1.UploadHeader{Path: filepath.Join(dir, "a", "b"), NoCreateParents: true, CreateParents: true}, bytes.NewReader(nil))
	wantCode(t, err, codes.InvalidArgument, "no_create_parents")
	if _, err := grpcUpload(ctx, c, &agentv1.UploadHeader{Path: filepath.Join(dir, "d", "e", "f")}, bytes.NewReader([]byte("f"))); err != nil || readFile(t, filepath.Join(dir, "d", "e", "f")) != "f" {
		t.Fatalf("missing parents are created by default: %v", err)
	}
	res, err := grpcUpload(ctx, c, &agentv1.UploadHeader{Path: filepath.Join(dir, "a", "b"), CreateParents: true, Mode: 0o4711}, bytes.NewReader(nil))
	if err != nil || res.GetSize() != 0 || res.GetSha256() != sumBytes(nil) {
		t.Fatalf("empty upload: %v %v", res, err)
	}
	info, err := c.Stat(ctx, &agentv1.StatRequest{Path: filepath.Join(dir, "a", "b")})
	if err != nil || info.GetMode() != 0o4711 {
		t.Fatalf("stat %v %v", info, err)
	}
}

func TestGRPCDownload(t *testing.T) {
	dir := t.TempDir()
	c := startGRPC(t, newTestFS(t, Config{}))
	ctx := context.Background()
	p := filepath.Join(dir, "digits")
	writeFile(t, p, "0123456789")

	var b bytes.Buffer
	info, msgs, err := grpcDownload(ctx, c, &agentv1.DownloadRequest{Path: p, Offset: 2, Length: 5}, &b)
	if err != nil || b.String() != "23456" || info.GetSize() != 10 || msgs != 1 {
		t.Fatalf("got %q %v %d %v", b.String(), info, msgs, err)
	}
	b.Reset()
	_, msgs, err = grpcDownload(ctx, c, &agentv1.DownloadRequest{Path: p, Offset: 10}, &b)
	if err != nil || b.Len() != 0 || msgs != 0 {
		t.Fatalf("empty range: %q %d %v", b.String(), msgs, err)
	}
	_, _, err = grpcDownload(ctx, c, &agentv1.DownloadRequest{Path: p, Offset: 11}, &b)
	wantCode(t, err, codes.InvalidArgument, "offset")
	_, _, err = grpcDownload(ctx, c, &agentv1.DownloadRequest{Path: p, Length: -1}, &b)
	wantCode(t, err, codes.InvalidArgument, "length")
	_, _, err = grpcDownload(ctx, c, &agentv1.DownloadRequest{Path: filepath.Join(dir, "nope")}, &b)
	wantCode(t, err, codes.NotFound)
	_, _, err = grpcDownload(ctx, c, &agentv1.DownloadRequest{Path: dir}, &b)
	wantCode(t, err, codes.FailedPrecondition, "directory")
}

func TestGRPCUnary(t *testing.T) {
	dir := t.TempDir()
	c := startGRPC(t, newTestFS(t, Config{}))
	ctx := context.Background()

	if _, err := c.MakeDir(ctx, &agentv1.MakeDirRequest{Path: filepath.Join(dir, "d", "e"), Parents: true, Mode: 0o1777}); err != nil {
		t.Fatal(err)
	}
	_, err := c.MakeDir(ctx, &agentv1.MakeDirRequest{Path: filepath.Join(dir, "d")})
	wantCode(t, err, codes.AlreadyExists)
	_, err = c.MakeDir(ctx, &agentv1.MakeDirRequest{Path: filepath.Join(dir, "x"), Mode: 0o20000})
	wantCode(t, err, codes.InvalidArgument, "mode")
	writeFile(t, filepath.Join(dir, "d", "f"), "hi")
	if err := os.Symlink("f", filepath.Join(dir, "d", "l")); err != nil {
		t.Fatal(err)
	}

	info, err := c.Stat(ctx, &agentv1.StatRequest{Path: filepath.Join(dir, "d", "e")})
	if err != nil || info.GetType() != agentv1.FileType_FILE_TYPE_DIRECTORY || info.GetMode() != 0o1777 || info.GetModifiedAt().AsTime().IsZero() {
		t.Fatalf("stat dir %v %v", info, err)
	}
	info, err = c.Stat(ctx, &agentv1.StatRequest{Path: filepath.Join(dir, "d", "l")})
	if err != nil || info.GetType() != agentv1.FileType_FILE_TYPE_SYMLINK || info.GetSymlinkTarget() != "f" {
		t.Fatalf("stat link %v %v", info, err)
	}
	_, err = c.Stat(ctx, &agentv1.StatRequest{Path: "rel"})
	wantCode(t, err, codes.InvalidArgument, "path")

	list, err := c.List(ctx, &agentv1.ListRequest{Path: dir, Depth: 2})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range list.GetEntries() {
		names = append(names, e.GetName())
	}
	if want := []string{"d", "e", "f", "l"}; !slices.Equal(names, want) || list.GetTruncated() {
		t.Fatalf("list %v, want %v", names, want)
	}
	_, err = c.List(ctx, &agentv1.ListRequest{Path: dir, Depth: -1})
	wantCode(t, err, codes.InvalidArgument, "depth")

	_, err = c.Move(ctx, &agentv1.MoveRequest{Source: filepath.Join(dir, "d", "f"), Destination: filepath.Join(dir, "d", "l")})
	wantCode(t, err, codes.AlreadyExists)
	if _, err := c.Move(ctx, &agentv1.MoveRequest{Source: filepath.Join(dir, "d", "f"), Destination: filepath.Join(dir, "d", "l"), Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Move(ctx, &agentv1.MoveRequest{Source: filepath.Join(dir, "d", "f"), Destination: filepath.Join(dir, "g")})
	wantCode(t, err, codes.NotFound)
	_, err = c.Move(ctx, &agentv1.MoveRequest{Source: "", Destination: filepath.Join(dir, "g")})
	wantCode(t, err, codes.InvalidArgument, "source")

	_, err = c.Remove(ctx, &agentv1.RemoveRequest{Path: filepath.Join(dir, "d")})
	wantCode(t, err, codes.FailedPrecondition, "not empty")
	if _, err := c.Remove(ctx, &agentv1.RemoveRequest{Path: filepath.Join(dir, "d"), Recursive: true}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Remove(ctx, &agentv1.RemoveRequest{Path: filepath.Join(dir, "d")})
	wantCode(t, err, codes.NotFound)
	_, err = c.Remove(ctx, &agentv1.RemoveRequest{Path: "/", Recursive: true})
	wantCode(t, err, codes.InvalidArgument)
}

// fakeUploadStream replays messages as the server side of an upload.
type fakeUploadStream struct {
	agentv1.FileService_UploadServer
	msgs []*agentv1.UploadRequest
}

func (f *fakeUploadStream) Recv() (*agentv1.UploadRequest, error) {
	if len(f.msgs) == 0 {
		return nil, io.EOF
	}
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	return m, nil
}

func TestUploadStreamReader(t *testing.T) {
	var msgs []*agentv1.UploadRequest
	var want []byte
	for i := range 50 {
		c := bytes.Repeat([]byte{byte(i)}, i*7) // includes an empty chunk
		want = append(want, c...)
		msgs = append(msgs, &agentv1.UploadRequest{Msg: &agentv1.UploadRequest_Chunk{Chunk: c}})
	}
	if err := iotest.TestReader(fileUploadStream(&fakeUploadStream{msgs: msgs}), want); err != nil {
		t.Fatal(err)
	}
	// WriteTo after a partial Read delivers the rest.
	u := fileUploadStream(&fakeUploadStream{msgs: msgs})
	head := make([]byte, 10)
	if _, err := io.ReadFull(u, head); err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	if _, err := u.WriteTo(&rest); err != nil || !bytes.Equal(append(head, rest.Bytes()...), want) {
		t.Fatalf("WriteTo after Read: %v", err)
	}
	// A second header is an error from both.
	bad := []*agentv1.UploadRequest{msgs[3], {Msg: &agentv1.UploadRequest_Header{Header: &agentv1.UploadHeader{}}}}
	if _, err := io.ReadAll(fileUploadStream(&fakeUploadStream{msgs: bad})); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Read: %v", err)
	}
	if _, err := (fileUploadStream(&fakeUploadStream{msgs: bad})).WriteTo(io.Discard); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("WriteTo: %v", err)
	}
}

func TestModeConversion(t *testing.T) {
	for _, u := range []uint32{0, 0o644, 0o755, 0o4755, 0o2755, 0o1777, 0o7777} {
		m, err := modeFromUnix("mode", u)
		if err != nil || ModeToUnix(m) != u {
			t.Errorf("%#o: %v %v -> %#o", u, m, err, ModeToUnix(m))
		}
	}
	if _, err := modeFromUnix("mode", 0o10000); !errdefs.IsInvalidArgument(err) {
		t.Error("0o10000 accepted")
	}
}
