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

// sharingRT is a runtime whose replicas share the token secret.
type sharingRT struct {
	runtime.Runtime
	secret []byte
}

func (s *sharingRT) SharedSecret(context.Context, int) ([]byte, error) { return s.secret, nil }

// The token secret comes from a runtime that shares it, else from the data
// directory.
func TestLoadSecret(t *testing.T) {
	shared := []byte("0123456789abcdef0123456789abcdef")
	got, err := loadSecret(context.Background(), Config{DataDir: t.TempDir()}, &sharingRT{secret: shared})
	if err != nil || string(got) != string(shared) {
		t.Fatalf("shared: %q, %v", got, err)
	}
	got, err = loadSecret(context.Background(), Config{DataDir: t.TempDir()}, struct{ runtime.Runtime }{})
	if err != nil || len(got) < 16 || string(got) == string(shared) {
		t.Fatalf("file: %d bytes, %v", len(got), err)
	}
}
