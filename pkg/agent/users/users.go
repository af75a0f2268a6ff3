// Package users resolves the user a sandbox's commands run as. The agent
// runs as root; each command runs as a user of the image, named like
// Docker's --user ("name", "uid", "name:group", "uid:gid") and resolved
// with the image's /etc/passwd and /etc/group (a numeric uid missing from
// /etc/passwd is allowed and runs with gid 0 unless one is given, as in
// Docker). Uid 0 can be forbidden by policy (PERMISSION_DENIED).
package users

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/moby/sys/user"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Default paths of the user databases.
const (
	PasswdPath = "/etc/passwd"
	GroupPath  = "/etc/group"
)

// MaxSpecLen bounds a user spec.
const MaxSpecLen = 256

// Identity is a resolved user.
type Identity struct {
	// Spec is what was asked for ("sandbox", "1000:1000", ...).
	Spec string
	// Name is the user's login name, or its uid when /etc/passwd has none.
	Name string
	// UID and GID are the numeric ids; Groups the supplementary groups.
	UID, GID uint32
	Groups   []uint32
	// Home is the home directory ("/" when /etc/passwd has none).
	Home string
}

// Root reports whether the identity is uid 0.
func (id Identity) Root() bool { return id.UID == 0 }

// Credential returns the credential a command runs with.
func (id Identity) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: append([]uint32(nil), id.Groups...)}
}

// Env returns HOME, USER and LOGNAME for the identity.
func (id Identity) Env() map[string]string {
	return map[string]string{"HOME": id.Home, "USER": id.Name, "LOGNAME": id.Name}
}

func (id Identity) String() string {
	return fmt.Sprintf("%s (uid %d, gid %d)", id.Name, id.UID, id.GID)
}

// Lookup resolves spec with the user databases at passwdPath and groupPath
// (either may be missing: then only numeric ids resolve). An empty spec is
// root. An unknown name is InvalidArgument (field "user").
func Lookup(spec, passwdPath, groupPath string) (Identity, error) {
	if len(spec) > MaxSpecLen || strings.ContainsAny(spec, "\x00\n") {
		return Identity{}, errdefs.InvalidArgument("user", "invalid user %q", spec)
	}
	s := spec
	if s == "" {
		s = "0"
	}
	eu, err := user.GetExecUserPath(s, &user.ExecUser{Home: "/"}, passwdPath, groupPath)
	if err != nil {
		return Identity{}, errdefs.InvalidArgument("user", "%q: %v", spec, err)
	}
	if eu.Uid < 0 || eu.Gid < 0 || eu.Uid > 1<<31 || eu.Gid > 1<<31 {
		return Identity{}, errdefs.InvalidArgument("user", "%q: ids out of range", spec)
	}
	id := Identity{Spec: spec, UID: uint32(eu.Uid), GID: uint32(eu.Gid), Home: eu.Home}
	for _, g := range eu.Sgids {
		if g >= 0 {
			id.Groups = append(id.Groups, uint32(g))
		}
	}
	if id.Home == "" {
		id.Home = "/"
	}
	id.Name = strconv.Itoa(eu.Uid)
	if us, err := user.ParsePasswdFileFilter(passwdPath, func(u user.User) bool { return u.Uid == eu.Uid }); err == nil && len(us) > 0 {
		id.Name = us[0].Name
	}
	return id, nil
}

// Resolver resolves per-command users against a default and a root policy.
type Resolver struct {
	// Default is the identity of commands that name no user.
	Default Identity
	// AllowRoot allows commands (and the default) to run as uid 0.
	AllowRoot bool
	// Passwd and Group are the user databases; default PasswdPath and
	// GroupPath.
	Passwd, Group string
}

// NewResolver resolves the default user spec and checks it against the
// policy.
func NewResolver(defaultSpec string, allowRoot bool) (*Resolver, error) {
	r := &Resolver{AllowRoot: allowRoot, Passwd: PasswdPath, Group: GroupPath}
	id, err := Lookup(defaultSpec, r.Passwd, r.Group)
	if err != nil {
		return nil, err
	}
	if id.Root() && !allowRoot {
		return nil, fmt.Errorf("%w: default user %q is root (uid 0), which the policy forbids", errdefs.ErrPermissionDenied, defaultSpec)
	}
	r.Default = id
	return r, nil
}

// Resolve returns the identity of spec ("" is the default). A spec that
// resolves to uid 0 is PermissionDenied when root is not allowed, whatever
// the user databases say now.
func (r *Resolver) Resolve(spec string) (Identity, error) {
	if spec == "" {
		return r.Default, nil
	}
	if spec == r.Default.Spec {
		return r.Default, nil
	}
	id, err := Lookup(spec, r.Passwd, r.Group)
	if err != nil {
		return Identity{}, err
	}
	if id.Root() && !r.AllowRoot {
		return Identity{}, fmt.Errorf("%w: user %q is root (uid 0), which this sandbox's policy forbids", errdefs.ErrPermissionDenied, spec)
	}
	return id, nil
}

// Chown gives path to the default user (lchown: a symlink itself, not its
// target). It does nothing when the agent is not root or the default user
// is root.
func (r *Resolver) Chown(path string) error {
	if r == nil || r.Default.Root() || os.Geteuid() != 0 {
		return nil
	}
	if err := os.Lchown(path, int(r.Default.UID), int(r.Default.GID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
