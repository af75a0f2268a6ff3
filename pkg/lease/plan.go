package lease

import (
	"fmt"
	"time"

	"github.com/berth-dev/berth/pkg/runtime"
)

// The lease controller is level-based, like controller-runtime's
// reconcilers: whatever made it look at a lease — Start, a runtime event
// or the periodic resync — it observes the lease's containers as they are
// now, and plan decides from the record and that observation alone what
// to do. The three passes differ only in what they observe and in how they
// apply the decision (reconcile.go), never in the rules.

// trigger is what made the controller look at a lease.
type trigger int

const (
	// trigStartup is Start's reconcile: no operation of this process runs
	// yet, and the previous process may have died in the middle of one.
	trigStartup trigger = iota
	// trigResync is a periodic (or after-resubscription) list of every
	// container of this instance.
	trigResync
	// trigEvent is a runtime event about one of the lease's containers.
	trigEvent
)

// observed is what the controller saw of one lease when it planned.
type observed struct {
	trigger trigger
	// boxes are the containers labelled with the lease, in any order.
	boxes []runtime.Sandbox
	// stale: the lease became READY or PAUSED after boxes were listed, so
	// the list says nothing of its current container.
	stale bool
	// unconfigured: the lease's record was written by a warm claim while
	// the pooled agent was being configured (PhaseClaiming), and the
	// agent says the configuration never happened (or cannot tell).
	// Meaningful at startup only.
	unconfigured bool
	// kept: the lease failed with its stopped container kept for the
	// operator (PhaseKept) and its time is not up.
	kept bool
	// goneReason, when set, is the reason to record when the lease's
	// container is gone ("removed outside berth" for a removed event).
	goneReason string
}

// actionKind is what plan decided to do to a lease.
type actionKind int

const (
	// actNone: the record and the runtime agree (or are not this pass's
	// to settle).
	actNone actionKind = iota
	// actAdopt: take box as the lease's container (id and endpoint),
	// keeping the lease in its state.
	actAdopt
	// actRestart: the READY lease's container exited; restart it in place
	// (READY → PENDING/restarting "<reason>", then READY "restarted after
	// <after>").
	actRestart
	// actResumeRestart: go on with the in-place restart of box that the
	// previous process had begun (startup only).
	actResumeRestart
	// actFail: the lease fails with reason; its containers are removed.
	actFail
	// actRepause: the PAUSED lease's container runs; pause it again the
	// way the lease records (frozen or hibernated).
	actRepause
	// actFreezeLost: the frozen lease's container was found stopped (an
	// engine restart); the lease is hibernated now (ReasonFreezeLost).
	actFreezeLost
	// actClean: the lease is RELEASING, or ended with a container left;
	// remove its containers, then mark it cleaned (RELEASING → RELEASED).
	actClean
)

var actionNames = map[actionKind]string{
	actNone: "none", actAdopt: "adopt", actRestart: "restart", actResumeRestart: "resume-restart",
	actFail: "fail", actRepause: "repause", actFreezeLost: "freeze-lost", actClean: "clean",
}

func (k actionKind) String() string { return actionNames[k] }

// action is plan's decision for one lease.
type action struct {
	kind actionKind
	// box is the lease's container the action is about (adopt, restart,
	// resume-restart, repause, freeze-lost).
	box runtime.Sandbox
	// reason is the transition's reason (restart, fail).
	reason string
	// after says how the container ended, for the restarted transition's
	// reason ("restarted after exit 137").
	after string
	// remove are containers of the lease that are not its sandbox (left
	// over, or the lease's own when it ends); they are removed now.
	remove []runtime.Sandbox
	// keep are the containers the lease keeps (startup removes every
	// container no lease keeps).
	keep []runtime.Sandbox
}

// restartPolicy is the in-place restart budget: at most limit restarts
// within window (limit < 0: never restart).
type restartPolicy struct {
	limit  int
	window time.Duration
}

