package envd

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// KeepaliveHeader is the request header that asks a stream for keepalive
// events every so many seconds.
const KeepaliveHeader = "Keepalive-Ping-Interval"

// minKeepalive bounds how often keepalives are sent, whatever is asked.
const minKeepalive = 100 * time.Millisecond

// keepaliveInterval reads KeepaliveHeader: 0 (none) when missing or not a
// positive number of seconds.
func keepaliveInterval(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get(KeepaliveHeader))
	if v == "" {
		return 0
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil || secs <= 0 || secs > 24*3600 {
		return 0
	}
	return max(time.Duration(secs*float64(time.Second)), minKeepalive)
}

// serialize makes a stream's send safe for the stream's handler and its
// keepalive loop together.
func serialize[T any](send func(T) error) func(T) error {
	var mu sync.Mutex
	return func(m T) error {
		mu.Lock()
		defer mu.Unlock()
		return send(m)
	}
}

// keepalive calls ping every interval until the returned stop is called,
// ctx ends or ping fails; interval 0 pings never.
func keepalive(ctx context.Context, interval time.Duration, ping func() error) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if ping() != nil {
					return
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}
