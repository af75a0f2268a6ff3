package containerd

import (
	"context"
	"time"

	apievents "github.com/containerd/containerd/api/events"
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
	ctx, cancel := context.WithCancel(r.withNS(ctx))
	ns := r.cfg.Namespace
	filters := []string{
		`namespace==` + ns + `,topic=="` + topicTaskExit + `"`,
		`namespace==` + ns + `,topic=="` + topicTaskOOM + `"`,
		`namespace==` + ns + `,topic=="` + topicContainerCreate + `"`,
		`namespace==` + ns + `,topic=="` + topicContainerDelete + `"`,
	}
	msgs, errs := r.cli.EventService().Subscribe(ctx, filters...)
	// Seed after subscribing, so no container falls between the two.
	known := map[string]string{} // managed container id -> lease id
	foreign := map[string]bool{} // containers known not to be berth's
	list, err := r.List(ctx, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	for _, sb := range list {
		known[sb.ID] = sb.LeaseID
	}
	out := make(chan runtime.Event, 64)
	go func() {
		defer close(out)
		defer cancel()
		// lease returns the lease of a managed container, looking it up once
		// if it is not known yet.
		lease := func(id string) (string, bool) {
			if l, ok := known[id]; ok {
				return l, true
			}
			if foreign[id] {
				return "", false
			}
			c, err := r.cli.ContainerService().Get(ctx, id)
			if err != nil {
				return "", false
			}
			if c.Labels[runtime.LabelManaged] != "true" {
				foreign[id] = true
				return "", false
			}
			known[id] = c.Labels[runtime.LabelLease]
			return known[id], true
		}
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-errs:
				if err != nil && ctx.Err() == nil {
					r.log.Warn("containerd event stream ended", "err", err)
				}
				return
			case env, ok := <-msgs:
				if !ok {
					return
				}
				if env == nil || env.Event == nil || env.Namespace != ns {
					continue
				}
				v, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				at := env.Timestamp
				if at.IsZero() {
					at = time.Now()
				}
				var ev runtime.Event
				switch e := v.(type) {
				case *apievents.ContainerCreate:
					lease(e.GetID())
					continue
				case *apievents.TaskExit:
					if e.GetID() != e.GetContainerID() {
						continue // an exec'd process, not the sandbox's init
					}
					l, ok := lease(e.GetContainerID())
					if !ok {
						continue
					}
					ev = runtime.Event{Kind: runtime.EventDied, ID: e.GetContainerID(), LeaseID: l, ExitCode: int(e.GetExitStatus())}
					if t := e.GetExitedAt(); t != nil && !t.AsTime().IsZero() {
						at = t.AsTime()
					}
				case *apievents.TaskOOM:
					l, ok := lease(e.GetContainerID())
					if !ok {
						continue
					}
					ev = runtime.Event{Kind: runtime.EventOOM, ID: e.GetContainerID(), LeaseID: l}
				case *apievents.ContainerDelete:
					delete(foreign, e.GetID())
					l, ok := known[e.GetID()]
					if !ok {
						continue
					}
					delete(known, e.GetID())
					ev = runtime.Event{Kind: runtime.EventRemoved, ID: e.GetID(), LeaseID: l}
				default:
					continue
				}
				ev.At = at
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
