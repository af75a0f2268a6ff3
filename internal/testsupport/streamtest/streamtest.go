// Package streamtest opens the orchestrator's log follows over REST for
// tests of the stream limits: GET /v1/leases/{id}/logs?follow=true, read
// line by line as a client in any language would.
package streamtest

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogFollow is one open log follow.
type LogFollow struct {
	// Code is the HTTP status of the answer.
	Code int
	// Msg is a refused follow's error message.
	Msg string
	// Lines has an admitted follow's lines as "source:text"; it is closed
	// when the stream ends. Lines nobody reads past its buffer are dropped.
	Lines chan string
	// Cancel ends the follow.
	Cancel func()
}

// OpenLogFollow opens a log follow of lease id at base with token. A
// transport error is reported with tb.Errorf and gives a LogFollow with
// Code 0.
func OpenLogFollow(tb testing.TB, base, id, token string) *LogFollow {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/leases/"+id+"/logs?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		tb.Errorf("log follow: %v", err)
		return &LogFollow{Cancel: cancel}
	}
	f := &LogFollow{Code: resp.StatusCode, Cancel: func() { cancel(); resp.Body.Close() }}
	if resp.StatusCode != http.StatusOK {
		// A refused stream's status comes as {"error": {...}} (the
		// gateway's stream error form) or as a plain status body.
		var m struct {
			Message string
			Error   struct{ Message string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&m)
		f.Msg = m.Message + m.Error.Message
		f.Cancel()
		return f
	}
	f.Lines = make(chan string, 256)
	go func() {
		defer close(f.Lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var line struct{ Result struct{ Source, Text string } }
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				select {
				case f.Lines <- line.Result.Source + ":" + line.Result.Text:
				default: // nobody reads: drop, tests look for one line
				}
			}
		}
	}()
	return f
}

// WaitLine waits up to a minute for a line of f that starts with prefix,
// failing the test when the follow ends or none comes.
func (f *LogFollow) WaitLine(tb testing.TB, prefix string) {
	tb.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case l, ok := <-f.Lines:
			if !ok {
				tb.Fatalf("the follow ended before a line starting %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-deadline:
			tb.Fatalf("no line starting %q", prefix)
		}
	}
}

// Flood opens n log follows of lease id with token at once, as a client
// attacking the stream limit would. Each must be admitted (200; closed at
// the test's cleanup) or refused with 429 and a message starting with
// limitMsg; anything else fails the test. It returns the admitted ones.
func Flood(tb testing.TB, n int, base, id, token, limitMsg string) []*LogFollow {
	tb.Helper()
	fs := make([]*LogFollow, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { fs[i] = OpenLogFollow(tb, base, id, token) })
	}
	wg.Wait()
	var admitted []*LogFollow
	for _, f := range fs {
		switch {
		case f.Code == http.StatusOK:
			admitted = append(admitted, f)
			tb.Cleanup(f.Cancel)
		case f.Code != http.StatusTooManyRequests || !strings.HasPrefix(f.Msg, limitMsg):
			tb.Fatalf("log follow: HTTP %d %q; want 200 or 429 %q", f.Code, f.Msg, limitMsg)
		}
	}
	return admitted
}
