package conformance

import (
	"context"
	"testing"

	"github.com/berth-dev/berth/pkg/runtime"
)

// BenchmarkCreate measures a cold Create on rt (create, the agent in
// place, start, GET /healthz answers) of the sandboxes newSpec describes;
// newSpec must give each a fresh lease id (and register its cleanup).
// The Remove after each Create is not timed. A first Create, not timed
// either, warms up what every Create shares (the network, the image, the
// agent binary in the page cache).
func BenchmarkCreate(b *testing.B, rt runtime.Runtime, newSpec func() runtime.Spec) {
	ctx := context.Background()
	create := func() {
		sb, err := rt.Create(ctx, newSpec())
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := rt.Remove(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	create()
	b.ResetTimer()
	for range b.N {
		create()
	}
}
