package lease

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// MinSecretLen is the shortest server secret New and NewTokens accept.
const MinSecretLen = 16

// SecretFileName is the usual name of the server secret inside the data dir.
const SecretFileName = "secret"

// Token derivation contexts: the same secret yields unrelated values per use.
const (
	tokenContextLease = "lease:"
	tokenContextAgent = "agent:"
)

func mac(secret []byte, context, leaseID string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(context))
	h.Write([]byte(leaseID))
	return h.Sum(nil)
}

// Tokens derives and checks the credentials of the server secret: lease
// tokens, agent tokens (this file) and the signatures of signed URLs
// (sign.go). Each is an HMAC-SHA256 of the secret under a context of its
// own, so one never passes for another; none is stored, and all stay valid
// exactly as long as the secret is unchanged. Checks run in constant time. A
// Tokens is immutable and safe for concurrent use; the Manager builds one
// from Config.Secret (Manager.Tokens).
type Tokens struct {
	secret []byte
}

// NewTokens returns the Tokens of the server secret (which it copies); the
// secret must be at least MinSecretLen bytes.
func NewTokens(secret []byte) (*Tokens, error) {
	if len(secret) < MinSecretLen {
		return nil, errdefs.InvalidArgument("secret", "must be at least %d bytes", MinSecretLen)
	}
	return &Tokens{secret: bytes.Clone(secret)}, nil
}

// Tokens returns the tokens and signatures of the Manager's server secret
// (Config.Secret): what the orchestrator's authentication, the proxy and
// the signing of URLs use.
func (m *Manager) Tokens() *Tokens { return m.tokens }

// Token returns the lease token of leaseID: leaseID + "." +
// base64url(HMAC-SHA256(secret, "lease:" + leaseID)). It is derived, never
// stored, so every acquire of the same lease returns the same token, and it
// is valid exactly as long as the server secret is unchanged. The token
// authenticates; whether the lease is still usable is its state's business.
func (t *Tokens) Token(leaseID string) string {
	return leaseID + "." + base64.RawURLEncoding.EncodeToString(mac(t.secret, tokenContextLease, leaseID))
}

// AgentToken returns the bearer token the sandbox's agent is created with:
// base64url(HMAC-SHA256(secret, "agent:" + leaseID)). It differs from the
// lease token so the agent never sees the caller's token (the proxy strips
// the caller's and sends this one). The operator never needs it.
func (t *Tokens) AgentToken(leaseID string) string {
	return base64.RawURLEncoding.EncodeToString(mac(t.secret, tokenContextAgent, leaseID))
}

// VerifyToken checks a lease token in constant time and returns the lease id
// it names. It does not look the lease up: the caller still checks that the
// lease exists and is READY (Manager.Get).
func (t *Tokens) VerifyToken(token string) (leaseID string, ok bool) {
	i := strings.LastIndexByte(token, '.')
	if i <= 0 || !ValidID(token[:i]) {
		return "", false
	}
	got, err := base64.RawURLEncoding.Strict().DecodeString(token[i+1:])
	if err != nil {
		return "", false
	}
	id := token[:i]
	if !hmac.Equal(got, mac(t.secret, tokenContextLease, id)) {
		return "", false
	}
	return id, true
}

// idEncoding is lowercase base32hex: its order is the byte order, so ids
// sort by their time prefix.
var idEncoding = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// idLen is the length of a lease id: 16 bytes in base32 is 26 characters.
const idLen = 26

// newID returns a lease id: 48 bits of milliseconds since the epoch and 80
// random bits.
func newID(now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic(fmt.Sprintf("lease: crypto/rand: %v", err)) // never happens on supported platforms
	}
	return idEncoding.EncodeToString(b[:])
}

// ValidID reports whether id has the shape of a lease id (it may still name
// no lease). Edges use it to reject garbage before any lookup.
func ValidID(id string) bool {
	if len(id) != idLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'v') {
			return false
		}
	}
	return true
}

// LoadOrCreateSecret reads the server secret at path, or creates it (32
// random bytes, mode 0600, parent directories 0700) when the file does not
// exist. Keeping it in the data dir keeps lease tokens valid across
// restarts; deleting it revokes every lease token at the next start.
func LoadOrCreateSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if len(b) < MinSecretLen {
			return nil, fmt.Errorf("secret file %s holds %d bytes, want at least %d", path, len(b), MinSecretLen)
		}
		return b, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read secret: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create secret: %w", err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("create secret: %w", err)
	}
	// Write to a temp file and link it into place so two starting processes
	// cannot both win, and a crash never leaves a short file.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".secret-*")
	if err != nil {
		return nil, fmt.Errorf("create secret: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(secret); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("create secret: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("create secret: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("create secret: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadOrCreateSecret(path)
		}
		return nil, fmt.Errorf("create secret: %w", err)
	}
	return secret, nil
}
