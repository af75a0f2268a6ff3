package git

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// DiffOptions selects a diff.
type DiffOptions struct {
	// Repo is the repository (absolute); default Config.WorkDir.
	Repo string
	// Ref is the commit the work tree is compared with; default HEAD (the
	// empty tree in a repository without commits).
	Ref string
	// File, when set, asks for that file's two versions instead of a unified
	// diff. Relative to the repository's top level, or absolute inside it.
	File string
}

// Diff is a unified diff of the work tree, or one file's two versions.
type Diff struct {
	// Unified is the unified diff (without File).
	Unified string
	// Path is the file (with File), relative to the top level.
	Path string
	// OldPath is the source of a rename or copy (with File).
	OldPath string
	// Kind is the file's change (with File); KindUnspecified when the file
	// is tracked and unchanged.
	Kind ChangeKind
	// Original is the file's text at Ref; empty when added or untracked.
	Original string
	// Modified is the file's text in the work tree; empty when deleted.
	Modified string
	// Binary is true when git considers the file binary or either version is
	// not valid UTF-8; Original and Modified are then empty.
	Binary bool
}

// diffFlags make the output independent of diff drivers and colors.
var diffFlags = []string{"--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/", "--dst-prefix=b/"}

// untrackedParallel bounds the concurrent `git diff --no-index` runs.
const untrackedParallel = 4

// Diff compares the work tree with opts.Ref: the unified diff of every
// change (untracked files included as additions), or, with opts.File, that
// file's original and modified text. See the package documentation.
func (g *Git) Diff(ctx context.Context, opts DiffOptions) (Diff, error) {
	dir, err := g.repoDir(opts.Repo)
	if err != nil {
		return Diff{}, err
	}
	ref := opts.Ref
	if ref == "" {
		ref = "HEAD"
	}
	if err := checkRef("ref", ref); err != nil {
		return Diff{}, err
	}
	if opts.File != "" {
		if err := checkFile(opts.File); err != nil {
			return Diff{}, err
		}
	}
	top, base, err := g.diffBase(ctx, dir, ref)
	if err != nil {
		return Diff{}, err
	}
	if opts.File == "" {
		return g.unified(ctx, top, base)
	}
	rel, err := relPath("file", top, opts.File)
	if err != nil {
		return Diff{}, err
	}
	return g.fileDiff(ctx, top, base, rel)
}

func checkFile(p string) error {
	if strings.ContainsAny(p, "\x00") {
		return errdefs.InvalidArgument("file", "must not contain NUL bytes")
	}
	return nil
}

// diffBase returns the work tree's top level and the commit (or the empty
// tree) that ref names.
func (g *Git) diffBase(ctx context.Context, dir, ref string) (top, base string, err error) {
	out, err := g.run(ctx, call{dir: dir, readOnly: true, args: []string{
		"rev-parse", "--show-toplevel", "--verify", "--quiet", ref + "^{commit}",
	}})
	if err != nil && exitCode(err) != 1 {
		return "", "", classify(dir, err)
	}
	// Output: the top level, then (when ref resolved) the commit id.
	s := strings.TrimSuffix(string(out), "\n")
	if err == nil {
		i := strings.LastIndexByte(s, '\n')
		if i < 0 {
			return "", "", fmt.Errorf("%w: unexpected rev-parse output %q", errdefs.ErrInternal, s)
		}
		return s[:i], s[i+1:], nil
	}
	top = s
	if top == "" {
		return "", "", errdefs.FailedPrecondition("%s is not a git work tree", dir)
	}
	if ref != "HEAD" {
		return "", "", errdefs.NotFound("ref %q does not name a commit in %s", ref, top)
	}
	// HEAD of a repository without commits: compare with the empty tree.
	base, err = g.emptyTree(ctx, top)
	return top, base, err
}

