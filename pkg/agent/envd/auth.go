package envd

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/agent/users"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// AccessTokenHeader carries the access token (Config.AccessToken).
const AccessTokenHeader = "X-Access-Token"

// identity is the user a request acts as.
type identity struct {
	users.Identity
	// spec is process.Spec.User: "" for the default user.
	spec string
	// base is where relative paths resolve.
	base string
}

type identityKey struct{}

func identityFrom(ctx context.Context) identity {
	id, _ := ctx.Value(identityKey{}).(identity)
	return id
}

// isConnect reports whether r is a Connect (or gRPC) call.
func isConnect(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/process.Process/") || strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/")
}

// authenticate checks the access token and resolves the request's user
// (Basic authorization, or the username query parameter of /files) into
// the request's context.
func (s *Service) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		if err := s.checkToken(r); err != nil {
			s.refuse(w, r, err)
			return
		}
		name, err := basicUser(r.Header.Get("Authorization"))
		if err != nil {
			s.refuse(w, r, err)
			return
		}
		if r.URL.Path == "/files" {
			if u := r.URL.Query().Get("username"); u != "" {
				name = u
			}
		}
		id, err := s.resolveUser(name)
		if err != nil {
			s.refuse(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// checkToken passes r when no access token is configured, when r carries
// it, or when r is a /files request without the header and with a valid
// signature (signed URLs of E2B's SDKs).
func (s *Service) checkToken(r *http.Request) error {
	if s.token == nil {
		return nil
	}
	h, sent := r.Header[http.CanonicalHeaderKey(AccessTokenHeader)]
	if sent && len(h) > 0 && subtle.ConstantTimeCompare([]byte(h[0]), s.token) == 1 {
		return nil
	}
	q := r.URL.Query()
	if !sent && r.URL.Path == "/files" && q.Has("signature") {
		return s.checkSignature(r.Method, q, time.Now())
	}
	return errdefs.Unauthenticated("missing or invalid access token (send %s)", AccessTokenHeader)
}

// Signature computes the signature of a signed /files URL: "v1_" and the
// unpadded standard base64 of the SHA-256 of
// "PATH:OPERATION:USERNAME:TOKEN[:EXPIRATION]", where OPERATION is "read"
// (GET) or "write" (POST), PATH and USERNAME are the query parameters as
// sent (USERNAME "" when absent) and EXPIRATION, when set, is a Unix time
// in seconds.
func Signature(path, operation, username, token string, expiration *int64) string {
	parts := []string{path, operation, username, token}
	if expiration != nil {
		parts = append(parts, strconv.FormatInt(*expiration, 10))
	}
	sum := sha256.Sum256([]byte(strings.Join(parts, ":")))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

func (s *Service) checkSignature(method string, q url.Values, now time.Time) error {
	op := "read"
	if method == http.MethodPost {
		op = "write"
	}
	var exp *int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return errdefs.InvalidArgument("signature_expiration", "not a Unix time in seconds: %q", v)
		}
		if now.Unix() > n {
			return errdefs.Unauthenticated("the signature expired at %s", time.Unix(n, 0).UTC().Format(time.RFC3339))
		}
		exp = &n
	}
	want := Signature(q.Get("path"), op, q.Get("username"), string(s.token), exp)
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) != 1 {
		return errdefs.Unauthenticated("invalid signature")
	}
	return nil
}

// refuse answers a request that authentication turned down.
func (s *Service) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if isConnect(r) {
		_ = connect.NewErrorWriter().Write(w, r, toConnect(err))
		return
	}
	edge.DrainBodyUpTo(w, r, false, edge.PreAuthDrainLimit)
	writeHTTPError(w, err)
}

// basicUser returns the user named by a Basic Authorization value ("" when
// there is none; other schemes are ignored).
func basicUser(h string) (string, error) {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", nil
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", errdefs.Unauthenticated("authorization: invalid Basic credentials: %v", err)
	}
	name, _, _ := strings.Cut(string(b), ":")
	return name, nil
}

// resolveUser resolves the user name (empty: the default user).
func (s *Service) resolveUser(name string) (identity, error) {
	if us := s.cfg.Users; us != nil {
		id := us.Default
		spec := ""
		if name != "" {
			var err error
			if id, err = us.Resolve(name); err != nil {
				if errdefs.IsPermissionDenied(err) {
					return identity{}, err
				}
				return identity{}, errdefs.Unauthenticated("invalid user %q: %v", name, err)
			}
			spec = name
		}
		return s.withBase(id, spec, id.UID == us.Default.UID), nil
	}
	self, err := currentUser()
	if err != nil {
		return identity{}, err
	}
	if name != "" && name != self.Name && name != strconv.FormatUint(uint64(self.UID), 10) {
		return identity{}, errdefs.Unauthenticated("invalid user %q: the agent runs as %s and cannot act as another user", name, self.Name)
	}
	return s.withBase(self, "", true), nil
}

func (s *Service) withBase(id users.Identity, spec string, isDefault bool) identity {
	base := id.Home
	if isDefault && s.cfg.WorkDir != "" {
		base = s.cfg.WorkDir
	}
	if base == "" {
		base = "/"
	}
	return identity{Identity: id, spec: spec, base: base}
}

// currentUser describes the agent's own user.
func currentUser() (users.Identity, error) {
	id := users.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
	u, err := user.LookupId(strconv.Itoa(os.Geteuid()))
	switch {
	case err == nil:
		id.Name, id.Home = u.Username, u.HomeDir
	case errors.As(err, new(user.UnknownUserIdError)):
		id.Name = strconv.Itoa(os.Geteuid())
	default:
		return users.Identity{}, errdefs.Internal("look up the agent's user: %v", err)
	}
	if id.Home == "" {
		id.Home = "/"
	}
	return id, nil
}

// abs resolves p for the request's user: relative paths (and "") in the
// user's base directory.
func (id identity) abs(p string) string {
	if p == "" {
		return id.base
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		return filepath.Join(id.Home, p[1:])
	}
	if !filepath.IsAbs(p) {
		return filepath.Join(id.base, p)
	}
	return filepath.Clean(p)
}
