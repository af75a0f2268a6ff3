// Package memlisten is an in-process listener whose connections are Unix
// socket pairs: real, kernel-buffered sockets that never touch the network.
// The agent's REST gateway dials its own gRPC server through one.
package memlisten

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
)

// Listener hands out the server ends of socket pairs made by Dial.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// New returns an open Listener.
func New() *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept waits for the next Dial.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops the listener; pending and later Dials fail.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr returns a placeholder address.
func (l *Listener) Addr() net.Addr { return addr{} }

// Dial returns the client end of a new socket pair whose server end is
// delivered to Accept.
func (l *Listener) Dial(ctx context.Context, _ string) (net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("memlisten: socketpair: %w", err)
	}
	client, err := fileConn(fds[0], "client")
	if err != nil {
		syscall.Close(fds[1])
		return nil, err
	}
	server, err := fileConn(fds[1], "server")
	if err != nil {
		client.Close()
		return nil, err
	}
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, net.ErrClosed
}

func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "memlisten-"+name)
	defer f.Close() // FileConn dups the descriptor
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("memlisten: %s conn: %w", name, err)
	}
	return c, nil
}

type addr struct{}

func (addr) Network() string { return "memlisten" }
func (addr) String() string  { return "memlisten" }
