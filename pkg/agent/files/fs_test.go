package files

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

func TestUploadDownloadLarge(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	size := bigSize()
	want := prngSum(t, 1, size)
	p := filepath.Join(dir, "big.bin")

	start := time.Now()
	res, err := f.Upload(context.Background(), UploadOptions{Path: p}, prng(1, size))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("uploaded %d MiB in %v", size>>20, time.Since(start))
	if res.Size != size || res.SHA256 != want || res.Path != p || !res.Created {
		t.Fatalf("result %+v, want size %d sha256 %s", res, size, want)
	}

	start = time.Now()
	rd, err := f.Open(context.Background(), p, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if rd.Info.Size != size || rd.Length != size || rd.Info.Type != TypeFile {
		t.Fatalf("info %+v length %d", rd.Info, rd.Length)
	}
	h := sumReader(t, rd)
	t.Logf("downloaded %d MiB in %v", size>>20, time.Since(start))
	if h != want {
		t.Fatalf("download sha256 %s, want %s", h, want)
	}
	if got := dirNames(t, dir); !slices.Equal(got, []string{"big.bin"}) {
		t.Fatalf("dir holds %v", got)
	}
}

// smallReads hands out its reader's data at most n bytes per Read, the
// way a socket does.
type smallReads struct {
	r io.Reader
	n int
}

func (s smallReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.n)]) }

// TestUploadBlocksAndOptions checks the digest over many blocks filled by
// short reads (the hashing goroutine's path) and over one (the inline
// path), and NoDigest.
func TestUploadBlocksAndOptions(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	ctx := context.Background()
	for _, size := range []int64{0, 1, uploadBlock - 1, uploadBlock, uploadBlock + 1, 5*uploadBlock + 12345} {
		p := filepath.Join(dir, fmt.Sprintf("f%d", size))
		res, err := f.Upload(ctx, UploadOptions{Path: p}, smallReads{prng(7, size), 40000})
		if err != nil {
			t.Fatal(err)
		}
		if want := prngSum(t, 7, size); res.Size != size || res.SHA256 != want {
			t.Fatalf("size %d: result %+v, want sha256 %s", size, res, want)
		}
		if got := sumReader(t, openFile(t, p)); got != res.SHA256 {
			t.Fatalf("size %d: the file has sha256 %s, the result says %s", size, got, res.SHA256)
		}
	}

	// NoDigest: no digest, the same content.
	p := filepath.Join(dir, "nodigest")
	size := int64(3*uploadBlock + 7)
	res, err := f.Upload(ctx, UploadOptions{Path: p, NoDigest: true}, prng(8, size))
	if err != nil || res.SHA256 != "" || res.Size != size {
		t.Fatalf("NoDigest: %+v, %v", res, err)
	}
	if got := sumReader(t, openFile(t, p)); got != prngSum(t, 8, size) {
		t.Fatal("NoDigest: wrong content")
	}
	// ...which an expected digest overrides.
	_, err = f.Upload(ctx, UploadOptions{Path: p, NoDigest: true, ExpectedSHA256: strings.Repeat("0", 64)}, prng(8, size))
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("NoDigest with a wrong expected digest: %v", err)
	}
}

func openFile(t *testing.T, p string) *os.File {
	t.Helper()
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fh.Close() })
	return fh
}

func sumReader(t testing.TB, r io.Reader) string {
	t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestUploadReaderFailsLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	boom := errors.New("boom")

	// A new file: nothing at all is left.
	_, err := f.Upload(context.Background(), UploadOptions{Path: filepath.Join(dir, "new.bin")}, &failingReader{n: 3 << 20, err: boom})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Fatalf("dir holds %v after a failed upload", names)
	}

	// An existing file: it is left untouched.
	old := filepath.Join(dir, "old.txt")
	writeFile(t, old, "old content")
	_, err = f.Upload(context.Background(), UploadOptions{Path: old}, &failingReader{n: 1 << 20, err: io.ErrUnexpectedEOF})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	if got := readFile(t, old); got != "old content" {
		t.Fatalf("old file now %q", got)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"old.txt"}) {
		t.Fatalf("dir holds %v", names)
	}
}

