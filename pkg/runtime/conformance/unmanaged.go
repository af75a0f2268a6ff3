package conformance

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// WithUnmanaged gives the suite a way to create, behind the runtime's back,
// a container that berth does not manage (without its labels) where the
// runtime looks (the engine, its namespace), to check that the runtime
// leaves it alone. create makes it from Images.Empty, registers its removal
// on t, and returns its id and a way to tell whether it still exists.
// Without it that check is skipped.
func WithUnmanaged(create func(t *testing.T, image string) (id string, exists func() bool)) Option {
	return func(o *options) { o.unmanaged = create }
}

// testUnmanaged: berth never touches what it did not create. A container
// without berth's labels is NotFound to Get, FailedPrecondition to Remove
// (and still there after it), and not listed.
func (s *suite) testUnmanaged(t *testing.T) {
	t.Parallel()
	if s.opts.unmanaged == nil {
		testenv.SkipOrFail(t, "no way to create an unmanaged container given (WithUnmanaged); skipping")
	}
	ctx := context.Background()
	id, exists := s.opts.unmanaged(t, s.images.Empty)
	if _, err := s.rt.Get(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("Get of an unmanaged container: %v, want NotFound", err)
	}
	if err := s.rt.Remove(ctx, id); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Remove of an unmanaged container: %v, want FailedPrecondition", err)
	}
	if !exists() {
		t.Errorf("the unmanaged container %s is gone", id)
	}
	list, err := s.rt.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.ID == id {
			t.Errorf("List includes the unmanaged container %s", id)
		}
	}
}
