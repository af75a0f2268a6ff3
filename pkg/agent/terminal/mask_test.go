package terminal

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/agent/mask"
)

// TestMaskedTerminal: a secret value is replaced in the terminal's output,
// also when written in two pieces, and a held-back tail that turns out not
// to be a value is passed on after a short quiet, before the next output.
func TestMaskedTerminal(t *testing.T) {
	t.Parallel()
	m := newManager(t, Config{Masker: mask.New(map[string]string{"T": "tok-S3cr3t-value"})})
	s := mustOpen(t, m, Spec{Command: "printf 'pre tok-S3'; sleep 0.05; printf 'cr3t-value post\\n'; printf 'tok-'; sleep 1; printf 'end\\n'; sleep 0.2"})
	sc := watch(t, s.Attach(true))
	n := sc.waitFor(t, "pre <secret:T> post", 0)
	sc.waitFor(t, "tok-", n)
	if got := sc.String(); strings.Contains(got, "end") {
		t.Errorf("held-back tail came only with the next output: %q", got)
	}
	sc.waitFor(t, "tok-end", n)
	waitDone(t, s)
	if got := sc.String(); strings.Contains(got, "S3cr3t") {
		t.Errorf("value leaked: %q", got)
	}
	if got := string(s.Attach(true).Replay()); strings.Contains(got, "S3cr3t") || !strings.Contains(got, "<secret:T>") {
		t.Errorf("scrollback %q", got)
	}
}