// cancelReader cancels its context after n bytes and keeps yielding data.
type cancelReader struct {
	n      int64
	cancel context.CancelFunc
}

func (r *cancelReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		r.cancel()
	}
	r.n -= int64(len(p))
	return len(p), nil
}

func TestUploadCancelledLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "x.bin")}, &cancelReader{n: 2 << 20, cancel: cancel})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Fatalf("dir holds %v after a cancelled upload", names)
	}

	// Already cancelled before the start.
	_, err = f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "y.bin")}, strings.NewReader("data"))
	if !errdefs.IsCanceled(err) {
		t.Fatalf("err = %v", err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Fatalf("dir holds %v", names)
	}
}

func TestUploadOptions(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{Sync: true})
	ctx := context.Background()
	p := filepath.Join(dir, "a.txt")

	res, err := f.Upload(ctx, UploadOptions{Path: p, Mode: 0o750}, strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || res.Size != 5 || res.SHA256 != sumBytes([]byte("hello")) {
		t.Fatalf("result %+v", res)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o750 {
		t.Fatalf("mode %v, want 0750 (exact, no umask)", fi.Mode())
	}

	// Replace (the default): Created is false, content and mode are new.
	res, err = f.Upload(ctx, UploadOptions{Path: p}, strings.NewReader("bye"))
	if err != nil || res.Created || readFile(t, p) != "bye" {
		t.Fatalf("replace: %+v %v %q", res, err, readFile(t, p))
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Fatalf("default mode %v, want 0644", fi.Mode())
	}

	// Fail policy on an existing file.
	_, err = f.Upload(ctx, UploadOptions{Path: p, Overwrite: OverwriteFail}, strings.NewReader("nope"))
	wantErr(t, err, errdefs.IsAlreadyExists, p)
	if readFile(t, p) != "bye" {
		t.Fatal("fail policy changed the file")
	}
	// Fail policy on a new file works.
	if _, err := f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "b.txt"), Overwrite: OverwriteFail}, strings.NewReader("b")); err != nil {
		t.Fatal(err)
	}
	// Fail policy on a dangling symlink: it exists.
	if err := os.Symlink("nowhere", filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	_, err = f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "dangling"), Overwrite: OverwriteFail}, strings.NewReader("x"))
	wantErr(t, err, errdefs.IsAlreadyExists)

	// Replacing a symlink replaces the link, not its target.
	writeFile(t, filepath.Join(dir, "target.txt"), "target")
	if err := os.Symlink("target.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "link")}, strings.NewReader("new")); err != nil {
		t.Fatal(err)
	}
	if readFile(t, filepath.Join(dir, "target.txt")) != "target" {
		t.Fatal("upload wrote through the symlink")
	}
	if fi, _ := os.Lstat(filepath.Join(dir, "link")); !fi.Mode().IsRegular() {
		t.Fatal("link not replaced by a regular file")
	}

	// Missing parent, then with CreateParents.
	deep := filepath.Join(dir, "x", "y", "z.txt")
	_, err = f.Upload(ctx, UploadOptions{Path: deep}, strings.NewReader("z"))
	wantErr(t, err, errdefs.IsNotFound, filepath.Join(dir, "x", "y"))
	if _, err := f.Upload(ctx, UploadOptions{Path: deep, CreateParents: true}, strings.NewReader("z")); err != nil {
		t.Fatal(err)
	}
	if readFile(t, deep) != "z" {
		t.Fatal("wrong content")
	}

	// Target is a directory; parent is a file.
	_, err = f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "x")}, strings.NewReader("z"))
	wantErr(t, err, errdefs.IsFailedPrecondition, "is a directory")
	_, err = f.Upload(ctx, UploadOptions{Path: filepath.Join(p, "child")}, strings.NewReader("z"))
	wantErr(t, err, errdefs.IsFailedPrecondition, "not a directory")
	_, err = f.Upload(ctx, UploadOptions{Path: filepath.Join(p, "child"), CreateParents: true}, strings.NewReader("z"))
	wantErr(t, err, errdefs.IsFailedPrecondition)

	// Expected hash: a match succeeds, a mismatch leaves nothing.
	if _, err := f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "h1"), ExpectedSHA256: strings.ToUpper(sumBytes([]byte("h")))}, strings.NewReader("h")); err != nil {
		t.Fatal(err)
	}
	_, err = f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "h2"), ExpectedSHA256: sumBytes([]byte("other"))}, strings.NewReader("h"))
	wantErr(t, err, errdefs.IsInvalidArgument, "sha256")
	_, err = f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "h3"), ExpectedSHA256: "abc"}, strings.NewReader("h"))
	wantErr(t, err, errdefs.IsInvalidArgument, "sha256")
	if exists(filepath.Join(dir, "h2")) || exists(filepath.Join(dir, "h3")) || hasTemp(dirNames(t, dir)) {
		t.Fatalf("failed uploads left %v", dirNames(t, dir))
	}

	// Setuid and sticky bits are carried.
	if _, err := f.Upload(ctx, UploadOptions{Path: filepath.Join(dir, "suid"), Mode: 0o755 | fs.ModeSetuid}, strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	if info, _ := f.Stat(ctx, filepath.Join(dir, "suid")); info.Mode != 0o755|fs.ModeSetuid || ModeToUnix(info.Mode) != 0o4755 {
		t.Fatalf("mode %v", info.Mode)
	}
	if hasTemp(dirNames(t, dir)) {
		t.Fatalf("temp files left: %v", dirNames(t, dir))
	}
}

