package kubernetes

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// Two replicas of one namespace get the same token secret: the first
// creates the Secret, the second reads it.
func TestSharedSecret(t *testing.T) {
	cs := fake.NewClientset()
	a := &Runtime{cfg: Config{Namespace: "ns"}, cs: cs, log: slog.Default()}
	b := &Runtime{cfg: Config{Namespace: "ns"}, cs: cs, log: slog.Default()}
	sa, err := a.SharedSecret(context.Background(), 16)
	if err != nil || len(sa) != sharedSecretLen {
		t.Fatalf("first replica: %d bytes, %v", len(sa), err)
	}
	sb, err := b.SharedSecret(context.Background(), 16)
	if err != nil || !bytes.Equal(sa, sb) {
		t.Fatalf("second replica: %x, %v; want the first one's %x", sb, err, sa)
	}
	if _, err := a.SharedSecret(context.Background(), 64); err == nil {
		t.Error("a secret shorter than minLen was accepted")
	}
}
