package orchestrator

import (
	"context"

	"github.com/berth-dev/berth/pkg/bearer"
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

// LeaseTokenVerifier checks lease tokens; *lease.Tokens (the lease
// manager's Tokens) implements it.
type LeaseTokenVerifier interface {
	VerifyToken(token string) (leaseID string, ok bool)
}

// OperatorOwner is the owner recorded for leases the operator acquires
// without naming one.
const OperatorOwner = "operator"

// authenticator maps bearer tokens to principals. Static tokens are
// bearer.Secrets, compared in constant time.
type authenticator struct {
	operator bearer.Secret
	clients  []bearer.Secret
	owners   []string // owners[i] holds clients[i]
	leases   LeaseTokenVerifier
}

// newAuthenticator takes the operator Secret the server built once from
// its Config (the same value goes to the proxy).
func newAuthenticator(operator bearer.Secret, clients []Client, leases LeaseTokenVerifier) *authenticator {
	a := &authenticator{operator: operator, leases: leases}
	for _, c := range clients {
		a.clients = append(a.clients, bearer.NewSecret(c.Token))
		a.owners = append(a.owners, c.Owner)
	}
	return a
}

// fromHeader authenticates an Authorization header value.
func (a *authenticator) fromHeader(h string) (Principal, error) {
	tok, ok := bearer.Parse(h)
	if !ok {
		return Principal{}, errdefs.ErrUnauthenticated
	}
	return a.fromToken(tok)
}

func (a *authenticator) fromToken(tok string) (Principal, error) {
	if a.operator.Matches(tok) {
		return Principal{Role: RoleOperator, Owner: OperatorOwner}, nil
	}
	// bearer.Index checks every client token so timing does not reveal
	// which one matched.
	if i := bearer.Index(tok, a.clients); i >= 0 {
		return Principal{Role: RoleClient, Owner: a.owners[i]}, nil
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
	for tok := range bearer.FromMD(md) {
		if p, err := a.fromToken(tok); err == nil {
			return p, nil
		}
	}
	return Principal{}, errdefs.ErrUnauthenticated
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
