package lease

import (
	"context"
	"errors"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// TestLeaseUser: the default user applies to berth's images only, an
// acquire's user wins, the lease and the runtime spec carry it, and a root
// user is refused at acquire when the policy forbids root (which the spec
// passes on to the agent).
func TestLeaseUser(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Admission.DefaultUser = "sandbox"; c.Admission.DenyRootUser = true })
	ctx := context.Background()
	for i, tc := range []struct {
		image, user, want string
	}{
		{"berth/base", "", "sandbox"},
		{"docker.io/berth/minimal:latest", "", "sandbox"},
		{"debian:bookworm", "", ""},
		{"berth/base", "nobody", "nobody"},
		{"berth/base", "1000:1000", "1000:1000"},
	} {
		l, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "u-" + string(rune('a'+i)), Image: tc.image, User: tc.user})
		if err != nil {
			t.Fatalf("%s/%q: %v", tc.image, tc.user, err)
		}
		spec := h.rt.specs[len(h.rt.specs)-1]
		if l.User != tc.want || spec.User != tc.want || !spec.DenyRootUser {
			t.Errorf("%s/%q: lease user %q, spec user %q deny root %v; want %q", tc.image, tc.user, l.User, spec.User, spec.DenyRootUser, tc.want)
		}
	}
	for _, u := range []string{"root", "0", "0:0", "000", "root:sandbox"} {
		_, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "root-" + u, User: u})
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("user %q with root forbidden: %v, want PermissionDenied", u, err)
		}
	}
	for _, u := range []string{"a b", "x\n", ":1000", "a:b:c", string(make([]byte, 100))} {
		_, _, _, err := h.m.Acquire(ctx, AcquireRequest{ConversationID: "bad", User: u})
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("user %q: %v, want InvalidArgument", u, err)
		}
	}
}
