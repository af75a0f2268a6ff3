package memlisten

import (
	"context"
	"io"
	"testing"
)

func TestDialAccept(t *testing.T) {
	l := New()
	defer l.Close()
	done := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		done <- string(b)
	}()
	c, err := l.Dial(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := <-done; got != "hello" {
		t.Fatalf("server read %q, want hello", got)
	}
	l.Close()
	if _, err := l.Dial(context.Background(), ""); err == nil {
		t.Fatal("Dial after Close succeeded")
	}
}
