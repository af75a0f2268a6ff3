package files

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newTestFS returns an FS that logs to the test.
func newTestFS(t testing.TB, cfg Config) *FS {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return New(cfg)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// bigSize is the size of the large transfer tests: 200 MiB, or 16 MiB under
// -race or -short.
func bigSize() int64 {
	if raceEnabled || testing.Short() {
		return 16 << 20
	}
	return 200 << 20
}

// prng returns n deterministic pseudo-random bytes from seed, generated as
// they are read (nothing is held in memory).
func prng(seed uint64, n int64) io.Reader {
	var s [32]byte
	s[0] = byte(seed)
	s[1] = byte(seed >> 8)
	return io.LimitReader(rand.NewChaCha8(s), n)
}

// prngSum returns the hex SHA-256 of prng(seed, n).
func prngSum(t testing.TB, seed uint64, n int64) string {
	t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, prng(seed, n)); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sumBytes(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// dirNames returns the names in dir.
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func hasTemp(names []string) bool {
	for _, n := range names {
		if strings.HasPrefix(n, TempPrefix) {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds or 15 s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitTemp waits until an upload's temporary file exists in dir.
func waitTemp(t testing.TB, dir string) {
	t.Helper()
	waitFor(t, "a temporary upload file in "+dir, func() bool { return hasTemp(dirNames(t, dir)) })
}

// waitEmpty waits until dir holds nothing but the names in keep.
func waitEmpty(t testing.TB, dir string, keep ...string) {
	t.Helper()
	var names []string
	waitFor(t, dir+" to be empty", func() bool {
		names = names[:0]
		for _, n := range dirNames(t, dir) {
			if !contains(keep, n) {
				names = append(names, n)
			}
		}
		return len(names) == 0
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func writeFile(t testing.TB, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// failingReader yields n bytes of data, then err.
type failingReader struct {
	n   int64
	err error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, r.err
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	for i := range p {
		p[i] = byte(i)
	}
	r.n -= int64(len(p))
	return len(p), nil
}

// wantErr fails unless err is in the category is and its message contains
// every string in parts.
func wantErr(t testing.TB, err error, is func(error) bool, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error, got nil")
	}
	if !is(err) {
		t.Fatalf("wrong category: %v", err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not mention %q", err, p)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
