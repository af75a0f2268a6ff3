package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

var errDown = errors.New("connection refused")

// testEngine is down when the error is errDown.
var testEngine = runtime.Engine{
	Name: "eng",
	Down: func(err error) bool { return errors.Is(err, errDown) },
	Hint: func() string { return "is eng running?" },
}

// TestEngineErr: the category, the op and id, the original error kept;
// an unreachable engine with its hint; context errors uncategorised.
func TestEngineErr(t *testing.T) {
	if testEngine.Err(nil, "op", "id") != nil {
		t.Error("Err(nil) != nil")
	}
	in := fmt.Errorf("engine: %w", cerrdefs.ErrNotFound)
	got := testEngine.Err(in, "get container", "c1")
	if !errdefs.IsNotFound(got) || !errors.Is(got, cerrdefs.ErrNotFound) || got.Error() != "not found: eng: get container c1: engine: not found" {
		t.Errorf("Err(not found) = %q", got)
	}
	got = testEngine.Err(errDown, "ping", "")
	if !errdefs.IsUnavailable(got) || got.Error() != "unavailable: eng: ping: connection refused (is eng running?)" {
		t.Errorf("Err(down) = %q", got)
	}
	got = testEngine.Err(context.DeadlineExceeded, "start container", "c1")
	if !errors.Is(got, context.DeadlineExceeded) || errdefs.IsInternal(got) || errdefs.IsUnavailable(got) || !strings.HasPrefix(got.Error(), "eng: start container c1: ") {
		t.Errorf("Err(deadline) = %q", got)
	}
}
