package conformance

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/workspace"
)

// archiveCases test UploadArchive and DownloadArchive.
var archiveCases = []testCase{
	{"ArchiveRoundTrip", testArchiveRoundTrip},
	{"ArchiveMerge", testArchiveMerge},
	{"ArchiveRefusedLeavesNothing", testArchiveRefused},
}

// archiveTime is the modification time of the entries of testTar.
var archiveTime = time.Unix(1_600_000_000, 0)

// tarEntry is one entry of testTar: a directory (name ends in /), a
// symlink (link set) or a file.
type tarEntry struct {
	name, link, body string
	mode             int64
}

func testTar(t *testing.T, ents ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: archiveTime, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case strings.HasSuffix(e.name, "/"):
			h.Typeflag, h.Size = tar.TypeDir, 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(e.body))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func testArchiveRoundTrip(t *testing.T, ws workspace.Workspace) {
	in := testTar(t,
		tarEntry{name: "./", mode: 0o750},
		tarEntry{name: "bin/", mode: 0o755},
		tarEntry{name: "bin/run.sh", body: "#!/bin/sh\necho hi\n", mode: 0o755},
		tarEntry{name: "bin/secret", body: "s", mode: 0o600},
		tarEntry{name: "empty/", mode: 0o700},
		tarEntry{name: "link", link: "bin/run.sh", mode: 0o777},
	)
	if err := ws.UploadArchive(ctxFor(t), bytes.NewReader(in), "tree"); err != nil {
		t.Fatalf("UploadArchive(tree): %v", err)
	}
	want := map[string]struct {
		typ  workspace.FileType
		mode uint32
	}{
		"tree/bin": {workspace.TypeDir, 0o755}, "tree/bin/run.sh": {workspace.TypeFile, 0o755},
		"tree/bin/secret": {workspace.TypeFile, 0o600}, "tree/empty": {workspace.TypeDir, 0o700},
		"tree/link": {workspace.TypeSymlink, 0}, "tree": {workspace.TypeDir, 0o750},
	}
	for p, w := range want {
		fi, err := ws.Stat(ctxFor(t), p)
		if err != nil {
			t.Fatalf("Stat(%s): %v", p, err)
		}
		if fi.Type != w.typ || (w.typ != workspace.TypeSymlink && uint32(fi.Mode.Perm()) != w.mode) || !fi.ModTime.Equal(archiveTime) {
			t.Errorf("Stat(%s) = %v %v %v, want %v %o %v", p, fi.Type, fi.Mode, fi.ModTime, w.typ, w.mode, archiveTime)
		}
	}
	if got := sh(t, ws, "./tree/link"); got != "hi\n" {
		t.Errorf("running the uploaded script through its symlink: %q", got)
	}

	for _, gz := range []bool{false, true} {
		var buf bytes.Buffer
		if err := ws.DownloadArchive(ctxFor(t), "tree", &buf, workspace.ArchiveOptions{Gzip: gz}); err != nil {
			t.Fatalf("DownloadArchive(tree, gzip=%v): %v", gz, err)
		}
		var r io.Reader = &buf
		if gz {
			zr, err := gzip.NewReader(&buf)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		got := map[string]string{}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(tr)
			got[h.Name] = string(rune(h.Typeflag)) + " " + h.Linkname + string(body)
			if !h.ModTime.Equal(archiveTime) {
				t.Errorf("%s: mtime %v", h.Name, h.ModTime)
			}
		}
		for name, w := range map[string]string{
			"tree/": "5 ", "tree/bin/run.sh": "0 #!/bin/sh\necho hi\n", "tree/link": "2 bin/run.sh", "tree/empty/": "5 ",
		} {
			if got[name] != w {
				t.Errorf("gzip=%v: entry %s = %q, want %q (all: %q)", gz, name, got[name], w, got)
			}
		}
	}
	// A file is an archive of one entry; a missing path is NotFound.
	var one bytes.Buffer
	if err := ws.DownloadArchive(ctxFor(t), "tree/bin/secret", &one, workspace.ArchiveOptions{}); err != nil {
		t.Fatal(err)
	}
	if h, err := tar.NewReader(&one).Next(); err != nil || h.Name != "secret" || h.Mode&0o777 != 0o600 {
		t.Fatalf("archive of a file: %+v %v", h, err)
	}
	err := ws.DownloadArchive(ctxFor(t), "nope", io.Discard, workspace.ArchiveOptions{})
	wantCategory(t, "DownloadArchive(nope)", err, errdefs.ErrNotFound)
}