func TestValidation(t *testing.T) {
	f := newTestFS(t, Config{})
	ctx := context.Background()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), "x")
	for _, tc := range []struct {
		name  string
		err   error
		field string
	}{
		{"relative upload", upErr(f, UploadOptions{Path: "a.txt"}), "path"},
		{"empty upload", upErr(f, UploadOptions{Path: ""}), "path"},
		{"NUL upload", upErr(f, UploadOptions{Path: "/tmp/a\x00b"}), "NUL"},
		{"root upload", upErr(f, UploadOptions{Path: "/"}), "path"},
		{"slash upload", upErr(f, UploadOptions{Path: dir + "/"}), "path"},
		{"bad mode", upErr(f, UploadOptions{Path: dir + "/m", Mode: fs.ModeDir | 0o755}), "mode"},
		{"bad policy", upErr(f, UploadOptions{Path: dir + "/m", Overwrite: 7}), "overwrite"},
		{"relative stat", second(f.Stat(ctx, "rel/x")), "path"},
		{"NUL stat", second(f.Stat(ctx, "/a\x00")), "path"},
		{"relative open", second(f.Open(ctx, "x", 0, 0)), "path"},
		{"negative offset", second(f.Open(ctx, dir+"/f", -1, 0)), "offset"},
		{"negative length", second(f.Open(ctx, dir+"/f", 0, -1)), "length"},
		{"offset beyond", second(f.Open(ctx, dir+"/f", 2, 0)), "offset"},
		{"relative list", second(f.List(ctx, "x", 1)), "path"},
		{"negative depth", second(f.List(ctx, dir, -1)), "depth"},
		{"relative mkdir", f.MakeDir(ctx, "x", false, 0), "path"},
		{"mkdir mode", f.MakeDir(ctx, dir+"/d", false, fs.ModeSymlink), "mode"},
		{"relative source", f.Move(ctx, "x", "/y", false), "source"},
		{"relative destination", f.Move(ctx, dir+"/f", "y", false), "destination"},
		{"root source", f.Move(ctx, "/", dir+"/y", false), "source"},
		{"NUL destination", f.Move(ctx, dir+"/f", "/y\x00", false), "destination"},
		{"relative remove", f.Remove(ctx, "x", false), "path"},
		{"root remove", f.Remove(ctx, "/", true), "root"},
		{"root remove unclean", f.Remove(ctx, "/tmp/..", true), "root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, tc.err, errdefs.IsInvalidArgument, tc.field)
		})
	}
	if !exists(dir+"/f") || exists(dir+"/d") || exists(dir+"/m") {
		t.Fatal("a rejected request changed the file system")
	}
}

