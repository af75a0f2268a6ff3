package e2e

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

// Client tokens of the orchestrator TestOpenHandsRuntimeAPI starts.
const (
	runtimeKeyA = "e2e-oh-runtime-team-a-0123456789"
	runtimeKeyB = "e2e-oh-runtime-team-b-0123456789"
)

// TestOpenHandsRuntimeAPI runs testdata/openhands_runtime_compat.py, which
// drives the orchestrator's OpenHands runtime API (/openhands/runtime) the
// way OpenHands' APIRemoteWorkspace does, in Python's standard library,
// against a real orchestrator process on Docker with berth/base: start as
// the client sends it (uid 10001, forwarded environment), wait for
// pod_status ready and the url's open /health, commands through the url and
// session API key, pause (hibernate) and resume with the files kept, stop;
// image_exists; 401 for missing and wrong keys, 404 for another owner, 400
// for a command of the wrong type (TestOpenHandsApp runs commands).
func TestOpenHandsRuntimeAPI(t *testing.T) {
	py := python3(t)
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	startProc(t, dir, addr, "BERTH_CLIENT_TOKENS=team-a:"+runtimeKeyA+",team-b:"+runtimeKeyB)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	script := exec.CommandContext(ctx, py, "testdata/openhands_runtime_compat.py")
	script.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "RT_API=http://"+addr+"/openhands/runtime",
		"RT_KEY="+runtimeKeyA, "RT_OTHER_KEY="+runtimeKeyB, "RT_IMAGE="+baseImage)
	began := time.Now()
	out, runErr := script.CombinedOutput()
	t.Logf("openhands_runtime_compat.py took %s:\n%s", time.Since(began).Round(time.Millisecond), out)
	switch m := unittestSummary.FindSubmatch(out); {
	case runErr != nil:
		t.Fatalf("the runtime API suite failed: %v", runErr)
	case m == nil:
		t.Fatal("the suite printed no unittest summary with OK")
	default:
		t.Logf("OpenHands runtime API: %s tests passed", m[1])
	}
}

// python3 is the path of python3, or a skip (a failure with
// BERTH_REQUIRE_DOCKER=1) when there is none.
func python3(t *testing.T) string {
	py, err := exec.LookPath("python3")
	if err != nil {
		testenv.SkipOrFail(t, "python3 not found (scripts/deps.sh installs it)")
	}
	return py
}