// plan decides what to do to lease l given what the runtime shows of it
// (o) at time now. It is pure: it reads its arguments only, changes
// nothing, and the same inputs always give the same action. The rules:
//
//   - stale: nothing (the next observation settles it). A lease an
//     operation holds is never planned: the pass marks it dirty and a
//     worker looks at it when the operation ends (work.go).
//   - READY: a warm claim's record (PhaseClaiming) whose agent was never
//     configured fails (ReasonRestartedCreating); no container fails
//     (vanished); a dead container is restarted in place
//     (PENDING/restarting) within the restart budget, else the lease
//     fails; a live container is adopted when it is not the recorded one
//     (or at startup, to refresh the endpoint).
//   - PAUSED: no container fails (vanished); a running one is paused again;
//     a frozen one found stopped makes the lease hibernated; otherwise the
//     container is adopted if its id changed (or at startup).
//   - PENDING: nobody is creating or restarting it (the process that was
//     died): a restart (PhaseRestarting) with its container present goes
//     on; anything else fails (ReasonRestartedCreating).
//   - RELEASING, or ended with a container left and not kept (PhaseKept,
//     its time not up): clean.
//   - ended and cleaned, or kept: nothing, except that containers of a
//     cleaned lease are removed.
//
// The lease's container is found by one rule (pick): the recorded id, else
// a live container labelled with the lease, else any. Every other
// container of a live lease is removed.
func plan(l *Lease, o observed, rp restartPolicy, now time.Time) action {
	if o.stale {
		return action{kind: actNone, keep: o.boxes}
	}
	box, found := pick(l, o.boxes)
	others := func() []runtime.Sandbox { return without(o.boxes, box.ID, found) }
	gone := func() action {
		reason := ReasonVanished
		switch {
		case o.goneReason != "":
			reason = o.goneReason
		case o.trigger == trigStartup:
			reason = ReasonVanishedWhileDown
		}
		return action{kind: actFail, reason: reason, remove: o.boxes}
	}
	switch l.State {
	case StateReady:
		switch {
		case l.Phase == PhaseClaiming && o.unconfigured:
			return action{kind: actFail, reason: ReasonRestartedCreating, remove: o.boxes}
		case !found:
			return gone()
		case !alive(box):
			why, after := deadText(box)
			if o.trigger == trigStartup {
				why += " while the orchestrator was down"
			}
			if n := restartsWithin(l, rp.window, now); rp.limit < 0 || n >= rp.limit {
				if rp.limit >= 0 {
					why = fmt.Sprintf("%s; restart limit reached (%d restarts within %s)", why, n, rp.window)
				}
				return action{kind: actFail, reason: why, remove: o.boxes}
			}
			return action{kind: actRestart, box: box, reason: why + "; restarting", after: after, remove: others(), keep: []runtime.Sandbox{box}}
		case box.ID != l.ContainerID || o.trigger == trigStartup:
			return action{kind: actAdopt, box: box, remove: others(), keep: []runtime.Sandbox{box}}
		}
		return action{kind: actNone, remove: others(), keep: []runtime.Sandbox{box}}
	case StatePaused:
		switch {
		case !found:
			return gone()
		case box.State == runtime.StateRunning:
			return action{kind: actRepause, box: box, remove: others(), keep: []runtime.Sandbox{box}}
		case l.Paused == PauseFreeze && box.State != runtime.StatePaused:
			return action{kind: actFreezeLost, box: box, remove: others(), keep: []runtime.Sandbox{box}}
		case box.ID != l.ContainerID || o.trigger == trigStartup:
			return action{kind: actAdopt, box: box, remove: others(), keep: []runtime.Sandbox{box}}
		}
		return action{kind: actNone, remove: others(), keep: []runtime.Sandbox{box}}
	case StatePending:
		if l.Phase == PhaseRestarting && found && box.ID == l.ContainerID {
			return action{kind: actResumeRestart, box: box, after: restartCause(l), remove: others(), keep: []runtime.Sandbox{box}}
		}
		return action{kind: actFail, reason: ReasonRestartedCreating, remove: o.boxes}
	case StateReleasing:
		return action{kind: actClean, remove: o.boxes}
	}
	// Ended.
	switch {
	case o.kept:
		return action{kind: actNone, keep: o.boxes}
	case !l.Cleaned:
		return action{kind: actClean, remove: o.boxes}
	}
	return action{kind: actNone, remove: o.boxes}
}

// pick finds lease l's container among boxes: the recorded id, else a
// live container labelled with the lease, else any of them.
func pick(l *Lease, boxes []runtime.Sandbox) (runtime.Sandbox, bool) {
	var any *runtime.Sandbox
	for i := range boxes {
		if l.ContainerID != "" && boxes[i].ID == l.ContainerID {
			return boxes[i], true
		}
	}
	for i := range boxes {
		switch {
		case alive(boxes[i]):
			return boxes[i], true
		case any == nil:
			any = &boxes[i]
		}
	}
	if any == nil {
		return runtime.Sandbox{}, false
	}
	return *any, true
}

// without returns boxes except the one with id (when has is set).
func without(boxes []runtime.Sandbox, id string, has bool) []runtime.Sandbox {
	var out []runtime.Sandbox
	for _, b := range boxes {
		if !has || b.ID != id {
			out = append(out, b)
		}
	}
	return out
}

// restartsWithin counts l's in-place restarts (transitions into
// PhaseRestarting) within window before now.
func restartsWithin(l *Lease, window time.Duration, now time.Time) int {
	n := 0
	for _, t := range l.Transitions {
		if t.Phase == PhaseRestarting && now.Sub(t.At) < window {
			n++
		}
	}
	return n
}

// restartCause is how the container of a lease being restarted in place
// (PhaseRestarting) ended, read back from the reason of the transition
// that entered the phase ("container exited with code 137; restarting"
// gives "container exited with code 137").
func restartCause(l *Lease) string {
	n := len(l.Transitions)
	if n == 0 || l.Transitions[n-1].Phase != PhaseRestarting {
		return "restart interrupted by an orchestrator restart"
	}
	after := l.Transitions[n-1].Reason
	if i := len(after) - len("; restarting"); i > 0 && after[i:] == "; restarting" {
		after = after[:i]
	}
	return after
}
