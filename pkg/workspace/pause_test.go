package workspace_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/workspace"
)

// TestLeasedSurvivesPause: a Leased workspace whose lease is paused behind
// its back (an idle policy, an operator) goes on without any change: its
// background renewals keep the lease (renewing a paused lease keeps it
// paused, it is not lost), and its next call through the proxy resumes the
// sandbox and is served.
func TestLeasedSurvivesPause(t *testing.T) {
	t.Parallel() // independent servers; the package runs at most GOMAXPROCS at once
	o := startOrch(t)
	for _, tr := range []workspace.Transport{workspace.TransportGRPC, workspace.TransportREST} {
		t.Run(tr.String(), func(t *testing.T) {
			cfg := o.config(t, "pause-"+tr.String(), tr)
			cfg.TTL, cfg.RenewEvery = time.Minute, 100*time.Millisecond
			ws := newLeased(t, cfg)
			id := ws.LeaseID()
			if _, err := ws.Exec(testCtx(t), workspace.Command{Shell: "echo before > kept.txt"}); err != nil {
				t.Fatal(err)
			}
			if _, err := o.Srv.Manager().Pause(context.Background(), id, lease.PauseHibernate); err != nil {
				t.Fatalf("Pause: %v", err)
			}
			time.Sleep(600 * time.Millisecond) // several renewals while paused
			if l := getLease(t, o, id); l.State != lease.StatePaused {
				t.Fatalf("after renewals the lease is %s (%s), want still PAUSED", l.State, l.Reason)
			}
			if err := ws.Err(); err != nil {
				t.Fatalf("Err() while paused = %v", err)
			}
			res, err := ws.Exec(testCtx(t), workspace.Command{Shell: "cat kept.txt"})
			if err != nil || res.Stdout != "before\n" {
				t.Fatalf("Exec on the paused workspace: %+v, %v", res, err)
			}
			if l := getLease(t, o, id); l.State != lease.StateReady {
				t.Fatalf("after a call the lease is %s, want READY", l.State)
			}
			// Pause and Resume through the workspace itself.
			var p workspace.Pauser = ws
			if err := p.Pause(testCtx(t), workspace.PauseHibernate); err != nil {
				t.Fatalf("Leased.Pause: %v", err)
			}
			if l := getLease(t, o, id); l.State != lease.StatePaused || l.Paused != lease.PauseHibernate {
				t.Fatalf("after Leased.Pause: %s %q", l.State, l.Paused)
			}
			if err := ws.Resume(testCtx(t)); err != nil {
				t.Fatalf("Leased.Resume: %v", err)
			}
			if l := getLease(t, o, id); l.State != lease.StateReady {
				t.Fatalf("after Leased.Resume: %s", l.State)
			}
		})
	}
}
