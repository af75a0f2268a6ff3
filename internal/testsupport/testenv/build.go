package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// AgentBinaryEnv names a prebuilt static sandbox-agent that AgentBinary
// returns instead of building one.
const AgentBinaryEnv = "BERTH_AGENT_BINARY"

// Build builds packages of this module (pkgs, relative to its root, e.g.
// "./cmd/sandbox-agent") into dir as `make build` does: static
// (CGO_ENABLED=0, since images may have no libc), -trimpath, stripped. Each
// binary is named after its package's directory. It runs from the module
// root, whatever the test's working directory.
func Build(dir string, pkgs ...string) error {
	return build(dir, "-s -w", pkgs...)
}

// build is Build with the given -ldflags.
func build(dir, ldflags string, pkgs ...string) error {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	args := append([]string{"build", "-trimpath", "-ldflags", ldflags, "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	return nil
}

// BuildAgent builds the static sandbox-agent into dir and returns its
// path; a failure fails tb.
func BuildAgent(tb testing.TB, dir string) string {
	tb.Helper()
	if err := Build(dir, "./cmd/sandbox-agent"); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(dir, "sandbox-agent")
}

// AgentBinary returns the sandbox-agent a test binary's TestMain gives the
// backends: $BERTH_AGENT_BINARY when set, else one built into a new
// temporary directory; cleanup removes what it made (TestMain defers it).
// It is for TestMain, before any test runs: when the build fails it says
// why on stderr and exits with status 1.
//
// The build's version is "test-<package directory>", so each test package
// has an agent build, and with the Docker backend's volume injection an
// agent volume, of its own: `go test ./...` runs packages at the same time,
// and one package removing its volume when it ends never pulls it from
// under another's sandboxes.
func AgentBinary() (bin string, cleanup func()) {
	if bin := os.Getenv(AgentBinaryEnv); bin != "" {
		return bin, func() {}
	}
	dir, err := os.MkdirTemp("", "berth-agent-")
	if err == nil {
		var wd string
		wd, err = os.Getwd()
		if err == nil {
			err = build(dir, "-s -w -X github.com/berth-dev/berth/internal/version.Version=test-"+filepath.Base(wd), "./cmd/sandbox-agent")
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-agent:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	return filepath.Join(dir, "sandbox-agent"), func() { os.RemoveAll(dir) }
}
