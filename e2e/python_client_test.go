package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

// pythonWithPytest returns a Python interpreter that can import pytest:
// python3 on PATH, else Debian's /usr/bin/python3 (where python3-pytest
// installs it, also when PATH finds another Python first).
func pythonWithPytest() (string, bool) {
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		p, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		if exec.Command(p, "-c", "import pytest").Run() == nil {
			return p, true
		}
	}
	return "", false
}

var pytestSummary = regexp.MustCompile(`(\d+) passed`)

// TestPythonClient runs the Python client's pytest suite (clients/python/tests)
// against a real orchestrator with Docker sandboxes: leases (acquire as a
// context manager, renew, release, list, lease-token scope), exec (result,
// streaming, masking, timeouts), background processes, streamed uploads and
// downloads, git status and diff, and the error classes.
func TestPythonClient(t *testing.T) {
	requireImage(t, baseImage)
	py, ok := pythonWithPytest()
	if !ok {
		testenv.SkipOrFail(t, "pytest not found for python3 or /usr/bin/python3: install Debian's python3-pytest (scripts/deps.sh)")
	}
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	startProc(t, dir, addr)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tests, err := filepath.Abs(filepath.Join("..", "clients", "python", "tests"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", tests)
	cmd.Env = append(os.Environ(),
		"BERTH_URL=http://"+addr, "BERTH_TOKEN="+operatorToken, "BERTH_IMAGE="+baseImage,
		"PYTHONDONTWRITEBYTECODE=1")
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("%s -m pytest (%s):\n%s", py, time.Since(t0).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("pytest failed: %v", err)
	}
	if strings.Contains(string(out), " skipped") {
		t.Fatalf("pytest skipped tests with an orchestrator running")
	}
	m := pytestSummary.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("no pytest summary in the output")
	}
	t.Logf("Python client: %s tests passed", m[1])
}
