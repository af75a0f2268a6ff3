package orchestrator

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/pkg/runtime"
)

// leaderRT is a runtime that elects (like kubernetes.Runtime).
type leaderRT struct {
	runtime.Runtime
	identity string
}

func (l *leaderRT) RunLeader(ctx context.Context, identity string, lead func(context.Context)) error {
	l.identity = identity
	lead(ctx)
	return nil
}

// The lease manager's reaper is elected only on a runtime that elects; the
// replica takes part under its instance id.
func TestElectorOf(t *testing.T) {
	if electorOf(struct{ runtime.Runtime }{}, "i") != nil {
		t.Fatal("a runtime without RunLeader got an elector")
	}
	rt := &leaderRT{}
	elect := electorOf(rt, "instance-1")
	if elect == nil {
		t.Fatal("no elector for a runtime with RunLeader")
	}
	led := false
	if err := elect(context.Background(), func(context.Context) { led = true }); err != nil || !led || rt.identity != "instance-1" {
		t.Fatalf("elect: err %v, led %v, identity %q", err, led, rt.identity)
	}
}
