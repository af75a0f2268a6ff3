package agent_test

import (
	"os"
	"testing"
)

// TestMain runs the test binary as the file benchmark's client process
// (see BenchmarkFilesUpDown256MiB) when benchClientEnv is set, and as the
// tests otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(benchClientEnv) != "" {
		os.Exit(runBenchClient())
	}
	os.Exit(m.Run())
}
