package kubernetes

import (
	"context"
	"crypto/rand"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SharedSecretName is the Secret that holds the secret signing lease
// tokens, shared by every orchestrator replica of the namespace, so that
// each accepts the tokens another one issued.
const SharedSecretName = "berth-lease-secret"

// sharedSecretKey is its key in the Secret; sharedSecretLen the length of
// a new one.
const (
	sharedSecretKey = "secret"
	sharedSecretLen = 32
)

// SharedSecret returns the token-signing secret of the namespace's
// replicas, from the Secret SharedSecretName: the first replica creates it
// (32 random bytes), the others read it; when two create it at once, the
// one that loses reads the winner's. A secret shorter than minLen is an
// error (someone else wrote that Secret).
func (r *Runtime) SharedSecret(ctx context.Context, minLen int) ([]byte, error) {
	secrets := r.cs.CoreV1().Secrets(r.cfg.Namespace)
	b := make([]byte, sharedSecretLen)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("kubernetes: shared secret: %w", err)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SharedSecretName, Namespace: r.cfg.Namespace,
			Labels: map[string]string{"app.kubernetes.io/name": "berth"}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{sharedSecretKey: b},
	}
	got, err := secrets.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = secrets.Get(ctx, SharedSecretName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, r.apiErr(err, "shared secret", SharedSecretName)
	}
	if v := got.Data[sharedSecretKey]; len(v) >= minLen {
		return v, nil
	}
	return nil, fmt.Errorf("kubernetes: Secret %s/%s: key %q holds %d bytes, want at least %d",
		r.cfg.Namespace, SharedSecretName, sharedSecretKey, len(got.Data[sharedSecretKey]), minLen)
}
