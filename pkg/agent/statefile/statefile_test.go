package statefile

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// agentDir makes a state directory as an agent following the protocol
// leaves it: the empty state file and the marker.
func agentDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{Name, Marker} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestWriteClaim: the configuration replaces the empty file whole (mode
// 0600, no temporary file left), once.
func TestWriteClaim(t *testing.T) {
	dir := agentDir(t)
	want := Config{Env: map[string]string{"A": "1"}, Secrets: map[string]string{"S": "x"}}
	if !Usable(dir) {
		t.Fatal("not usable")
	}
	if err := WriteClaim(dir, want); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, Name))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil || got.Env["A"] != "1" || got.Secrets["S"] != "x" || len(got.Env) != 1 || len(got.Secrets) != 1 {
		t.Fatalf("state file %s: %+v %v", b, got, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, Name)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Fatalf("directory holds %v, want the state file and the marker", ents)
	}
	if Usable(dir) {
		t.Fatal("usable once configured")
	}
	if err := WriteClaim(dir, want); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("second WriteClaim: %v, want FAILED_PRECONDITION", err)
	}
}

// TestWriteClaimNotLocal: without the agent's marker, its empty file, or
// the directory itself, or with a state file that is a symbolic link,
// WriteClaim writes nothing and says so (the caller uses gRPC).
func TestWriteClaimNotLocal(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, mk := range map[string]func(t *testing.T) string{
		"no directory": func(t *testing.T) string { return filepath.Join(t.TempDir(), "missing") },
		"no marker": func(t *testing.T) string {
			dir := agentDir(t)
			if err := os.Remove(filepath.Join(dir, Marker)); err != nil {
				t.Fatal(err)
			}
			return dir
		},
		"no state file": func(t *testing.T) string {
			dir := agentDir(t)
			if err := os.Remove(filepath.Join(dir, Name)); err != nil {
				t.Fatal(err)
			}
			return dir
		},
		"state file is a link out": func(t *testing.T) string {
			dir := agentDir(t)
			if err := os.Remove(filepath.Join(dir, Name)); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(dir, Name)); err != nil {
				t.Fatal(err)
			}
			return dir
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := mk(t)
			if Usable(dir) {
				t.Fatal("usable")
			}
			if err := WriteClaim(dir, Config{Env: map[string]string{"A": "1"}}); !errors.Is(err, ErrNotLocal) {
				t.Fatalf("WriteClaim: %v, want ErrNotLocal", err)
			}
			if b, err := os.ReadFile(outside); err != nil || len(b) != 0 {
				t.Fatalf("the file outside: %q %v", b, err)
			}
		})
	}
}

// TestClaimed: the file the agent holds is claimed once a configuration
// is written into it (in place) or renamed over its name (a big one), not
// before.
func TestClaimed(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"in place": {"A": "1"},
		"renamed":  {"BIG": strings.Repeat("v", 2*InPlaceMax)},
	} {
		t.Run(name, func(t *testing.T) {
			dir := agentDir(t)
			f, err := os.OpenFile(filepath.Join(dir, Name), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if c, err := Claimed(f); err != nil || c {
				t.Fatalf("before: %v %v", c, err)
			}
			if err := WriteClaim(dir, Config{Env: env}); err != nil {
				t.Fatal(err)
			}
			if c, err := Claimed(f); err != nil || !c {
				t.Fatalf("after WriteClaim: %v %v", c, err)
			}
			b, err := os.ReadFile(filepath.Join(dir, Name))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := Decode(b); err != nil || !maps.Equal(got.Env, env) {
				t.Fatalf("state file: %d bytes, %v", len(b), err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 2 {
				t.Fatalf("directory holds %v, want the state file and the marker", ents)
			}
			if fi, err := os.Stat(filepath.Join(dir, Name)); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("mode: %v %v", fi, err)
			}
		})
	}
}
