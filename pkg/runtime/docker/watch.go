package docker

import (
	"context"
	"strconv"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"

	"github.com/berth-dev/berth/pkg/runtime"
)

// Watch streams die, oom and destroy events of berth-managed containers as
// runtime.Events (died with the exit code, oom, removed). The channel is
// closed when ctx ends or the engine's event stream fails (e.g. the engine
// restarts); the caller then re-Lists and watches again. Containers of
// failed Creates also produce died/removed events.
func (r *Runtime) Watch(ctx context.Context) (<-chan runtime.Event, error) {
	// Fail early and clearly when the engine is down.
	if err := r.Ping(ctx); err != nil {
		return nil, err
	}
	args := filters.NewArgs(
		filters.Arg("type", string(events.ContainerEventType)),
		filters.Arg("label", runtime.LabelManaged+"=true"),
		filters.Arg("event", string(events.ActionDie)),
		filters.Arg("event", string(events.ActionOOM)),
		filters.Arg("event", string(events.ActionDestroy)),
	)
	ctx, cancel := context.WithCancel(ctx)
	msgs, errs := r.cli.Events(ctx, events.ListOptions{Filters: args})
	out := make(chan runtime.Event, 64)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-errs:
				if err != nil && ctx.Err() == nil {
					r.log.Warn("docker event stream ended", "err", err)
				}
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				ev, ok := toEvent(m)
				if !ok {
					continue
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// toEvent translates a Docker event; ok is false for events berth ignores.
func toEvent(m events.Message) (runtime.Event, bool) {
	if m.Type != events.ContainerEventType {
		return runtime.Event{}, false
	}
	ev := runtime.Event{ID: m.Actor.ID, LeaseID: m.Actor.Attributes[runtime.LabelLease]}
	switch m.Action {
	case events.ActionDie:
		ev.Kind = runtime.EventDied
		ev.ExitCode, _ = strconv.Atoi(m.Actor.Attributes["exitCode"])
	case events.ActionOOM:
		ev.Kind = runtime.EventOOM
	case events.ActionDestroy:
		ev.Kind = runtime.EventRemoved
	default:
		return runtime.Event{}, false
	}
	switch {
	case m.TimeNano != 0:
		ev.At = time.Unix(0, m.TimeNano)
	case m.Time != 0:
		ev.At = time.Unix(m.Time, 0)
	default:
		ev.At = time.Now()
	}
	return ev, true
}
