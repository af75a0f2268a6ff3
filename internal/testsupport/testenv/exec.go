package testenv

import (
	"bytes"
	"os/exec"
	"testing"
)

// WriteExecutable writes content to path as an executable (mode 0755) that a
// test is about to run. A parallel test's fork can inherit the test
// process's write descriptor for the file between its fork and its exec,
// and exec'ing the file then fails with ETXTBSY ("text file busy", Go issue
// 22315). So the file is written by a short-lived child, which starts
// nothing else: once it has exited, no process holds the file open for
// writing.
func WriteExecutable(tb testing.TB, path string, content []byte) {
	tb.Helper()
	cmd := exec.Command("/bin/sh", "-c", `cat > "$1" && chmod 0755 "$1"`, "sh", path)
	cmd.Stdin = bytes.NewReader(content)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("write executable %s: %v: %s", path, err, out)
	}
}
