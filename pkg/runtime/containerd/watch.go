package containerd

import (
	"context"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"

	"github.com/berth-dev/berth/pkg/runtime"
)

// Event topics Watch subscribes to.
const (
	topicTaskExit        = "/tasks/exit"
	topicTaskOOM         = "/tasks/oom"
	topicContainerCreate = "/containers/create"
	topicContainerDelete = "/containers/delete"
)

// Watch streams containerd's events for berth-managed containers of the
// namespace as runtime.Events: a task's init process exiting (died, with its
// exit status: 137 for SIGKILL), an OOM kill (oom) and a container deletion
// (removed). containerd's events carry no labels, so Watch keeps a map of
// the managed containers it knows (seeded by List, extended on each
// container-create event) to tell berth's from others and to report lease
// ids. The channel is closed when ctx ends or the event stream fails (e.g.
// containerd restarts); the caller then re-Lists and watches again.
// Containers of failed Creates also produce died and removed events.
func (r *Runtime) Watch(ctx context.Context) (<-chan runtime.Event, error) {
	if err := r.Ping(ctx); err != nil {
		return nil, err
	}
	src := &engineEvents{r: r, known: map[string]string{}, foreign: map[string]bool{}}
	return runtime.WatchEvents[*events.Envelope](r.withNS(ctx), r.log, "containerd", src)
}

// engineEvents is the containerd side of runtime.WatchEvents for one
// Watch: the topics of the namespace, and the managed containers it knows
// of (its events carry ids only).
type engineEvents struct {
	r       *Runtime
	known   map[string]string // managed container id -> lease id
	foreign map[string]bool   // containers known not to be berth's
}

// Subscribe subscribes to the task exit and OOM and the container create
// and delete topics of the runtime's namespace.
func (e *engineEvents) Subscribe(ctx context.Context) (<-chan *events.Envelope, <-chan error) {
	ns := e.r.cfg.Namespace
	var filters []string
	for _, topic := range []string{topicTaskExit, topicTaskOOM, topicContainerCreate, topicContainerDelete} {
		filters = append(filters, `namespace==`+ns+`,topic=="`+topic+`"`)
	}
	return e.r.cli.EventService().Subscribe(ctx, filters...)
}

// Seed learns the managed containers that exist (after subscribing, so no
// container falls between the two).
func (e *engineEvents) Seed(ctx context.Context) error {
	list, err := e.r.List(ctx, nil)
	if err != nil {
		return err
	}
	for _, sb := range list {
		e.known[sb.ID] = sb.LeaseID
	}
	return nil
}

// Translate maps an envelope of the namespace to an event of a managed
// container: the exit of a task's init process (not of an exec'd one), an
// OOM kill, a deletion. A container creation only teaches it the
// container.
func (e *engineEvents) Translate(ctx context.Context, env *events.Envelope) (runtime.Event, bool) {
	if env == nil || env.Event == nil || env.Namespace != e.r.cfg.Namespace {
		return runtime.Event{}, false
	}
	v, err := typeurl.UnmarshalAny(env.Event)
	if err != nil {
		return runtime.Event{}, false
	}
	at := env.Timestamp
	if at.IsZero() {
		at = time.Now()
	}
	var ev runtime.Event
	switch m := v.(type) {
	case *apievents.ContainerCreate:
		e.lease(ctx, m.GetID())
		return runtime.Event{}, false
	case *apievents.TaskExit:
		if m.GetID() != m.GetContainerID() {
			return runtime.Event{}, false // an exec'd process, not the sandbox's init
		}
		l, ok := e.lease(ctx, m.GetContainerID())
		if !ok {
			return runtime.Event{}, false
		}
		ev = runtime.Event{Kind: runtime.EventDied, ID: m.GetContainerID(), LeaseID: l, ExitCode: int(m.GetExitStatus())}
		if t := m.GetExitedAt(); t != nil && !t.AsTime().IsZero() {
			at = t.AsTime()
		}
	case *apievents.TaskOOM:
		l, ok := e.lease(ctx, m.GetContainerID())
		if !ok {
			return runtime.Event{}, false
		}
		ev = runtime.Event{Kind: runtime.EventOOM, ID: m.GetContainerID(), LeaseID: l}
	case *apievents.ContainerDelete:
		delete(e.foreign, m.GetID())
		l, ok := e.known[m.GetID()]
		if !ok {
			return runtime.Event{}, false
		}
		delete(e.known, m.GetID())
		ev = runtime.Event{Kind: runtime.EventRemoved, ID: m.GetID(), LeaseID: l}
	default:
		return runtime.Event{}, false
	}
	ev.At = at
	return ev, true
}

// lease returns the lease of a managed container, looking it up once if it
// is not known yet; false for a container that is not berth's (or cannot
// be read).
func (e *engineEvents) lease(ctx context.Context, id string) (string, bool) {
	if l, ok := e.known[id]; ok {
		return l, true
	}
	if e.foreign[id] {
		return "", false
	}
	c, err := e.r.cli.ContainerService().Get(ctx, id)
	if err != nil {
		return "", false
	}
	if c.Labels[runtime.LabelManaged] != "true" {
		e.foreign[id] = true
		return "", false
	}
	e.known[id] = c.Labels[runtime.LabelLease]
	return e.known[id], true
}
