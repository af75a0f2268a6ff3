package cli

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
)

// Every error line names its category in words, never a gRPC code's Go
// name ("Unknown", "code = Unavailable").
func TestPrintErrorWords(t *testing.T) {
	local := func(op string, errno syscall.Errno) error {
		return fmt.Errorf("read local file: %w", &fs.PathError{Op: op, Path: "./src", Err: errno})
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{local("read", syscall.EISDIR), "orchestrator: read local file: read ./src: is a directory (failed precondition)\n"},
		{local("open", syscall.ENOENT), "orchestrator: read local file: open ./src: no such file or directory (not found)\n"},
		{local("open", syscall.EACCES), "orchestrator: read local file: open ./src: permission denied (permission denied)\n"},
		{local("write", syscall.ENOSPC), "orchestrator: read local file: write ./src: no space left on device (resource exhausted)\n"},
		{local("open", syscall.EEXIST), "orchestrator: read local file: open ./src: file exists (already exists)\n"},
		{errgrpc.ToGRPC(errdefs.NotFound("lease x")), "orchestrator: lease x (not found)\n"},
		{status.Error(codes.Unknown, "something odd"), "orchestrator: something odd\n"},
		{fmt.Errorf("connection to session t-1 lost: %w; re-attach", status.Error(codes.Unavailable, "EOF")),
			"orchestrator: connection to session t-1 lost: EOF; re-attach (unavailable)\n"},
		{status.Error(codes.Unimplemented, "no such method"), "orchestrator: no such method (not implemented)\n"},
	} {
		var b bytes.Buffer
		printError(&b, c.err)
		if b.String() != c.want {
			t.Errorf("printError(%v):\n got %q\nwant %q", c.err, b.String(), c.want)
		}
		if strings.Contains(b.String(), "Unknown") || strings.Contains(b.String(), "code =") {
			t.Errorf("printError(%v) names a code: %q", c.err, b.String())
		}
	}
}
