package process

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/agent/users"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// TestCommandUser runs commands as the default user and as named users
// (credentials, supplementary groups, HOME/USER/LOGNAME) and checks the
// root policy. It needs root, as the agent in a sandbox is.
func TestCommandUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "running commands as other users needs root")
	}
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/sh\nbuilder:x:1001:1001::/home/builder:/bin/sh\n"), 0o644)
	os.WriteFile(group, []byte("root:x:0:\nsandbox:x:1000:\nbuilder:x:1001:\nshared:x:2000:sandbox\n"), 0o644)
	def, err := users.Lookup("sandbox", passwd, group)
	if err != nil {
		t.Fatal(err)
	}
	us := &users.Resolver{Default: def, AllowRoot: false, Passwd: passwd, Group: group}
	r := newRunner(t, Config{Users: us, WorkDir: "/"})
	ctx := context.Background()

	res, err := r.Exec(ctx, Spec{Command: `id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"`})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Stdout); got != "1000\n1000\n1000 2000\n/home/sandbox sandbox sandbox\n" {
		t.Errorf("default user: %q", got)
	}
	res, err = r.Exec(ctx, Spec{Command: `id -u; echo "$HOME"`, User: "builder", Env: map[string]string{"HOME": "/tmp"}})
	if err != nil || string(res.Stdout) != "1001\n/tmp\n" {
		t.Errorf("as builder (HOME overridden by Env): %q, %v", res.Stdout, err)
	}
	for _, u := range []string{"root", "0", "0:1000"} {
		if _, err := r.Exec(ctx, Spec{Argv: []string{"true"}, User: u}); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("as %s with root forbidden: %v, want PermissionDenied", u, err)
		}
	}
	if _, err := r.Exec(ctx, Spec{Argv: []string{"true"}, User: "ghost"}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "user") {
		t.Errorf("as a missing user: %v, want InvalidArgument naming user", err)
	}
	// Background processes too.
	info, err := r.Start(ctx, Spec{Command: "id -u", User: "builder"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := r.Logs(ctx, info.ID, true, func(ev Event) error { out.Write(ev.Data); return nil }); err != nil {
		t.Fatal(err)
	}
	if out.String() != "1001\n" {
		t.Errorf("background as builder: %q", out.String())
	}
	// Without a resolver a user is refused.
	plain := newRunner(t, Config{})
	if _, err := plain.Exec(ctx, Spec{Argv: []string{"true"}, User: "sandbox"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("user without a resolver: %v, want FailedPrecondition", err)
	}
}
