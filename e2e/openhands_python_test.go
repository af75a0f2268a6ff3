package e2e

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

var unittestSummary = regexp.MustCompile(`(?m)^Ran (\d+) tests? in .*\n\nOK\s*$`)

// TestOpenHandsPythonCompat runs testdata/openhands_sdk_compat.py, which
// drives a Docker lease's OpenHands surface through the real proxy the way
// the OpenHands SDK's RemoteWorkspace does, in Python with the standard
// library (null is not a list there): commands polled with order__gt every
// 0.1 s until the first exit code, multipart upload and download, git
// changes and diff, wrong and missing keys.
func TestOpenHandsPythonCompat(t *testing.T) {
	requireImage(t, baseImage)
	py, err := exec.LookPath("python3")
	if err != nil {
		testenv.SkipOrFail(t, "python3 not found (scripts/deps.sh installs it)")
	}
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	startProc(t, dir, addr)
	a := newAPI(addr)
	defer a.close()
	acq := a.acquireBody(t, map[string]any{"conversationId": "openhands-py-" + randHex(4), "image": baseImage, "ttl": "600s"})
	id := acq.GetLease().GetId()
	defer a.mustRelease(t, id)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "testdata/openhands_sdk_compat.py")
	cmd.Env = append(os.Environ(), "OH_HOST="+a.base+sandboxPath(id, ""), "OH_KEY="+acq.GetToken(), "PYTHONDONTWRITEBYTECODE=1")
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("%s openhands_sdk_compat.py (%s):\n%s", py, time.Since(t0).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("the Python compatibility suite failed: %v", err)
	}
	m := unittestSummary.FindSubmatch(out)
	if m == nil {
		t.Fatal("no unittest summary with OK in the output")
	}
	t.Logf("OpenHands Python compatibility: %s tests passed", m[1])
}
