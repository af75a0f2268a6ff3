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
	return runtime.WatchEvents[events.Message](ctx, r.log, "docker", engineEvents{r.cli})
}

// engineEvents is the Docker side of runtime.WatchEvents: the engine
// filters by label and action, and its messages carry the labels.
type engineEvents struct{ cli Client }

// Subscribe subscribes to the die, oom and destroy events of containers
// labelled as berth's.
func (e engineEvents) Subscribe(ctx context.Context) (<-chan events.Message, <-chan error) {
	args := filters.NewArgs(
		filters.Arg("type", string(events.ContainerEventType)),
		filters.Arg("label", runtime.LabelManaged+"=true"),
		filters.Arg("event", string(events.ActionDie)),
		filters.Arg("event", string(events.ActionOOM)),
		filters.Arg("event", string(events.ActionDestroy)),
	)
	return e.cli.Events(ctx, events.ListOptions{Filters: args})
}

// Seed has nothing to read: Docker's events carry the container's labels.
func (engineEvents) Seed(context.Context) error { return nil }

// Translate is toEvent.
func (engineEvents) Translate(_ context.Context, m events.Message) (runtime.Event, bool) {
	return toEvent(m)
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
