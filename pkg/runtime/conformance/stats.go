package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// testStatsLogs checks runtime.StatsReader and runtime.LogStreamer on a
// runtime that implements them: a running sandbox reports CPU time,
// memory and processes; its output holds the agent's log; a follow ends
// when its context does; a stopped sandbox has no live figures; the last
// output of a sandbox removed after it exited is kept (runtime.LastWords).
func (s *suite) testStatsLogs(t *testing.T) {
	t.Parallel()
	sr, okStats := s.rt.(runtime.StatsReader)
	ls, okLogs := s.rt.(runtime.LogStreamer)
	if !okStats && !okLogs {
		t.Skipf("%T implements neither runtime.StatsReader nor runtime.LogStreamer", s.rt)
	}
	ctx := context.Background()
	sb := s.create(t, s.spec(s.images.Empty))
	if okStats {
		st, err := sr.Stats(ctx, sb.ID)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if st.CPUNanos <= 0 || st.MemoryBytes <= 0 || st.Processes < 1 || st.At.IsZero() || st.MemoryPeakBytes < 0 {
			t.Errorf("Stats of a running sandbox: %+v", st)
		}
		if _, err := sr.Stats(ctx, "berth-no-such-sandbox"); !errdefs.IsNotFound(err) {
			t.Errorf("Stats of a missing sandbox: %v, want ErrNotFound", err)
		}
	}
	if okLogs {
		// The engine copies a container's output to its log asynchronously:
		// a line written just before the agent answered health may reach
		// the log a moment later, so read until it is there (bounded).
		var all strings.Builder
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			all.Reset()
			if err := ls.StreamLogs(ctx, sb.ID, runtime.LogOptions{}, func(l runtime.LogLine) error {
				all.WriteString(l.Stream + " " + l.Text + "\n")
				return nil
			}); err != nil {
				t.Fatalf("StreamLogs: %v", err)
			}
			if strings.Contains(all.String(), "agent serving") {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("StreamLogs lacks the agent's log after 10s:\n%s", all.String())
				break
			}
		}
		n := 0
		if err := ls.StreamLogs(ctx, sb.ID, runtime.LogOptions{Tail: 1}, func(runtime.LogLine) error { n++; return nil }); err != nil || n != 1 {
			t.Errorf("StreamLogs Tail 1: %d lines, %v", n, err)
		}
		fctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		began := time.Now()
		err := ls.StreamLogs(fctx, sb.ID, runtime.LogOptions{Follow: true}, func(runtime.LogLine) error { return nil })
		cancel()
		if err != nil || time.Since(began) > 5*time.Second {
			t.Errorf("StreamLogs Follow until its context ended: %v after %s", err, time.Since(began))
		}
		if err := ls.StreamLogs(ctx, "berth-no-such-sandbox", runtime.LogOptions{}, func(runtime.LogLine) error { return nil }); !errdefs.IsNotFound(err) {
			t.Errorf("StreamLogs of a missing sandbox: %v, want ErrNotFound", err)
		}
	}
	if okStats {
		if err := s.rt.Stop(ctx, sb.ID, time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if _, err := sr.Stats(ctx, sb.ID); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("Stats of a stopped sandbox: %v, want ErrFailedPrecondition", err)
		}
	}
	if okLogs {
		// Removed after it exited: its last words are still there.
		if err := s.rt.Stop(ctx, sb.ID, time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if err := s.rt.Remove(ctx, sb.ID); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		var last strings.Builder
		err := ls.StreamLogs(ctx, sb.ID, runtime.LogOptions{}, func(l runtime.LogLine) error {
			last.WriteString(l.Text + "\n")
			return nil
		})
		if err != nil || !strings.Contains(last.String(), "agent serving") {
			t.Errorf("StreamLogs of a sandbox removed after it exited: %v:\n%s", err, last.String())
		}
	}
}
