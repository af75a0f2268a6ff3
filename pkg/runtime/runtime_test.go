package runtime_test

import (
	"errors"
	"fmt"
	"testing"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// TestEngineCategory is the one table both backends map engine errors
// with; "already exists" is ErrAlreadyExists on every engine.
func TestEngineCategory(t *testing.T) {
	for _, tc := range []struct {
		in, want error
	}{
		{cerrdefs.ErrNotFound, errdefs.ErrNotFound},
		{cerrdefs.ErrAlreadyExists, errdefs.ErrAlreadyExists},
		{cerrdefs.ErrConflict, errdefs.ErrFailedPrecondition},
		{cerrdefs.ErrFailedPrecondition, errdefs.ErrFailedPrecondition},
		{cerrdefs.ErrNotImplemented, errdefs.ErrFailedPrecondition},
		{cerrdefs.ErrInvalidArgument, errdefs.ErrInvalidArgument},
		{cerrdefs.ErrUnavailable, errdefs.ErrUnavailable},
		{cerrdefs.ErrPermissionDenied, errdefs.ErrPermissionDenied},
		{cerrdefs.ErrUnauthenticated, errdefs.ErrUnauthenticated},
		{cerrdefs.ErrResourceExhausted, errdefs.ErrResourceExhausted},
		{errors.New("engine exploded"), errdefs.ErrInternal},
	} {
		if got := runtime.EngineCategory(fmt.Errorf("engine: %w", tc.in)); got != tc.want {
			t.Errorf("EngineCategory(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestSelectorMatches: every key must be present with its value; an empty
// selector matches everything.
func TestSelectorMatches(t *testing.T) {
	labels := map[string]string{"dev.berth.lease": "l-1", "team": ""}
	for _, tc := range []struct {
		sel  runtime.Selector
		want bool
	}{
		{nil, true},
		{runtime.Selector{"dev.berth.lease": "l-1"}, true},
		{runtime.Selector{"team": ""}, true},
		{runtime.Selector{"dev.berth.lease": "l-2"}, false},
		{runtime.Selector{"missing": ""}, false},
		{runtime.Selector{"dev.berth.lease": "l-1", "team": "x"}, false},
	} {
		if got := tc.sel.Matches(labels); got != tc.want {
			t.Errorf("%v.Matches = %v, want %v", tc.sel, got, tc.want)
		}
	}
}
