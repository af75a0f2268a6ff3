package envd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/agent/terminal"
	"github.com/berth-dev/berth/proto/e2b/envd/filesystem/filesystemconnect"
	pb "github.com/berth-dev/berth/proto/e2b/envd/process"
	"github.com/berth-dev/berth/proto/e2b/envd/process/processconnect"
)

func TestMain(m *testing.M) {
	// Every test cleans up what it starts: no child may be left.
	os.Exit(testenv.NoChildrenLeft(m.Run(), 3*time.Second))
}

// testEnv is a Service on a real runner and terminal manager behind an
// httptest server, and Connect clients of both codecs.
type testEnv struct {
	url     string
	workDir string
	proc    processconnect.ProcessClient
	procJS  processconnect.ProcessClient
	fs      filesystemconnect.FilesystemClient
	fsJS    filesystemconnect.FilesystemClient
	token   string
}

// codecs names the client options of the binary protobuf and JSON codecs.
var codecs = []struct {
	name string
	opts []connect.ClientOption
}{
	{"proto", nil},
	{"json", []connect.ClientOption{connect.WithProtoJSON()}},
}

func newEnv(t *testing.T, token string) *testEnv {
	t.Helper()
	return newEnvWith(t, token, nil)
}

// newEnvWith is newEnv with cfg adjusted by edit before New.
func newEnvWith(t *testing.T, token string, edit func(*Config)) *testEnv {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	wd := t.TempDir()
	pcfg := process.Config{WorkDir: wd, Logger: log}
	if edit != nil {
		var c Config
		edit(&c)
		pcfg.Users = c.Users
	}
	runner := process.NewRunner(pcfg)
	terms := terminal.New(terminal.Config{Commands: runner, Logger: log})
	cfg := Config{Runner: runner, Terminals: terms, AccessToken: token, WorkDir: wd, Logger: log,
		Environ: func() ([]string, error) { return []string{"PATH=" + os.Getenv("PATH"), "BERTH_ENVD_TEST=yes"}, nil }}
	if edit != nil {
		edit(&cfg)
	}
	svc := New(cfg)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		svc.Close()
		terms.Close()
		runner.Close()
	})
	opts := func(extra []connect.ClientOption) []connect.ClientOption {
		o := append([]connect.ClientOption{}, extra...)
		if token != "" {
			o = append(o, connect.WithInterceptors(headerInterceptor{AccessTokenHeader, token}))
		}
		return o
	}
	hc := srv.Client()
	return &testEnv{
		url: srv.URL, workDir: wd, token: token,
		proc:   processconnect.NewProcessClient(hc, srv.URL, opts(nil)...),
		procJS: processconnect.NewProcessClient(hc, srv.URL, opts(codecs[1].opts)...),
		fs:     filesystemconnect.NewFilesystemClient(hc, srv.URL, opts(nil)...),
		fsJS:   filesystemconnect.NewFilesystemClient(hc, srv.URL, opts(codecs[1].opts)...),
	}
}

// headerInterceptor sets a header on every request.
type headerInterceptor struct{ key, value string }

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set(h.key, h.value)
		return next(ctx, req)
	}
}

func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set(h.key, h.value)
		return conn
	}
}

func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// ctxT is a context that ends with the test or after a minute.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// collect reads a process stream into a channel of events, closed at its
// end; the stream's error is then sent to the second channel.
func collect[T interface{ GetEvent() *pb.ProcessEvent }](s interface {
	Receive() bool
	Msg() T
	Err() error
}) (<-chan *pb.ProcessEvent, <-chan error) {
	ch := make(chan *pb.ProcessEvent, 1024)
	errc := make(chan error, 1)
	go func() {
		defer close(ch)
		for s.Receive() {
			ch <- s.Msg().GetEvent()
		}
		errc <- s.Err()
	}()
	return ch, errc
}

// next returns the next event that is not a keepalive.
func next(t *testing.T, ch <-chan *pb.ProcessEvent) *pb.ProcessEvent {
	t.Helper()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("stream ended early")
			}
			if ev.GetKeepalive() != nil {
				continue
			}
			return ev
		case <-time.After(30 * time.Second):
			t.Fatal("no event within 30s")
		}
	}
}

// untilEnd reads events until the end event, returning stdout, stderr,
// pty output and the end.
func untilEnd(t *testing.T, ch <-chan *pb.ProcessEvent) (stdout, stderr, pty string, end *pb.ProcessEvent_EndEvent) {
	t.Helper()
	for {
		ev := next(t, ch)
		if d := ev.GetData(); d != nil {
			stdout += string(d.GetStdout())
			stderr += string(d.GetStderr())
			pty += string(d.GetPty())
			continue
		}
		if e := ev.GetEnd(); e != nil {
			return stdout, stderr, pty, e
		}
	}
}

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}

func ptr[T any](v T) *T { return &v }

func pidSel(pid uint32) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
}

func httpDo(t *testing.T, e *testEnv, req *http.Request) *http.Response {
	t.Helper()
	if e.token != "" && req.Header.Get(AccessTokenHeader) == "" {
		req.Header.Set(AccessTokenHeader, e.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}
