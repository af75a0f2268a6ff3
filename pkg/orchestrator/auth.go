package orchestrator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
	"google.golang.org/grpc/metadata"
)

// Role is what a caller's token lets it do.
type Role int

// Roles, from most to least powerful.
const (
	// RoleNone has no valid token.
	RoleNone Role = iota
	// RoleOperator holds the operator token: every lease, reap, drain.
	RoleOperator
	// RoleClient holds a client token: acquire, and its owner's leases.
	RoleClient
	// RoleLease holds one lease's token: that lease's sandbox, renew and
	// release of that lease, nothing else.
	RoleLease
)

// Principal is an authenticated caller.
type Principal struct {
	Role Role
	// Owner is the client's owner (RoleClient) or "operator".
	Owner string
	// LeaseID is the lease a RoleLease token belongs to.
	LeaseID string
}

// LeaseTokenVerifier checks lease tokens; the lease manager implements it.
type LeaseTokenVerifier interface {
	VerifyToken(token string) (leaseID string, ok bool)
}

// OperatorOwner is the owner recorded for leases the operator acquires
// without naming one.
const OperatorOwner = "operator"

// authenticator maps bearer tokens to principals. Static tokens are kept as
// SHA-256 sums and compared in constant time.
type authenticator struct {
	operator    [32]byte
	hasOperator bool
	clients     []clientSum
	leases      LeaseTokenVerifier
}

type clientSum struct {
	sum   [32]byte
	owner string
}

func newAuthenticator(operatorToken string, clients []Client, leases LeaseTokenVerifier) *authenticator {
	a := &authenticator{leases: leases}
	if operatorToken != "" {
		a.operator, a.hasOperator = sha256.Sum256([]byte(operatorToken)), true
	}
	for _, c := range clients {
		a.clients = append(a.clients, clientSum{sum: sha256.Sum256([]byte(c.Token)), owner: c.Owner})
	}
	return a
}

// fromHeader authenticates an Authorization header value.
func (a *authenticator) fromHeader(h string) (Principal, error) {
	tok, ok := bearer(h)
	if !ok {
		return Principal{}, errdefs.ErrUnauthenticated
	}
	return a.fromToken(tok)
}

func (a *authenticator) fromToken(tok string) (Principal, error) {
	sum := sha256.Sum256([]byte(tok))
	if a.hasOperator && subtle.ConstantTimeCompare(sum[:], a.operator[:]) == 1 {
		return Principal{Role: RoleOperator, Owner: OperatorOwner}, nil
	}
	// Check every client token so timing does not reveal which one matched.
	found := -1
	for i, c := range a.clients {
		if subtle.ConstantTimeCompare(sum[:], c.sum[:]) == 1 {
			found = i
		}
	}
	if found >= 0 {
		return Principal{Role: RoleClient, Owner: a.clients[found].owner}, nil
	}
	if a.leases != nil {
		if id, ok := a.leases.VerifyToken(tok); ok {
			return Principal{Role: RoleLease, LeaseID: id}, nil
		}
	}
	return Principal{}, errdefs.ErrUnauthenticated
}

// fromContext authenticates the bearer token in gRPC metadata.
func (a *authenticator) fromContext(ctx context.Context) (Principal, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if p, err := a.fromHeader(v); err == nil {
			return p, nil
		}
	}
	return Principal{}, errdefs.ErrUnauthenticated
}

func bearer(h string) (string, bool) {
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(h[len(prefix):]), true
}

type principalKey struct{}

// withPrincipal stores p in ctx.
func withPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the caller authenticated for ctx.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