// unified returns `git diff base` plus untracked files as additions.
func (g *Git) unified(ctx context.Context, top, base string) (Diff, error) {
	args := append([]string{"-c", "core.quotePath=false", "diff", "--find-renames"}, diffFlags...)
	out, err := g.run(ctx, call{dir: top, readOnly: true, args: append(args, base, "--")})
	if err != nil {
		return Diff{}, classify(top, err)
	}
	untracked, err := g.untracked(ctx, top)
	if err != nil {
		return Diff{}, err
	}
	if len(untracked) == 0 {
		return Diff{Unified: string(out)}, nil
	}

	parts := make([][]byte, len(untracked))
	errs := make([]error, len(untracked))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, untrackedParallel)
	var wg sync.WaitGroup
	for i, p := range untracked {
		sem <- struct{}{}
		if ctx.Err() != nil {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			a := append([]string{"-c", "core.quotePath=false", "diff", "--no-index"}, diffFlags...)
			parts[i], errs[i] = g.run(ctx, call{dir: top, readOnly: true, okExit: 1, args: append(a, "--", os.DevNull, p)})
			if errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Diff{}, classify(top, err)
	}
	if ctx.Err() != nil {
		return Diff{}, ctx.Err()
	}
	var b bytes.Buffer
	b.Write(out)
	for _, p := range parts {
		if int64(b.Len()+len(p)) > g.cfg.MaxOutputBytes {
			return Diff{}, errdefs.ResourceExhausted("diff of %s larger than %d bytes", top, g.cfg.MaxOutputBytes)
		}
		b.Write(p)
	}
	return Diff{Unified: b.String()}, nil
}

// untracked lists the untracked, not ignored files under top.
func (g *Git) untracked(ctx context.Context, top string) ([]string, error) {
	out, err := g.run(ctx, call{dir: top, readOnly: true, args: []string{"ls-files", "-z", "--others", "--exclude-standard"}})
	if err != nil {
		return nil, classify(top, err)
	}
	var files []string
	for _, p := range strings.Split(string(out), "\x00") {
		if p != "" {
			files = append(files, p)
		}
	}
	return files, nil
}

// rawEntry is one entry of `git diff --raw`.
type rawEntry struct {
	srcMode, dstMode string
	srcOID, dstOID   string
	status           byte
	src, dst         string // src is set for renames and copies
}

// parseRaw parses `git diff --raw -z --no-abbrev`.
func parseRaw(out []byte) ([]rawEntry, error) {
	var ents []rawEntry
	s := strings.TrimSuffix(string(out), "\x00")
	if s == "" {
		return nil, nil
	}
	recs := strings.Split(s, "\x00")
	for i := 0; i < len(recs); i++ {
		r := recs[i]
		f := strings.Fields(strings.TrimPrefix(r, ":"))
		if !strings.HasPrefix(r, ":") || len(f) != 5 || f[4] == "" || i+1 >= len(recs) {
			return nil, fmt.Errorf("malformed raw diff entry %q", r)
		}
		e := rawEntry{srcMode: f[0], dstMode: f[1], srcOID: f[2], dstOID: f[3], status: f[4][0]}
		i++
		e.dst = recs[i]
		if e.status == 'R' || e.status == 'C' {
			if i+1 >= len(recs) {
				return nil, fmt.Errorf("malformed raw diff entry %q", r)
			}
			i++
			e.src, e.dst = e.dst, recs[i]
		}
		ents = append(ents, e)
	}
	return ents, nil
}

func rawKind(status byte) ChangeKind {
	switch status {
	case 'A':
		return KindAdded
	case 'D':
		return KindDeleted
	case 'R':
		return KindRenamed
	case 'C':
		return KindCopied
	case 'T':
		return KindTypeChanged
	case 'U':
		return KindConflicted
	default:
		return KindModified
	}
}

func isZeroOID(oid string) bool { return strings.Trim(oid, "0") == "" }

// fileDiff returns one file's versions at base and in the work tree.
func (g *Git) fileDiff(ctx context.Context, top, base, rel string) (Diff, error) {
	out, err := g.run(ctx, call{dir: top, readOnly: true, args: []string{
		"diff", "--raw", "-z", "--no-abbrev", "--find-renames", "--no-ext-diff", "--no-textconv", base, "--",
	}})
	if err != nil {
		return Diff{}, classify(top, err)
	}
	ents, err := parseRaw(out)
	if err != nil {
		return Diff{}, fmt.Errorf("%w: git diff in %s: %v", errdefs.ErrInternal, top, err)
	}
	var ent *rawEntry
	for i := range ents {
		if ents[i].dst == rel {
			ent = &ents[i]
			break
		}
	}
	if ent == nil {
		for i := range ents {
			if ents[i].src == rel {
				ent = &ents[i]
				break
			}
		}
	}
	unmerged, untracked, err := g.lsFile(ctx, top, rel)
	if err != nil {
		return Diff{}, err
	}

	d := Diff{Path: rel}
	srcOID, srcMode, dstMode := "", "", ""
	switch {
	case ent != nil:
		d.Path, d.OldPath, d.Kind = ent.dst, ent.src, rawKind(ent.status)
		srcOID, srcMode, dstMode = ent.srcOID, ent.srcMode, ent.dstMode
		if unmerged {
			d.Kind = KindConflicted
		}
	case untracked:
		d.Kind = KindUntracked
	default:
		// Tracked and unchanged, or not there at all.
		oid, ok, err := g.blobAt(ctx, top, base, rel)
		if err != nil {
			return Diff{}, err
		}
		if !ok {
			return Diff{}, errdefs.NotFound("file %q: no such tracked or untracked file in %s", rel, top)
		}
		srcOID = oid
		if unmerged {
			d.Kind = KindConflicted
		}
	}

	var orig, mod []byte
	switch {
	case srcOID == "" || isZeroOID(srcOID):
	case srcMode == "160000":
		orig = []byte("Subproject commit " + srcOID + "\n")
	default:
		if orig, err = g.run(ctx, call{dir: top, readOnly: true, args: []string{"cat-file", "blob", srcOID}}); err != nil {
			return Diff{}, classify(top, err)
		}
	}
	if d.Kind != KindDeleted {
		if mod, err = g.readWorkTree(ctx, top, d.Path, dstMode); err != nil {
			return Diff{}, err
		}
	}

	if looksBinary(orig) || looksBinary(mod) {
		d.Binary = true
	} else {
		paths := []string{d.Path}
		if d.OldPath != "" {
			paths = append(paths, d.OldPath)
		}
		if d.Binary, err = g.binaryAttr(ctx, top, paths); err != nil {
			return Diff{}, err
		}
	}
	if !d.Binary {
		d.Original, d.Modified = string(orig), string(mod)
	}
	return d, nil
}

