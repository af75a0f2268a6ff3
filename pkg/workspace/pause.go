package workspace

import (
	"context"
	"fmt"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// PauseMode is how deep Pauser.Pause pauses a workspace's sandbox.
type PauseMode string

// Pause modes (the orchestrator's lease pause modes).
const (
	// PauseFreeze freezes the sandbox's processes in memory (cgroup
	// freezer): resuming takes milliseconds and the processes go on. Not
	// every backend can; those answer FAILED_PRECONDITION.
	PauseFreeze PauseMode = "freeze"
	// PauseHibernate stops the sandbox's container, keeping its files and
	// freeing its memory: resuming restarts it (hundreds of milliseconds);
	// processes that were running are gone.
	PauseHibernate PauseMode = "hibernate"
)

// Pauser is the optional part of a Workspace whose sandbox can be paused
// between the turns of an agent loop (Leased implements it; Local and
// Remote do not). Callers type-assert: ws.(workspace.Pauser).
//
// A paused workspace stays usable without any call: its next operation
// resumes the sandbox (through the orchestrator's proxy) and is then
// served; the caller sees latency, not an error.
type Pauser interface {
	// Pause pauses the sandbox (mode "" is PauseFreeze). Pausing a sandbox
	// already paused the same way succeeds; paused the other way it is
	// errdefs.ErrFailedPrecondition, as is PauseFreeze on a backend that
	// cannot freeze.
	Pause(ctx context.Context, mode PauseMode) error
	// Resume resumes a paused sandbox now rather than at the next
	// operation; a running sandbox is left as it is.
	Resume(ctx context.Context) error
}

var _ Pauser = (*Leased)(nil)

// Pause pauses the lease's sandbox (Pauser). The lease's renewals go on
// while it is paused (a renewal does not resume it), and the workspace's
// next operation resumes it.
func (l *Leased) Pause(ctx context.Context, mode PauseMode) error {
	if err := l.check(); err != nil {
		return err
	}
	if mode == "" {
		mode = PauseFreeze
	}
	if l.cfg.direct != nil {
		// Only the proxy resumes a paused sandbox (and follows a
		// hibernated one to its new address).
		return errdefs.FailedPrecondition("workspace: a workspace that reaches its agent directly, not through the orchestrator's proxy, cannot be paused")
	}
	id := l.LeaseID()
	if _, err := l.api.Pause(ctx, id, string(mode)); err != nil {
		return fmt.Errorf("workspace: pause lease %s (%s): %w", id, mode, err)
	}
	l.log.Debug("leased workspace paused", "mode", string(mode))
	return nil
}

// Resume resumes the lease's sandbox now (Pauser).
func (l *Leased) Resume(ctx context.Context) error {
	if err := l.check(); err != nil {
		return err
	}
	id := l.LeaseID()
	if _, err := l.api.Resume(ctx, id); err != nil {
		return fmt.Errorf("workspace: resume lease %s: %w", id, err)
	}
	return nil
}