func upErr(f *FS, o UploadOptions) error {
	_, err := f.Upload(context.Background(), o, strings.NewReader("x"))
	return err
}

func second[T any](_ T, err error) error { return err }

func TestOpenRanges(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	ctx := context.Background()
	p := filepath.Join(dir, "digits")
	writeFile(t, p, "0123456789")

	for _, tc := range []struct {
		offset, length int64
		want           string
	}{
		{0, 0, "0123456789"},
		{3, 0, "3456789"},
		{3, 4, "3456"},
		{8, 100, "89"},
		{10, 0, ""},
		{0, 1, "0"},
	} {
		rd, err := f.Open(ctx, p, tc.offset, tc.length)
		if err != nil {
			t.Fatal(err)
		}
		// Read via Read (small buffer) and via WriteTo.
		var a, b bytes.Buffer
		if _, err := io.CopyBuffer(&a, struct{ io.Reader }{rd}, make([]byte, 3)); err != nil {
			t.Fatal(err)
		}
		rd.Close()
		rd, _ = f.Open(ctx, p, tc.offset, tc.length)
		if _, err := rd.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		rd.Close()
		if a.String() != tc.want || b.String() != tc.want || rd.Length != int64(len(tc.want)) || rd.Offset != tc.offset {
			t.Fatalf("offset %d length %d: got %q / %q (Length %d), want %q", tc.offset, tc.length, a.String(), b.String(), rd.Length, tc.want)
		}
	}

	_, err := f.Open(ctx, p, 11, 0)
	wantErr(t, err, errdefs.IsInvalidArgument, "offset", "beyond")
	_, err = f.Open(ctx, dir, 0, 0)
	wantErr(t, err, errdefs.IsFailedPrecondition, "directory")
	_, err = f.Open(ctx, filepath.Join(dir, "missing"), 0, 0)
	wantErr(t, err, errdefs.IsNotFound, "missing")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = f.Open(ctx, fifo, 0, 0)
	wantErr(t, err, errdefs.IsFailedPrecondition, "not a regular file")

	// Symlinks are followed.
	if err := os.Symlink("digits", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	rd, err := f.Open(ctx, filepath.Join(dir, "link"), 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rd)
	rd.Close()
	if string(b) != "56789" || rd.Info.Type != TypeFile || rd.Info.Path != filepath.Join(dir, "link") {
		t.Fatalf("via link: %q %+v", b, rd.Info)
	}

	// A file that shrinks while read is an error, not a silent short read.
	rd, err = f.Open(ctx, p, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 4); err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(rd)
	rd.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("shrunk file: err = %v", err)
	}
}

