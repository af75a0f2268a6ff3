package docker

import (
	"context"
	"fmt"
	"sync"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// flagFake is an engine whose paused flag lags: inspect answers the states
// in states one after the other (the last one from then on), the way the
// Docker daemon's flag lags behind a late containerd event.
type flagFake struct {
	fakeClient

	mu       sync.Mutex
	states   []container.State
	inspects int
	pauses   int
	unpauses int
	// callErr, when set, answers the first pause or unpause call.
	callErr error
}

func (f *flagFake) ContainerInspect(_ context.Context, id string) (container.InspectResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.states[min(f.inspects, len(f.states)-1)]
	f.inspects++
	return container.InspectResponse{
		ContainerJSONBase: &container.ContainerJSONBase{ID: id, State: &st},
		Config:            &container.Config{Labels: map[string]string{runtime.LabelManaged: "true"}},
	}, nil
}

func (f *flagFake) call(n *int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	*n++
	if err := f.callErr; err != nil {
		f.callErr = nil
		return err
	}
	return nil
}

func (f *flagFake) ContainerPause(context.Context, string) error   { return f.call(&f.pauses) }
func (f *flagFake) ContainerUnpause(context.Context, string) error { return f.call(&f.unpauses) }

var (
	running = container.State{Status: "running", Running: true}
	paused  = container.State{Status: "paused", Running: true, Paused: true}
	exited  = container.State{Status: "exited"}
)

// TestPauseResumeWaitOutStalePausedFlag: a running container the engine
// still calls paused (or a paused one it calls running) is paused (resumed)
// once the flag settles, with one engine call; a stopped container is
// refused at once; a flag that never settles is refused after the bound.
func TestPauseResumeWaitOutStalePausedFlag(t *testing.T) {
	conflict := fmt.Errorf("daemon: container c1 is already paused: %w", cerrdefs.ErrConflict)
	cases := []struct {
		name        string
		pause       bool
		states      []container.State
		callErr     error
		wantErr     bool
		wantCalls   int
		minInspects int
	}{
		{name: "pause running", pause: true, states: []container.State{running}, wantCalls: 1, minInspects: 1},
		{name: "pause stale paused flag", pause: true, states: []container.State{paused, paused, running}, wantCalls: 1, minInspects: 3},
		{name: "pause conflict then settled", pause: true, states: []container.State{running}, callErr: conflict, wantCalls: 2, minInspects: 2},
		{name: "pause stopped", pause: true, states: []container.State{exited}, wantErr: true, minInspects: 1},
		{name: "pause flag never settles", pause: true, states: []container.State{paused}, wantErr: true, minInspects: 3},
		{name: "resume paused", states: []container.State{paused}, wantCalls: 1, minInspects: 1},
		{name: "resume stale running flag", states: []container.State{running, paused}, wantCalls: 1, minInspects: 2},
		{name: "resume stopped", states: []container.State{exited}, wantErr: true, minInspects: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &flagFake{states: c.states, callErr: c.callErr}
			r := newFakeRuntime(t, &fakeClient{})
			r.cli = f
			var err error
			if c.pause {
				err = r.Pause(context.Background(), "c1")
			} else {
				err = r.Resume(context.Background(), "c1")
			}
			if c.wantErr {
				if !errdefs.IsFailedPrecondition(err) {
					t.Fatalf("err = %v, want FailedPrecondition", err)
				}
			} else if err != nil {
				t.Fatalf("err = %v", err)
			}
			calls := f.pauses
			if !c.pause {
				calls = f.unpauses
			}
			if calls != c.wantCalls || f.pauses+f.unpauses != c.wantCalls {
				t.Errorf("pauses %d, unpauses %d; want %d call(s) of the asked kind", f.pauses, f.unpauses, c.wantCalls)
			}
			if f.inspects < c.minInspects {
				t.Errorf("inspects = %d, want at least %d", f.inspects, c.minInspects)
			}
		})
	}
}
