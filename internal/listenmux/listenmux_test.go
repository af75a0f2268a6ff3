package listenmux

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestRoutesByPreface(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(ln)
	go m.Serve()
	t.Cleanup(func() { m.Close() })

	got := make(chan string, 2)
	serve := func(name string, l net.Listener) {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b := make([]byte, 64)
			n, _ := io.ReadAtLeast(c, b, 3)
			got <- name + ":" + string(b[:n])
			c.Close()
		}
	}
	go serve("h2", m.HTTP2())
	go serve("h1", m.HTTP1())

	cases := []struct{ send, want string }{
		{string(preface) + "xyz", "h2:" + string(preface) + "xyz"},
		{"GET / HTTP/1.1\r\n\r\n", "h1:GET / HTTP/1.1\r\n\r\n"},
		{"PRI x", "h1:PRI x"}, // diverges from the preface early
	}
	for _, tc := range cases {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(tc.send)); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got:
			if !strings.HasPrefix(g, tc.want[:min(len(tc.want), len(g))]) || len(g) < 4 {
				t.Errorf("send %q: got %q, want %q", tc.send, g, tc.want)
			}
			if g[:2] != tc.want[:2] {
				t.Errorf("send %q routed to %s, want %s", tc.send, g[:2], tc.want[:2])
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("send %q: not routed", tc.send)
		}
		c.Close()
	}
}

func TestCloseStopsChildren(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(ln)
	done := make(chan error, 1)
	go func() { done <- m.Serve() }()
	m.Close()
	if _, err := m.HTTP1().Accept(); err == nil {
		t.Fatal("Accept after Close succeeded")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after Close = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
}
