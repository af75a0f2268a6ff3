package lease

import (
	"fmt"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// DefaultUserImages are the image prefixes Config.DefaultUser applies to
// when Config.DefaultUserImages is empty: berth's own images, which carry
// the "sandbox" user (uid 1000).
var DefaultUserImages = []string{"berth/"}

// leaseUser returns the user a new lease's commands run as: the request's,
// else Config.DefaultUser for images matching Config.DefaultUserImages,
// else "" (the image's own user). A user that is root by spelling ("root",
// "0", "root:…", "0:…") is PermissionDenied when Config.DenyRootUser is
// set; names that only resolve to uid 0 inside the image are refused by the
// agent (its --allow-root=false).
func (m *Manager) leaseUser(image, user string) (string, error) {
	if !runtime.ValidUser(user) {
		return "", errdefs.InvalidArgument("user", "%q: want NAME, UID, NAME:GROUP or UID:GID (at most %d characters)", user, runtime.MaxUserLen)
	}
	if user == "" && m.cfg.DefaultUser != "" {
		fam, err := familiarImage(image)
		if err != nil {
			fam = image
		}
		prefixes := m.cfg.DefaultUserImages
		if len(prefixes) == 0 {
			prefixes = DefaultUserImages
		}
		for _, p := range prefixes {
			if p == "*" || strings.HasPrefix(fam, p) || strings.HasPrefix(image, p) {
				user = m.cfg.DefaultUser
				break
			}
		}
	}
	if m.cfg.DenyRootUser {
		u, _, _ := strings.Cut(user, ":")
		if u == "root" || strings.Trim(u, "0") == "" && u != "" {
			return "", fmt.Errorf("%w: user: %q is root, which this orchestrator's policy forbids", errdefs.ErrPermissionDenied, user)
		}
	}
	return user, nil
}
