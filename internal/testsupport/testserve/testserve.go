// Package testserve runs a server on a loopback port for the length of a
// test and stops it, checking its error, in t.Cleanup.
package testserve

import (
	"context"
	"net"
	"testing"
	"time"
)

// Serve listens on 127.0.0.1:0, runs serve in a goroutine and returns the
// address. At cleanup it cancels serve's context and waits (at most 20s)
// for it to return, reporting a non-nil error.
func Serve(t testing.TB, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("server did not shut down within 20s")
		}
	})
	return ln.Addr().String()
}