// lsFile reports whether rel is unmerged, or untracked and not ignored.
func (g *Git) lsFile(ctx context.Context, top, rel string) (unmerged, untracked bool, err error) {
	out, err := g.run(ctx, call{dir: top, readOnly: true, args: []string{
		"ls-files", "-z", "--unmerged", "--others", "--exclude-standard", "--", rel,
	}})
	if err != nil {
		return false, false, classify(top, err)
	}
	for _, r := range strings.Split(string(out), "\x00") {
		switch {
		case r == rel:
			untracked = true
		case strings.HasSuffix(r, "\t"+rel):
			// "<mode> <oid> <stage>\t<path>"
			unmerged = true
		}
	}
	return unmerged, untracked, nil
}

// blobAt returns the id of rel in commit (or tree) base.
func (g *Git) blobAt(ctx context.Context, top, base, rel string) (string, bool, error) {
	out, err := g.run(ctx, call{dir: top, readOnly: true, args: []string{"rev-parse", "--verify", "--quiet", base + ":" + rel}})
	if exitCode(err) == 1 || exitCode(err) == 128 {
		return "", false, nil
	}
	if err != nil {
		return "", false, classify(top, err)
	}
	return strings.TrimSpace(string(out)), true, nil
}

// readWorkTree returns a work-tree file's content the way git sees it: a
// symlink's target, a submodule's "Subproject commit" line.
func (g *Git) readWorkTree(ctx context.Context, top, rel, mode string) ([]byte, error) {
	p := filepath.Join(top, filepath.FromSlash(rel))
	st, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", p, err)
	case st.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		return []byte(t), nil
	case st.IsDir():
		if mode != "160000" {
			return nil, nil
		}
		out, err := g.run(ctx, call{dir: p, readOnly: true, args: []string{"rev-parse", "--verify", "--quiet", "HEAD"}})
		if err != nil {
			return nil, nil
		}
		return []byte("Subproject commit " + strings.TrimSpace(string(out)) + "\n"), nil
	case !st.Mode().IsRegular():
		return nil, nil
	case st.Size() > g.cfg.MaxOutputBytes:
		return nil, errdefs.ResourceExhausted("file %q is larger than %d bytes", rel, g.cfg.MaxOutputBytes)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return b, nil
}

// looksBinary applies git's heuristic (a NUL byte in the first 8000 bytes)
// and also flags text that is not valid UTF-8.
func looksBinary(b []byte) bool {
	return bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 || !utf8.Valid(b)
}

// binaryAttr reports whether .gitattributes unsets the diff attribute
// (as "binary" or "-diff" do) for any of paths.
func (g *Git) binaryAttr(ctx context.Context, top string, paths []string) (bool, error) {
	out, err := g.run(ctx, call{dir: top, readOnly: true, args: append([]string{"check-attr", "-z", "diff", "--"}, paths...)})
	if err != nil {
		return false, classify(top, err)
	}
	// Triples: path, attribute, value.
	f := strings.Split(string(out), "\x00")
	for i := 0; i+2 < len(f); i += 3 {
		if f[i+2] == "unset" {
			return true, nil
		}
	}
	return false, nil
}
