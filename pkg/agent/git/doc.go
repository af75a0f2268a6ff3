// Package git gives the sandbox agent (and host-side workspaces) the git
// operations an agent loop needs: status, diff, clone, checkout, commit and
// log. The core type, Git, knows nothing about protobuf; Server is a thin gRPC
// adapter over it for berth.agent.v1.GitService.
//
// # Running git
//
// Every operation runs the git binary found in the image (Config.Binary,
// looked up in PATH at each call, so an image that installs git later works).
// When there is none, every call fails with errdefs.ErrFailedPrecondition
// "git is not installed in this sandbox image". Each invocation:
//
//   - runs in its own session and process group (so it has no controlling
//     terminal to prompt on), and the whole group is killed (SIGKILL) when
//     the caller's context is cancelled or the per-invocation timeout passes
//     (Config.Timeout, 60s; Config.CloneTimeout, 10 min, for clone);
//   - gets GIT_TERMINAL_PROMPT=0 (no credential prompts), LC_ALL=C (stable
//     messages), GIT_PAGER=cat and --no-pager (never a pager), GIT_EDITOR=true
//     (never an editor), GIT_LITERAL_PATHSPECS=1 (paths are paths, not
//     globs or pathspec magic) and, for read-only calls (status, diff, log),
//     GIT_OPTIONAL_LOCKS=0 so that reading never writes the index;
//   - does not inherit GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE and the other
//     variables that would point git at a different repository;
//   - has its standard error captured (bounded) and, trimmed of hints, put
//     into the returned error; its standard output is bounded by
//     Config.MaxOutputBytes (64 MiB), beyond which the call fails with
//     errdefs.ErrResourceExhausted.
//
// Refs, branch names and URLs supplied by callers are never interpretable as
// options: values starting with '-' are rejected, refs are resolved with
// `git rev-parse --verify` and passed on as object ids, and `--` or
// `--end-of-options` separate options from operands.
//
// # Paths
//
// Repositories are absolute paths (Config.WorkDir when empty). The paths in
// Status, in DiffOptions.File and in CommitOptions.Paths are relative to the
// repository's top-level directory, as `git status --porcelain` reports them;
// an absolute path inside the work tree is accepted too.
//
// # Diff
//
// Without a file, Diff returns `git diff <ref>` (the work tree, staged and
// unstaged changes, against ref, default HEAD; the empty tree in a repository
// without commits) with rename detection, followed by one `git diff
// --no-index /dev/null <file>` per untracked, not ignored file, in path order,
// so new files appear as additions. This never touches the index (no `git add
// -N`, no temporary index) and produces exactly git's own formatting. Binary
// files appear as "Binary files … differ" lines (no --binary patches).
//
// With a file, Diff returns the file's text at ref and in the work tree, its
// kind (renames are detected across the whole tree, so the old path is known)
// and Binary=true, with both texts empty, when git considers either side
// binary (the diff attribute is unset, as by "binary" in .gitattributes, or
// there is a NUL byte in the first 8000 bytes) or either side is not valid
// UTF-8.
//
// # Commit identity
//
// Commit never writes git configuration. A configured user.name or user.email
// is used as is; a missing one is supplied with -c as "berth" and
// "berth@localhost". CommitOptions.AuthorName and AuthorEmail, when set, set
// the author only (GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL).
package git
