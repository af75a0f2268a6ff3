package lease

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// TestSecretsNeverStored: secrets reach the runtime's spec, the lease shows
// only their names, and the store file never holds a value — not while the
// lease lives, not after a restart, not after it ended.
func TestSecretsNeverStored(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	const val = "sk-very-secret-value-1234"
	l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "c",
		Env: map[string]string{"PLAIN": "visible"}, Secrets: map[string]string{"TOKEN": val, "OTHER": "other-secret-xyz"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.SecretNames, []string{"OTHER", "TOKEN"}) {
		t.Errorf("SecretNames = %v", l.SecretNames)
	}
	h.rt.mu.Lock()
	spec := h.rt.specs[len(h.rt.specs)-1]
	h.rt.mu.Unlock()
	if spec.Secrets["TOKEN"] != val || spec.Env["PLAIN"] != "visible" || spec.Env["TOKEN"] != "" {
		t.Errorf("spec env %v secrets %v", spec.Env, spec.Secrets)
	}
	h.m.mu.Lock()
	if e := h.m.leases[l.ID]; e.secrets != nil {
		t.Error("the manager still holds the values after creation")
	}
	h.m.mu.Unlock()

	noValue := func(when string) {
		t.Helper()
		b, err := os.ReadFile(h.path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(val)) || bytes.Contains(b, []byte("other-secret-xyz")) {
			t.Fatalf("%s: the store file holds a secret value", when)
		}
		if !bytes.Contains(b, []byte("visible")) {
			t.Fatalf("%s: the store file does not hold the lease (test is wrong)", when)
		}
	}
	noValue("live")
	h.restart()
	if got := h.get(l.ID); !slices.Equal(got.SecretNames, []string{"OTHER", "TOKEN"}) {
		t.Errorf("after restart SecretNames = %v", got.SecretNames)
	}
	noValue("after restart")
	if _, err := h.m.Release(ctx, l.ID, ""); err != nil {
		t.Fatal(err)
	}
	h.stop()
	b, _ := os.ReadFile(h.path)
	if bytes.Contains(b, []byte(val)) {
		t.Fatal("ended: the store file holds a secret value")
	}
}

func TestSecretsValidation(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Admission.MaxEnvBytes = 100 })
	ctx := context.Background()
	for name, tc := range map[string]struct {
		req   AcquireRequest
		field string
	}{
		"bad name":    {AcquireRequest{ConversationID: "c", Secrets: map[string]string{"A=B": "x"}}, "secrets.A=B"},
		"reserved":    {AcquireRequest{ConversationID: "c", Secrets: map[string]string{"BERTH_X": "x"}}, "secrets.BERTH_X"},
		"comma":       {AcquireRequest{ConversationID: "c", Secrets: map[string]string{"A,B": "x"}}, "secrets.A,B"},
		"also in env": {AcquireRequest{ConversationID: "c", Env: map[string]string{"T": "1"}, Secrets: map[string]string{"T": "x"}}, "secrets.T"},
		"NUL":         {AcquireRequest{ConversationID: "c", Secrets: map[string]string{"T": "a\x00"}}, "secrets.T"},
		"bytes with env": {AcquireRequest{ConversationID: "c", Env: map[string]string{"E": strings.Repeat("e", 60)},
			Secrets: map[string]string{"T": strings.Repeat("s", 60)}}, "env"},
	} {
		_, _, _, err := h.m.Acquire(ctx, tc.req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want InvalidArgument naming %s", name, err, tc.field)
		}
		if err != nil && strings.Contains(err.Error(), strings.Repeat("s", 60)) {
			t.Errorf("%s: the error shows the value", name)
		}
	}
}