func TestStat(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	ctx := context.Background()
	p := filepath.Join(dir, "f.txt")
	writeFile(t, p, "12345")
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f.txt", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}

	info, err := f.Stat(ctx, p+"/") // cleaned
	if err != nil {
		t.Fatal(err)
	}
	if info.Path != p || info.Name != "f.txt" || info.Type != TypeFile || info.Size != 5 || info.Mode != 0o640 || time.Since(info.ModTime) > time.Minute {
		t.Fatalf("file info %+v", info)
	}
	info, err = f.Stat(ctx, dir)
	if err != nil || info.Type != TypeDir || info.Type.String() != "dir" {
		t.Fatalf("dir info %+v %v", info, err)
	}
	info, err = f.Stat(ctx, filepath.Join(dir, "l"))
	if err != nil || info.Type != TypeSymlink || info.SymlinkTarget != "f.txt" {
		t.Fatalf("symlink info %+v %v", info, err)
	}
	info, err = f.Stat(ctx, "/")
	if err != nil || info.Type != TypeDir || info.Name != "/" {
		t.Fatalf("root info %+v %v", info, err)
	}
	info, err = f.Stat(ctx, "/dev/null")
	if err != nil || info.Type != TypeOther {
		t.Fatalf("/dev/null info %+v %v", info, err)
	}
	_, err = f.Stat(ctx, filepath.Join(dir, "nope"))
	wantErr(t, err, errdefs.IsNotFound, filepath.Join(dir, "nope"))
	_, err = f.Stat(ctx, filepath.Join(p, "under-a-file"))
	wantErr(t, err, errdefs.IsFailedPrecondition)
}

