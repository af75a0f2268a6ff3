package lease

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
)

func TestPlan(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	box := func(id string, st runtime.State) runtime.Sandbox {
		return runtime.Sandbox{ID: id, LeaseID: "L", State: st, Endpoint: id + ":7000", ExitCode: 137}
	}
	running, exited, paused := box("c1", runtime.StateRunning), box("c1", runtime.StateExited), box("c1", runtime.StatePaused)
	stray := box("c2", runtime.StateRunning)
	lease := func(st State, mut ...func(*Lease)) Lease {
		l := Lease{ID: "L", State: st, ContainerID: "c1", Transitions: []Transition{{From: StateUnspecified, To: StatePending, At: now.Add(-time.Hour)}}}
		for _, f := range mut {
			f(&l)
		}
		return l
	}
	restartedAt := func(ago ...time.Duration) func(*Lease) {
		return func(l *Lease) {
			for _, d := range ago {
				l.Transitions = append(l.Transitions,
					Transition{From: StateReady, To: StatePending, Phase: PhaseRestarting, Reason: "container exited with code 1; restarting", At: now.Add(-d)},
					Transition{From: StatePending, To: StateReady, At: now.Add(-d)})
			}
		}
	}
	restartingNow := func(reason string) func(*Lease) {
		return func(l *Lease) {
			l.Phase = PhaseRestarting
			l.Transitions = append(l.Transitions, Transition{From: StateReady, To: StatePending, Phase: PhaseRestarting, Reason: reason, At: now})
		}
	}
	rp := restartPolicy{limit: 2, window: 10 * time.Minute}
	type want struct {
		kind   actionKind
		box    string // the action's container id
		reason string // a substring of the reason
		remove []string
		keep   []string
	}
	for _, tc := range []struct {
		name  string
		l     Lease
		o     observed
		rp    *restartPolicy
		want  want
		after string
	}{
		// Stale: nothing, whatever the world says. (A lease an operation
		// holds is never planned: work_test.go.)
		{name: "stale ready", l: lease(StateReady), o: observed{trigger: trigResync, stale: true, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actNone, keep: []string{"c1"}}},

		// READY.
		{name: "ready running, resync: agree", l: lease(StateReady), o: observed{trigger: trigResync, boxes: []runtime.Sandbox{running}},
			want: want{kind: actNone, keep: []string{"c1"}}},
		{name: "ready running, startup: adopt", l: lease(StateReady), o: observed{trigger: trigStartup, boxes: []runtime.Sandbox{running}},
			want: want{kind: actAdopt, box: "c1", keep: []string{"c1"}}},
		{name: "ready with a stray beside its container", l: lease(StateReady), o: observed{trigger: trigEvent, boxes: []runtime.Sandbox{stray, running}},
			want: want{kind: actNone, remove: []string{"c2"}, keep: []string{"c1"}}},
		{name: "ready, recorded id unknown, a live one by label", l: lease(StateReady, func(l *Lease) { l.ContainerID = "" }),
			o:    observed{trigger: trigStartup, boxes: []runtime.Sandbox{box("c3", runtime.StateExited), stray}},
			want: want{kind: actAdopt, box: "c2", remove: []string{"c3"}, keep: []string{"c2"}}},
		{name: "ready gone, resync", l: lease(StateReady), o: observed{trigger: trigResync},
			want: want{kind: actFail, reason: ReasonVanished}},
		{name: "ready gone, startup", l: lease(StateReady), o: observed{trigger: trigStartup},
			want: want{kind: actFail, reason: ReasonVanishedWhileDown}},
		{name: "ready removed event", l: lease(StateReady), o: observed{trigger: trigEvent, goneReason: ReasonRemovedOutside},
			want: want{kind: actFail, reason: ReasonRemovedOutside}},
		{name: "ready dead: restart", l: lease(StateReady), o: observed{trigger: trigEvent, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actRestart, box: "c1", reason: "container exited with code 137; restarting", keep: []string{"c1"}}, after: "exit 137"},
		{name: "ready dead at startup: restart, said so", l: lease(StateReady), o: observed{trigger: trigStartup, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actRestart, box: "c1", reason: "code 137 while the orchestrator was down; restarting", keep: []string{"c1"}}},
		{name: "ready dead, budget used: fail", l: lease(StateReady, restartedAt(time.Minute, 2*time.Minute)), o: observed{trigger: trigResync, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actFail, reason: "restart limit reached (2 restarts within 10m0s)", remove: []string{"c1"}}},
		{name: "ready dead, old restarts outside the window", l: lease(StateReady, restartedAt(time.Minute, time.Hour)), o: observed{trigger: trigResync, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actRestart, box: "c1", keep: []string{"c1"}}},
		{name: "ready dead, restarts off", l: lease(StateReady), rp: &restartPolicy{limit: -1}, o: observed{trigger: trigResync, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actFail, reason: "container exited with code 137", remove: []string{"c1"}}},
		{name: "claim record, agent not configured", l: lease(StateReady, func(l *Lease) { l.Phase = PhaseClaiming }),
			o:    observed{trigger: trigStartup, unconfigured: true, boxes: []runtime.Sandbox{running}},
			want: want{kind: actFail, reason: ReasonRestartedCreating, remove: []string{"c1"}}},
		{name: "claim record, agent configured", l: lease(StateReady, func(l *Lease) { l.Phase = PhaseClaiming }),
			o:    observed{trigger: trigStartup, boxes: []runtime.Sandbox{running}},
			want: want{kind: actAdopt, box: "c1", keep: []string{"c1"}}},

		// PAUSED: one lookup rule, the same as READY's.
		{name: "paused hibernated, stopped: agree", l: lease(StatePaused, func(l *Lease) { l.Paused = PauseHibernate }),
			o: observed{trigger: trigResync, boxes: []runtime.Sandbox{exited}}, want: want{kind: actNone, keep: []string{"c1"}}},
		{name: "paused frozen, frozen: adopt at startup", l: lease(StatePaused, func(l *Lease) { l.Paused = PauseFreeze }),
			o: observed{trigger: trigStartup, boxes: []runtime.Sandbox{paused}}, want: want{kind: actAdopt, box: "c1", keep: []string{"c1"}}},
		{name: "paused found running: pause again", l: lease(StatePaused, func(l *Lease) { l.Paused = PauseHibernate }),
			o: observed{trigger: trigResync, boxes: []runtime.Sandbox{running}}, want: want{kind: actRepause, box: "c1", keep: []string{"c1"}}},
		{name: "frozen found stopped: hibernated", l: lease(StatePaused, func(l *Lease) { l.Paused = PauseFreeze }),
			o: observed{trigger: trigResync, boxes: []runtime.Sandbox{exited}}, want: want{kind: actFreezeLost, box: "c1", keep: []string{"c1"}}},
		{name: "paused gone", l: lease(StatePaused), o: observed{trigger: trigResync}, want: want{kind: actFail, reason: ReasonVanished}},
		{name: "paused, id unknown, live one preferred", l: lease(StatePaused, func(l *Lease) { l.ContainerID = ""; l.Paused = PauseHibernate }),
			o:    observed{trigger: trigStartup, boxes: []runtime.Sandbox{box("c3", runtime.StateExited), box("c4", runtime.StatePaused)}},
			want: want{kind: actAdopt, box: "c4", remove: []string{"c3"}, keep: []string{"c4"}}},

		// PENDING with nobody working on it.
		{name: "pending creation", l: lease(StatePending), o: observed{trigger: trigStartup, boxes: []runtime.Sandbox{running}},
			want: want{kind: actFail, reason: ReasonRestartedCreating, remove: []string{"c1"}}},
		{name: "pending restart with its container: go on", l: lease(StatePending, restartedAt(time.Minute), restartingNow("container exited with code 9; restarting")),
			o:    observed{trigger: trigStartup, boxes: []runtime.Sandbox{exited, stray}},
			want: want{kind: actResumeRestart, box: "c1", remove: []string{"c2"}, keep: []string{"c1"}}, after: "container exited with code 9"},
		{name: "pending restart without its container", l: lease(StatePending, restartingNow("")),
			o: observed{trigger: trigStartup}, want: want{kind: actFail, reason: ReasonRestartedCreating}},
		{name: "pending restart, the phase set without its transition", l: lease(StatePending, func(l *Lease) { l.Phase = PhaseRestarting }),
			o:    observed{trigger: trigStartup, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actResumeRestart, box: "c1", keep: []string{"c1"}}, after: "restart interrupted by an orchestrator restart"},
		{name: "pending after a restart, phase none: a creation", l: lease(StatePending, restartedAt(time.Minute), func(l *Lease) {
			l.Transitions = append(l.Transitions, Transition{From: StateReady, To: StatePending, At: now})
		}), o: observed{trigger: trigStartup, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actFail, reason: ReasonRestartedCreating, remove: []string{"c1"}}},

		// On the way out.
		{name: "releasing", l: lease(StateReleasing), o: observed{trigger: trigResync, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actClean, remove: []string{"c1"}}},
		{name: "ended uncleaned", l: lease(StateFailed), o: observed{trigger: trigResync, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actClean, remove: []string{"c1"}}},
		{name: "ended and kept", l: lease(StateFailed, func(l *Lease) { l.Phase = PhaseKept }), o: observed{trigger: trigResync, kept: true, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actNone, keep: []string{"c1"}}},
		{name: "kept, its time up", l: lease(StateFailed, func(l *Lease) { l.Phase = PhaseKept }), o: observed{trigger: trigResync, boxes: []runtime.Sandbox{exited}},
			want: want{kind: actClean, remove: []string{"c1"}}},
		{name: "ended cleaned with a container back", l: lease(StateExpired, func(l *Lease) { l.Cleaned = true }), o: observed{trigger: trigResync, boxes: []runtime.Sandbox{running}},
			want: want{kind: actNone, remove: []string{"c1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := rp
			if tc.rp != nil {
				p = *tc.rp
			}
			before := tc.l.Clone()
			a := plan(&tc.l, tc.o, p, now)
			ids := func(bs []runtime.Sandbox) []string {
				var out []string
				for _, b := range bs {
					out = append(out, b.ID)
				}
				slices.Sort(out)
				return out
			}
			if a.kind != tc.want.kind || a.box.ID != tc.want.box || !strings.Contains(a.reason, tc.want.reason) ||
				!slices.Equal(ids(a.remove), tc.want.remove) || !slices.Equal(ids(a.keep), tc.want.keep) || (tc.after != "" && a.after != tc.after) {
				t.Errorf("plan = {%s box=%q reason=%q after=%q remove=%v keep=%v}, want %+v (after %q)",
					a.kind, a.box.ID, a.reason, a.after, ids(a.remove), ids(a.keep), tc.want, tc.after)
			}
			if tc.l.State != before.State || tc.l.ContainerID != before.ContainerID || len(tc.l.Transitions) != len(before.Transitions) {
				t.Errorf("plan changed the lease: %+v", tc.l)
			}
		})
	}
}