func testArchiveMerge(t *testing.T, ws workspace.Workspace) {
	sh(t, ws, "mkdir -p dst/src/keep && echo old > dst/src/old.txt && echo before > dst/src/a.txt")
	in := testTar(t,
		tarEntry{name: "src/", mode: 0o755},
		tarEntry{name: "src/a.txt", body: "after\n", mode: 0o644},
		tarEntry{name: "src/new/b.txt", body: "b\n", mode: 0o644},
	)
	if err := ws.UploadArchive(ctxFor(t), bytes.NewReader(in), "dst"); err != nil {
		t.Fatalf("UploadArchive(dst): %v", err)
	}
	if got := sh(t, ws, "cat dst/src/old.txt dst/src/a.txt dst/src/new/b.txt; test -d dst/src/keep && echo kept"); got != "old\nafter\nb\nkept\n" {
		t.Fatalf("merged tree: %q", got)
	}
	// A file over a directory is refused before anything moves.
	in = testTar(t, tarEntry{name: "src/z.txt", body: "z"}, tarEntry{name: "src/keep", body: "x"})
	err := ws.UploadArchive(ctxFor(t), bytes.NewReader(in), "dst")
	wantCategory(t, "UploadArchive of a file over a directory", err, errdefs.ErrFailedPrecondition)
	if got := sh(t, ws, "ls -A dst/src"); got != "a.txt\nkeep\nnew\nold.txt\n" {
		t.Fatalf("a refused merge changed the tree: %q", got)
	}
	// A missing parent is NotFound.
	err = ws.UploadArchive(ctxFor(t), bytes.NewReader(in), "no/such/dir")
	wantCategory(t, "UploadArchive under a missing parent", err, errdefs.ErrNotFound)
}

func testArchiveRefused(t *testing.T, ws workspace.Workspace) {
	sh(t, ws, "mkdir existing")
	for _, tc := range []struct {
		what string
		in   []byte
	}{
		{"../x", testTar(t, tarEntry{name: "ok", body: "ok"}, tarEntry{name: "../x", body: "x"})},
		{"/etc/x", testTar(t, tarEntry{name: "/etc/x", body: "x"})},
		{"etc/passwd", testTar(t, tarEntry{name: "etc", link: "sub"}, tarEntry{name: "etc/passwd", body: "x"})},
		{"abs", testTar(t, tarEntry{name: "abs", link: "/etc"})},
	} {
		for _, dir := range []string{"new", "existing"} {
			err := ws.UploadArchive(ctxFor(t), bytes.NewReader(tc.in), dir)
			wantCategory(t, "UploadArchive with "+tc.what, err, errdefs.ErrInvalidArgument)
			if !strings.Contains(err.Error(), tc.what) {
				t.Errorf("the error does not name the entry %q: %v", tc.what, err)
			}
		}
	}
	// A source that breaks, and a truncated archive, leave nothing either.
	in := testTar(t, tarEntry{name: "a", body: strings.Repeat("a", 300<<10)}, tarEntry{name: "b", body: "b"})
	err := ws.UploadArchive(ctxFor(t), io.MultiReader(bytes.NewReader(in[:200<<10]), &failingReader{}), "new")
	if !errors.Is(err, errBoom) {
		t.Fatalf("UploadArchive from a failing source: %v, want the source's error", err)
	}
	err = ws.UploadArchive(ctxFor(t), bytes.NewReader(in[:200<<10]), "new")
	wantCategory(t, "UploadArchive of a truncated archive", err, errdefs.ErrInvalidArgument)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := sh(t, ws, "ls -A . existing")
		if got == ".:\nexisting\n\nexisting:\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused archives left something behind: %q", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
