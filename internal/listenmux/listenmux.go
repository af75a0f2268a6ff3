// Package listenmux splits one listener into two by the first bytes of each
// connection: connections that open with the HTTP/2 client preface (gRPC over
// h2c with prior knowledge) go to one listener, everything else (HTTP/1.x,
// i.e. REST and the gateway) to the other. This keeps gRPC on its native,
// fast transport while REST shares the same port.
package listenmux

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// preface is the HTTP/2 client connection preface (RFC 9113 §3.4).
var preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

// SniffTimeout bounds how long a new connection may take to send its first
// bytes before it is closed.
const SniffTimeout = 10 * time.Second

// Mux accepts from a root listener and hands connections to HTTP2 or HTTP1.
type Mux struct {
	root  net.Listener
	h2    *childListener
	h1    *childListener
	once  sync.Once
	done  chan struct{}
	errMu sync.Mutex
	err   error
}

// New returns a Mux over root. Call Serve to start accepting.
func New(root net.Listener) *Mux {
	m := &Mux{root: root, done: make(chan struct{})}
	m.h2 = &childListener{m: m, conns: make(chan net.Conn)}
	m.h1 = &childListener{m: m, conns: make(chan net.Conn)}
	return m
}

// HTTP2 returns the listener of connections that opened with the HTTP/2 preface.
func (m *Mux) HTTP2() net.Listener { return m.h2 }

// HTTP1 returns the listener of all other connections.
func (m *Mux) HTTP1() net.Listener { return m.h1 }

// Serve accepts connections until the root listener fails or Close is
// called. It returns the root listener's error (nil after Close).
func (m *Mux) Serve() error {
	for {
		c, err := m.root.Accept()
		if err != nil {
			select {
			case <-m.done:
				return nil
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			m.setErr(err)
			m.Close()
			return err
		}
		go m.route(c)
	}
}

func (m *Mux) setErr(err error) {
	m.errMu.Lock()
	defer m.errMu.Unlock()
	if m.err == nil {
		m.err = err
	}
}

// Close closes the root listener and both children.
func (m *Mux) Close() error {
	var err error
	m.once.Do(func() {
		close(m.done)
		err = m.root.Close()
	})
	return err
}

func (m *Mux) route(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(SniffTimeout))
	buf := make([]byte, 0, len(preface))
	isH2 := true
	for len(buf) < len(preface) {
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if !bytes.HasPrefix(preface, buf) {
			isH2 = false
			break
		}
		if err != nil {
			if len(buf) == 0 || !errors.Is(err, io.EOF) {
				c.Close()
				return
			}
			isH2 = false
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	pc := &prefixConn{Conn: c, prefix: buf}
	target := m.h1
	if isH2 {
		target = m.h2
	}
	select {
	case target.conns <- pc:
	case <-m.done:
		c.Close()
	}
}

type childListener struct {
	m     *Mux
	conns chan net.Conn
}

func (l *childListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.m.done:
		return nil, net.ErrClosed
	}
}

func (l *childListener) Close() error   { return l.m.Close() }
func (l *childListener) Addr() net.Addr { return l.m.root.Addr() }

// prefixConn replays the sniffed bytes before reading from the connection.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
