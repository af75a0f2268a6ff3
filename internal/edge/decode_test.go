package edge

import (
	"errors"
	"strings"
	"testing"
)

func TestNameDurationField(t *testing.T) {
	orig := errors.New(`proto: (line 1:29): invalid google.protobuf.Duration value "999999h"`)
	err := nameDurationField([]byte(`{"conversationId":"c","idleTimeout":"999999h"}`), orig)
	if !strings.HasPrefix(err.Error(), `idle_timeout: invalid duration "999999h"`) || !strings.Contains(err.Error(), `"600s"`) {
		t.Errorf("got %v", err)
	}
	other := errors.New(`proto: unknown field "x"`)
	if got := nameDurationField([]byte(`{}`), other); got != other {
		t.Errorf("other errors must pass through, got %v", got)
	}
}
