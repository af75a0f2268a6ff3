package lease

import (
	"fmt"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// DefaultUserImages are the image prefixes AdmissionConfig.DefaultUser
// applies to when AdmissionConfig.DefaultUserImages is empty: berth's own
// images, which carry the "sandbox" user (uid 1000).
var DefaultUserImages = []string{"berth/"}

// leaseUser returns the user a new lease's commands run as: the request's,
// else AdmissionConfig.DefaultUser for images matching its
// DefaultUserImages, else "" (the image's own user). A user that is root
// by spelling ("root", "0", "root:…", "0:…") is PermissionDenied when
// AdmissionConfig.DenyRootUser is set; names that only resolve to uid 0 inside the image are refused by the
// agent (its --allow-root=false).
func (a *admission) leaseUser(image, user string) (string, error) {
	if !runtime.ValidUser(user) {
		return "", errdefs.InvalidArgument("user", "%q: want NAME, UID, NAME:GROUP or UID:GID (at most %d characters)", user, runtime.MaxUserLen)
	}
	if user == "" && a.cfg.DefaultUser != "" {
		fam, err := familiarImage(image)
		if err != nil {
			fam = image
		}
		for _, p := range a.cfg.DefaultUserImages { // withDefaults filled it
			if p == "*" || strings.HasPrefix(fam, p) || strings.HasPrefix(image, p) {
				user = a.cfg.DefaultUser
				break
			}
		}
	}
	if a.cfg.DenyRootUser {
		u, _, _ := strings.Cut(user, ":")
		if u == "root" || strings.Trim(u, "0") == "" && u != "" {
			return "", fmt.Errorf("%w: user: %q is root, which this orchestrator's policy forbids", errdefs.ErrPermissionDenied, user)
		}
	}
	return user, nil
}