func TestList(t *testing.T) {
	root := t.TempDir()
	ctx := context.Background()
	// Names chosen so that lexical path order differs from a naive
	// depth-first walk: "a-b" and "a.txt" sort between "a" and "a/x".
	for _, p := range []string{"a/x", "a/y/z", "a/y/zz/deep", "a-b", "a.txt", "b/c", "ext/inside"} {
		writeFile(t, filepath.Join(root, p), p)
	}
	if err := os.Symlink("a", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	f := newTestFS(t, Config{})

	rel := func(res ListResult) []string {
		var out []string
		for _, e := range res.Entries {
			out = append(out, strings.TrimPrefix(e.Path, root+"/"))
		}
		return out
	}
	for depth, want := range map[int][]string{
		0: {"a", "a-b", "a.txt", "b", "ext", "link"},
		1: {"a", "a-b", "a.txt", "b", "ext", "link"},
		2: {"a", "a-b", "a.txt", "a/x", "a/y", "b", "b/c", "ext", "ext/inside", "link"},
		3: {"a", "a-b", "a.txt", "a/x", "a/y", "a/y/z", "a/y/zz", "b", "b/c", "ext", "ext/inside", "link"},
		9: {"a", "a-b", "a.txt", "a/x", "a/y", "a/y/z", "a/y/zz", "a/y/zz/deep", "b", "b/c", "ext", "ext/inside", "link"},
	} {
		res, err := f.List(ctx, root, depth)
		if err != nil {
			t.Fatal(err)
		}
		if got := rel(res); !slices.Equal(got, want) || res.Truncated {
			t.Fatalf("depth %d:\n got %v\nwant %v (truncated %v)", depth, got, want, res.Truncated)
		}
		if !slices.IsSortedFunc(res.Entries, func(a, b FileInfo) int { return strings.Compare(a.Path, b.Path) }) {
			t.Fatalf("depth %d: not in lexical order", depth)
		}
	}
	res, _ := f.List(ctx, root, 1)
	for _, e := range res.Entries {
		switch e.Name {
		case "link":
			if e.Type != TypeSymlink || e.SymlinkTarget != "a" {
				t.Fatalf("link entry %+v", e)
			}
		case "a.txt":
			if e.Type != TypeFile || e.Size != int64(len("a.txt")) {
				t.Fatalf("file entry %+v", e)
			}
		case "a":
			if e.Type != TypeDir {
				t.Fatalf("dir entry %+v", e)
			}
		}
	}

	// Truncation returns exactly the first entries in lexical order.
	small := newTestFS(t, Config{MaxListEntries: 4})
	res, err := small.List(ctx, root, 9)
	if err != nil {
		t.Fatal(err)
	}
	if got := rel(res); !slices.Equal(got, []string{"a", "a-b", "a.txt", "a/x"}) || !res.Truncated {
		t.Fatalf("truncated list %v truncated=%v", got, res.Truncated)
	}
	// Exactly at the limit is not truncated.
	exact := newTestFS(t, Config{MaxListEntries: 6})
	if res, _ := exact.List(ctx, root, 1); len(res.Entries) != 6 || res.Truncated {
		t.Fatalf("exact: %v truncated=%v", rel(res), res.Truncated)
	}

	// A symlink to a directory given as the path is followed.
	res, err = f.List(ctx, filepath.Join(root, "link"), 1)
	if err != nil || len(res.Entries) != 2 || res.Entries[0].Path != filepath.Join(root, "link", "x") {
		t.Fatalf("list via link: %+v %v", res, err)
	}

	_, err = f.List(ctx, filepath.Join(root, "a.txt"), 1)
	wantErr(t, err, errdefs.IsFailedPrecondition, "not a directory")
	_, err = f.List(ctx, filepath.Join(root, "missing"), 1)
	wantErr(t, err, errdefs.IsNotFound)
	empty := filepath.Join(root, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if res, err := f.List(ctx, empty, 3); err != nil || len(res.Entries) != 0 || res.Truncated {
		t.Fatalf("empty: %+v %v", res, err)
	}
}

func TestListMany(t *testing.T) {
	root := t.TempDir()
	for i := range 50 {
		for j := range 20 {
			writeFile(t, filepath.Join(root, fmt.Sprintf("d%02d", i), fmt.Sprintf("f%02d", j)), "")
		}
	}
	f := newTestFS(t, Config{MaxListEntries: 100})
	res, err := f.List(context.Background(), root, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Entries) != 100 || !res.Truncated {
		t.Fatalf("%d entries, truncated %v", len(res.Entries), res.Truncated)
	}
	// d00, its 20 files, d01, ...: 4*21 entries, then d04 and d04/f00..f14.
	if got := res.Entries[99].Path; got != filepath.Join(root, "d04", "f14") {
		t.Fatalf("last entry %s", got)
	}
}

func TestMakeDir(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	ctx := context.Background()
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)

	p := filepath.Join(dir, "d")
	if err := f.MakeDir(ctx, p, false, 0); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p); !fi.IsDir() || fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v, want 0755 despite the umask", fi.Mode())
	}
	wantErr(t, f.MakeDir(ctx, p, false, 0), errdefs.IsAlreadyExists, p)
	if err := f.MakeDir(ctx, p, true, 0); err != nil {
		t.Fatalf("parents on an existing dir: %v", err)
	}
	deep := filepath.Join(dir, "x", "y", "z")
	wantErr(t, f.MakeDir(ctx, deep, false, 0), errdefs.IsNotFound, filepath.Join(dir, "x", "y"))
	if err := f.MakeDir(ctx, deep, true, 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(deep); fi.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if err := f.MakeDir(ctx, filepath.Join(dir, "sticky"), false, 0o777|fs.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "sticky")); fi.Mode()&fs.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("sticky mode %v", fi.Mode())
	}
	file := filepath.Join(dir, "file")
	writeFile(t, file, "")
	wantErr(t, f.MakeDir(ctx, file, true, 0), errdefs.IsAlreadyExists, "not a directory")
	wantErr(t, f.MakeDir(ctx, file, false, 0), errdefs.IsAlreadyExists)
	wantErr(t, f.MakeDir(ctx, filepath.Join(file, "sub"), false, 0), errdefs.IsFailedPrecondition)
	wantErr(t, f.MakeDir(ctx, filepath.Join(file, "sub"), true, 0), errdefs.IsFailedPrecondition)
}

