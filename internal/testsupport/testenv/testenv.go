// Package testenv decides what a test does when its environment lacks
// something it needs: a Docker Engine, a containerd socket, root, an image
// built by `make images`, or a host tool. By default such a test skips with
// the reason; with BERTH_REQUIRE_DOCKER=1 in the environment (set by CI's
// .ci/run) it fails instead, so a run can never pass by skipping.
//
// Skips that are about the run's own choice (-short) are not for this
// package: they stay plain t.Skip.
//
// It also builds what such tests run: the static sandbox-agent (and the
// orchestrator) as `make build` does (Build, BuildAgent, AgentBinary).
package testenv

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// RequireEnv is the environment variable that turns skips into failures.
const RequireEnv = "BERTH_REQUIRE_DOCKER"

// Required reports whether BERTH_REQUIRE_DOCKER is set to a true value
// (1, t, true, ...; unset, empty or unparsable means false).
func Required() bool {
	v, err := strconv.ParseBool(os.Getenv(RequireEnv))
	return err == nil && v
}

// SkipOrFail skips tb with reason, or fails it (Fatal) when Required.
func SkipOrFail(tb testing.TB, reason string) {
	tb.Helper()
	if Required() {
		tb.Fatalf("%s (%s=1: a missing daemon, image or tool is a failure)", reason, RequireEnv)
		return
	}
	tb.Skip(reason)
}

// SkipOrFailf is SkipOrFail with a format.
func SkipOrFailf(tb testing.TB, format string, args ...any) {
	tb.Helper()
	SkipOrFail(tb, fmt.Sprintf(format, args...))
}

// LogOrFail is for a missing optional part of a test (an image some
// subtests use): it logs reason and goes on, or fails tb (Fatal) when
// Required.
func LogOrFail(tb testing.TB, reason string) {
	tb.Helper()
	if Required() {
		tb.Fatalf("%s (%s=1: a missing daemon, image or tool is a failure)", reason, RequireEnv)
		return
	}
	tb.Log(reason)
}
