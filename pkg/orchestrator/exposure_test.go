package orchestrator_test

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

func TestWarnExposure(t *testing.T) {
	for _, tc := range []struct {
		addr string
		warn bool
	}{
		{"127.0.0.1:7070", false},
		{"[::1]:7070", false},
		{"0.0.0.0:7070", true},
		{"[::]:7070", true},
		{"192.0.2.2:7070", true},
	} {
		a, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		orchestrator.WarnExposure(slog.New(slog.NewTextHandler(&buf, nil)), a)
		if got := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "without TLS"); got != tc.warn {
			t.Errorf("%s: warned %v, want %v (%s)", tc.addr, got, tc.warn, buf.String())
		}
	}
}
