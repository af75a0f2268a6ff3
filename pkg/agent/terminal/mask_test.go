package terminal

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/agent/mask"
)

// TestMaskedTerminal: a secret value is replaced in the terminal's output,
// also when written in two pieces. The quiet window is made longer than
// any scheduling delay, so the two pieces always meet: the test depends on
// no timing of the machine.
func TestMaskedTerminal(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{Masker: mask.New(map[string]string{"T": "tok-S3cr3t-value"}), MaskQuiet: time.Hour})
	s := mustOpen(t, m, Spec{Command: "printf 'pre tok-S3'; sleep 0.05; printf 'cr3t-value post\\n'"})
	sc := watch(t, s.Attach(true))
	sc.waitFor(t, "pre <secret:T> post", 0)
	waitDone(t, s)
	if got := sc.String(); strings.Contains(got, "S3cr3t") {
		t.Errorf("value leaked: %q", got)
	}
	if got := string(s.Attach(true).Replay()); strings.Contains(got, "S3cr3t") || !strings.Contains(got, "<secret:T>") {
		t.Errorf("scrollback %q", got)
	}
}

// TestMaskedTerminalQuietPassesTail: a held-back tail that could start a
// value ("tok-") is passed on after the quiet window, before the program
// writes anything more: the program waits for a file that the test
// creates only once it has seen the tail.
func TestMaskedTerminalQuietPassesTail(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{Masker: mask.New(map[string]string{"T": "tok-S3cr3t-value"})})
	gate := filepath.Join(t.TempDir(), "gate")
	s := mustOpen(t, m, Spec{Command: "printf 'tok-'; while [ ! -e " + gate + " ]; do sleep 0.01; done; printf 'end\\n'"})
	sc := watch(t, s.Attach(true))
	n := sc.waitFor(t, "tok-", 0)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if sc.waitFor(t, "end", n) != n+len("end") {
		t.Errorf("the tail and the rest are not in order: %q", sc.String())
	}
	waitDone(t, s)
}
