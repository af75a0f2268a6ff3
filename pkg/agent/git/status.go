package git

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// ChangeKind is how a path changed.
type ChangeKind int

// Change kinds. The values match berth.agent.v1.ChangeKind.
const (
	// KindUnspecified is an unchanged path (Diff of a file without changes).
	KindUnspecified ChangeKind = iota
	// KindAdded is a path that is new relative to HEAD (or the diff's ref).
	KindAdded
	// KindModified is a path whose content or mode changed.
	KindModified
	// KindDeleted is a path that was removed.
	KindDeleted
	// KindRenamed is a path that was moved from OldPath.
	KindRenamed
	// KindCopied is a path that was copied from OldPath.
	KindCopied
	// KindUntracked is a file git does not track and does not ignore.
	KindUntracked
	// KindConflicted is a path with an unresolved merge conflict.
	KindConflicted
	// KindTypeChanged is a path whose type changed (file, symlink, submodule).
	KindTypeChanged
)

var kindNames = [...]string{"unspecified", "added", "modified", "deleted", "renamed", "copied", "untracked", "conflicted", "type_changed"}

// String returns the kind's lower-case name.
func (k ChangeKind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "ChangeKind(" + strconv.Itoa(int(k)) + ")"
}

// FileChange is one changed path in a Status.
type FileChange struct {
	// Path is relative to the repository's top level, slash-separated.
	Path string
	// OldPath is the source of a rename or copy.
	OldPath string
	// Kind is the change relative to HEAD, staged and unstaged together.
	Kind ChangeKind
	// Staged is true when the index differs from HEAD for this path.
	Staged bool
	// Unstaged is true when the work tree differs from the index (always
	// true for untracked files).
	Unstaged bool
}

// Status is a repository's state.
type Status struct {
	// Branch is the checked-out branch; empty when Detached.
	Branch string
	// Detached is true when HEAD is not a branch.
	Detached bool
	// Head is the commit id of HEAD; empty before the first commit.
	Head string
	// Upstream is the branch's upstream, e.g. "origin/main"; empty for none.
	Upstream string
	// Ahead and Behind count the commits HEAD has that Upstream has not, and
	// the reverse. Both are zero without an upstream (or when it is gone).
	Ahead, Behind int
	// Files are the changed paths, in git's order.
	Files []FileChange
}

// Status returns the state of the repository at repo (default
// Config.WorkDir): branch, HEAD, upstream, ahead/behind and changed files,
// untracked files included (each file, not just its directory), ignored
// files excluded, with renames detected.
func (g *Git) Status(ctx context.Context, repo string) (Status, error) {
	dir, err := g.repoDir(repo)
	if err != nil {
		return Status{}, err
	}
	out, err := g.run(ctx, call{dir: dir, readOnly: true, args: []string{
		"status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all", "--find-renames", "--ignored=no",
	}})
	if err != nil {
		return Status{}, classify(dir, err)
	}
	st, err := parseStatus(out)
	if err != nil {
		return Status{}, fmt.Errorf("%w: git status in %s: %v", errdefs.ErrInternal, dir, err)
	}
	return st, nil
}

// parseStatus parses `git status --porcelain=v2 --branch -z`.
func parseStatus(out []byte) (Status, error) {
	var st Status
	recs := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	for i := 0; i < len(recs); i++ {
		r := recs[i]
		if r == "" {
			continue
		}
		switch r[0] {
		case '#':
			parseHeader(&st, r)
		case '1':
			f := strings.SplitN(r, " ", 9)
			if len(f) != 9 || len(f[1]) != 2 {
				return st, fmt.Errorf("malformed entry %q", r)
			}
			st.Files = append(st.Files, change(f[8], "", f[1], kindOrdinary(f[1])))
		case '2':
			f := strings.SplitN(r, " ", 10)
			if len(f) != 10 || len(f[1]) != 2 || f[8] == "" || i+1 >= len(recs) {
				return st, fmt.Errorf("malformed entry %q", r)
			}
			i++
			kind := KindRenamed
			if f[8][0] == 'C' {
				kind = KindCopied
			}
			st.Files = append(st.Files, change(f[9], recs[i], f[1], kind))
		case 'u':
			f := strings.SplitN(r, " ", 11)
			if len(f) != 11 || len(f[1]) != 2 {
				return st, fmt.Errorf("malformed entry %q", r)
			}
			st.Files = append(st.Files, change(f[10], "", f[1], KindConflicted))
		case '?':
			if len(r) < 3 {
				return st, fmt.Errorf("malformed entry %q", r)
			}
			st.Files = append(st.Files, FileChange{Path: r[2:], Kind: KindUntracked, Unstaged: true})
		case '!':
			// Ignored files were not asked for.
		default:
			return st, fmt.Errorf("unknown entry %q", r)
		}
	}
	return st, nil
}

func parseHeader(st *Status, r string) {
	key, val, _ := strings.Cut(strings.TrimPrefix(r, "# "), " ")
	switch key {
	case "branch.oid":
		if val != "(initial)" {
			st.Head = val
		}
	case "branch.head":
		if val == "(detached)" {
			st.Detached = true
		} else {
			st.Branch = val
		}
	case "branch.upstream":
		st.Upstream = val
	case "branch.ab":
		a, b, _ := strings.Cut(val, " ")
		st.Ahead, _ = strconv.Atoi(strings.TrimPrefix(a, "+"))
		st.Behind, _ = strconv.Atoi(strings.TrimPrefix(b, "-"))
	}
}

func change(path, old, xy string, kind ChangeKind) FileChange {
	return FileChange{Path: path, OldPath: old, Kind: kind, Staged: xy[0] != '.', Unstaged: xy[1] != '.'}
}

// kindOrdinary returns the net kind of an ordinary ("1") entry from its XY
// (index, work tree) letters.
func kindOrdinary(xy string) ChangeKind {
	x, y := xy[0], xy[1]
	switch {
	case x == 'A':
		return KindAdded
	case x == 'D' || y == 'D':
		return KindDeleted
	case x == 'T' || y == 'T':
		return KindTypeChanged
	case y == 'A': // intent-to-add
		return KindAdded
	default:
		return KindModified
	}
}
