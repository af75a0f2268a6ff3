package agent_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testserve"
	"github.com/berth-dev/berth/pkg/agent"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

type countingListener struct {
	net.Listener
	read *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, n: l.read}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// An unauthenticated 19 MiB call is refused from its headers: the agent
// does not read the message.
func TestUnauthenticatedBigMessageIsNotRead(t *testing.T) {
	srv, err := agent.New(agent.Config{Token: testToken, WorkDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var read atomic.Int64
	addr := testserve.Serve(t, func(ctx context.Context, ln net.Listener) error {
		return srv.Serve(ctx, countingListener{Listener: ln, read: &read})
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = agentv1.NewProcessServiceClient(conn).Exec(ctx, &agentv1.ExecRequest{Argv: []string{"true", strings.Repeat("x", 19<<20)}})
	time.Sleep(100 * time.Millisecond)
	t.Logf("%v; agent read %d bytes of a %d-byte message", status.Code(err), read.Load(), 19<<20)
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("err = %v, want Unauthenticated", err)
	}
	if read.Load() > 2<<20 {
		t.Fatalf("the agent read %d bytes of an unauthenticated message", read.Load())
	}
	// An authenticated call on the same connection works.
	if _, err := agentv1.NewInfoServiceClient(conn).GetInfo(authed(ctx, testToken), &agentv1.GetInfoRequest{}); err != nil {
		t.Fatal(err)
	}
}
