// Package bearer is berth's one authentication primitive: it reads bearer
// tokens where berth's callers send them (an HTTP "Authorization: Bearer
// TOKEN" header, the gRPC "authorization" metadata) and compares them with
// configured secrets in constant time. The orchestrator, the proxy and the
// agent all authenticate with it; what a token may then do (operator,
// client or lease scope) is each caller's own rule, not this package's.
//
// It is a package of its own, under pkg/ rather than internal/, because
// the proxy's exported Config takes the operator Secret: the orchestrator
// builds that one value from its configuration and hands the same value to
// its own authenticator and to the proxy, so the two cannot disagree.
// Places a token may also travel that belong to one component (the proxy's
// X-Berth-Token header and preview cookie) stay with that component.
package bearer

import (
	"crypto/sha256"
	"crypto/subtle"
	"iter"
	"net/http"
	"strings"

	"google.golang.org/grpc/metadata"
)

// Header is the HTTP header that carries a bearer token.
const Header = "Authorization"

// MetadataKey is the gRPC metadata key that carries a bearer token (gRPC
// keys are lower case).
const MetadataKey = "authorization"

// scheme is the prefix of a bearer credential, matched case-insensitively.
const scheme = "bearer "

// Parse returns the token of an authorization value "Bearer TOKEN". The
// scheme is case-insensitive and white space around the token is trimmed;
// ok is false for another scheme or an empty token.
func Parse(authorization string) (token string, ok bool) {
	if len(authorization) <= len(scheme) || !strings.EqualFold(authorization[:len(scheme)], scheme) {
		return "", false
	}
	token = strings.TrimSpace(authorization[len(scheme):])
	return token, token != ""
}

// All yields the token of every bearer value among values (the values of
// one header or metadata key), in order, skipping the others.
func All(values []string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, v := range values {
			if tok, ok := Parse(v); ok && !yield(tok) {
				return
			}
		}
	}
}

// FromHeader yields the bearer tokens of every Authorization header in h.
func FromHeader(h http.Header) iter.Seq[string] { return All(h.Values(Header)) }

// FromMD yields the bearer tokens of every authorization value in md.
func FromMD(md metadata.MD) iter.Seq[string] { return All(md.Get(MetadataKey)) }

// Secret is a configured token, kept only as its SHA-256 sum. Matching
// hashes the candidate too and compares the sums in constant time, so the
// time taken reveals neither the secret's length nor how much of it a
// guess got right. The zero Secret is unset and matches nothing.
type Secret struct {
	sum [sha256.Size]byte
	set bool
}

// NewSecret returns the Secret of token; an empty token gives the unset
// Secret.
func NewSecret(token string) Secret {
	if token == "" {
		return Secret{}
	}
	return Secret{sum: sha256.Sum256([]byte(token)), set: true}
}

// IsSet reports whether s was made from a non-empty token.
func (s Secret) IsSet() bool { return s.set }

// Matches reports, in constant time, whether token is s.
func (s Secret) Matches(token string) bool {
	sum := sha256.Sum256([]byte(token))
	return s.matchesSum(&sum)
}

func (s Secret) matchesSum(sum *[sha256.Size]byte) bool {
	return s.set && subtle.ConstantTimeCompare(sum[:], s.sum[:]) == 1
}

// Index returns the index of the secret token matches, or -1. It compares
// with every secret, whether or not one matched already, so the time taken
// does not reveal which one did.
func Index(token string, secrets []Secret) int {
	sum := sha256.Sum256([]byte(token))
	found := -1
	for i, s := range secrets {
		if s.matchesSum(&sum) {
			found = i
		}
	}
	return found
}