func TestMove(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	ctx := context.Background()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	writeFile(t, a, "A")

	if err := f.Move(ctx, a, b, false); err != nil {
		t.Fatal(err)
	}
	if exists(a) || readFile(t, b) != "A" {
		t.Fatal("move did not move")
	}
	writeFile(t, a, "A2")
	wantErr(t, f.Move(ctx, a, b, false), errdefs.IsAlreadyExists, b)
	if readFile(t, b) != "A" || readFile(t, a) != "A2" {
		t.Fatal("refused move changed files")
	}
	if err := f.Move(ctx, a, b, true); err != nil {
		t.Fatal(err)
	}
	if exists(a) || readFile(t, b) != "A2" {
		t.Fatal("overwrite did not replace")
	}
	if err := f.Move(ctx, b, b, false); err != nil {
		t.Fatalf("move onto itself: %v", err)
	}
	wantErr(t, f.Move(ctx, a, b, false), errdefs.IsNotFound, a)
	wantErr(t, f.Move(ctx, b, filepath.Join(dir, "no", "such"), false), errdefs.IsNotFound, filepath.Join(dir, "no"))

	d := filepath.Join(dir, "d")
	writeFile(t, filepath.Join(d, "sub", "f"), "F")
	wantErr(t, f.Move(ctx, d, filepath.Join(d, "sub", "d2"), false), errdefs.IsInvalidArgument, "destination", "inside")
	full := filepath.Join(dir, "full")
	writeFile(t, filepath.Join(full, "x"), "")
	wantErr(t, f.Move(ctx, d, full, true), errdefs.IsFailedPrecondition, "non-empty")
	wantErr(t, f.Move(ctx, b, full, true), errdefs.IsFailedPrecondition, "directory")
	wantErr(t, f.Move(ctx, d, b, true), errdefs.IsFailedPrecondition, "non-directory")
	emptyDir := filepath.Join(dir, "empty")
	if err := os.Mkdir(emptyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := f.Move(ctx, d, emptyDir, true); err != nil {
		t.Fatalf("dir over an empty dir: %v", err)
	}
	if readFile(t, filepath.Join(emptyDir, "sub", "f")) != "F" {
		t.Fatal("directory contents not moved")
	}
	// A symlink is moved, not its target.
	if err := os.Symlink("b", filepath.Join(dir, "ln")); err != nil {
		t.Fatal(err)
	}
	if err := f.Move(ctx, filepath.Join(dir, "ln"), filepath.Join(dir, "ln2"), false); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "ln2")); err != nil || target != "b" {
		t.Fatalf("moved link: %q %v", target, err)
	}
}

func TestMoveAcrossFileSystems(t *testing.T) {
	other, err := os.MkdirTemp("/dev/shm", "berth-files-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	dir := t.TempDir()
	var s1, s2 syscall.Stat_t
	if syscall.Stat(dir, &s1) != nil || syscall.Stat(other, &s2) != nil || s1.Dev == s2.Dev {
		t.Skip("the temp dir and /dev/shm are on the same file system")
	}
	f := newTestFS(t, Config{})
	ctx := context.Background()

	src := filepath.Join(dir, "f")
	writeFile(t, src, "cross")
	if err := os.Chmod(src, 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(other, "f")
	if err := f.Move(ctx, src, dst, false); err != nil {
		t.Fatal(err)
	}
	if exists(src) || readFile(t, dst) != "cross" {
		t.Fatal("cross-device move failed")
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v not kept", fi.Mode())
	}
	if err := os.Symlink("somewhere", src); err != nil {
		t.Fatal(err)
	}
	if err := f.Move(ctx, src, filepath.Join(other, "l"), false); err != nil {
		t.Fatal(err)
	}
	if target, _ := os.Readlink(filepath.Join(other, "l")); target != "somewhere" || exists(src) {
		t.Fatal("cross-device symlink move failed")
	}
	d := filepath.Join(dir, "d")
	writeFile(t, filepath.Join(d, "x"), "")
	wantErr(t, f.Move(ctx, d, filepath.Join(other, "d"), false), errdefs.IsFailedPrecondition, "across file systems")
	if names := dirNames(t, other); !slices.Equal(names, []string{"f", "l"}) {
		t.Fatalf("other fs holds %v", names)
	}
}

func TestRemove(t *testing.T) {
	dir := t.TempDir()
	f := newTestFS(t, Config{})
	ctx := context.Background()
	writeFile(t, filepath.Join(dir, "f"), "")
	writeFile(t, filepath.Join(dir, "d", "sub", "x"), "")
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d", filepath.Join(dir, "ln")); err != nil {
		t.Fatal(err)
	}

	if err := f.Remove(ctx, filepath.Join(dir, "f"), false); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(ctx, filepath.Join(dir, "empty"), false); err != nil {
		t.Fatal(err)
	}
	wantErr(t, f.Remove(ctx, filepath.Join(dir, "d"), false), errdefs.IsFailedPrecondition, "not empty", "recursive")
	if err := f.Remove(ctx, filepath.Join(dir, "ln"), true); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(dir, "d", "sub", "x")) {
		t.Fatal("removing a symlink removed its target")
	}
	if err := f.Remove(ctx, filepath.Join(dir, "d"), true); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Fatalf("left %v", names)
	}
	wantErr(t, f.Remove(ctx, filepath.Join(dir, "f"), false), errdefs.IsNotFound, filepath.Join(dir, "f"))
	wantErr(t, f.Remove(ctx, "/", true), errdefs.IsInvalidArgument, "path")
}

func TestOSErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		errno syscall.Errno
		cat   error
	}{
		{syscall.ENOENT, errdefs.ErrNotFound},
		{syscall.EEXIST, errdefs.ErrAlreadyExists},
		{syscall.EACCES, errdefs.ErrPermissionDenied},
		{syscall.EPERM, errdefs.ErrPermissionDenied},
		{syscall.ENOTDIR, errdefs.ErrFailedPrecondition},
		{syscall.EISDIR, errdefs.ErrFailedPrecondition},
		{syscall.ENOTEMPTY, errdefs.ErrFailedPrecondition},
		{syscall.EROFS, errdefs.ErrFailedPrecondition},
		{syscall.EXDEV, errdefs.ErrFailedPrecondition},
		{syscall.ENOSPC, errdefs.ErrResourceExhausted},
		{syscall.EDQUOT, errdefs.ErrResourceExhausted},
		{syscall.ENAMETOOLONG, errdefs.ErrInvalidArgument},
	} {
		err := osError("open", "/some/path", &fs.PathError{Op: "open", Path: "/tmp/.berth-upload-1", Err: tc.errno})
		if !errors.Is(err, tc.cat) || !errors.Is(err, tc.errno) || !strings.Contains(err.Error(), "/some/path") {
			t.Errorf("%v: got %v, want category %v", tc.errno, err, tc.cat)
		}
	}
	err := osError("read", "/p", syscall.EIO)
	if !errors.Is(err, syscall.EIO) || strings.HasPrefix(err.Error(), "internal") {
		t.Errorf("EIO: %v", err)
	}
	if err := osError("read", "/p", context.Canceled); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
	if osError("x", "/p", nil) != nil {
		t.Error("nil error mapped to non-nil")
	}
}

func TestPermissionDenied(t *testing.T) {
	// Root bypasses mode bits, but not sysfs: creating a file in
	// /sys/kernel is refused even to root.
	ro := "/sys/kernel"
	if os.Geteuid() != 0 {
		ro = filepath.Join(t.TempDir(), "ro")
		if err := os.Mkdir(ro, 0o555); err != nil {
			t.Fatal(err)
		}
	}
	f := newTestFS(t, Config{})
	_, err := f.Upload(context.Background(), UploadOptions{Path: filepath.Join(ro, "x")}, strings.NewReader("x"))
	wantErr(t, err, func(err error) bool { return errors.Is(err, errdefs.ErrPermissionDenied) }, ro)
}
