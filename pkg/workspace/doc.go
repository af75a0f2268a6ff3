// Package workspace gives an agent loop one interface, Workspace, to run
// commands, move files and read git state, whether they happen on the host
// or in a berth sandbox. Three implementations behave the same and pass one
// conformance suite (package workspace/conformance):
//
//   - Local runs on the host, with the sandbox agent's own packages
//     (process.Runner, files.FS, git.Git): a timeout kills the command's
//     whole process group, output kept in a Result is bounded, uploads are
//     atomic.
//   - Remote talks to a sandbox agent, directly or through the
//     orchestrator's proxy, over gRPC (the default: one connection, the
//     bearer token and the lease id sent as per-call metadata) or REST
//     (with github.com/hashicorp/go-retryablehttp, retrying only what is
//     safe to retry; see RemoteConfig).
//   - Leased acquires a lease from the orchestrator for a conversation,
//     works through a Remote via the proxy, renews the lease in the
//     background and releases it on Close. It survives a pause of its
//     lease unchanged (the proxy resumes the sandbox at the next call), and
//     implements Pauser for an agent loop that pauses it between turns.
//
// # Paths
//
// Every path argument may be absolute or relative; relative paths are
// resolved against Root, the workspace directory, on every implementation,
// so an agent loop can say "main.go". The empty path means Root where a
// directory makes sense (Stat, List, GitChanges, GitDiff's repo, a
// command's Cwd) and is InvalidArgument where a file is required (Upload,
// Download). Root is a default, not a jail: "../x" and absolute paths
// reach outside it (a sandbox's isolation is the container, not the
// workspace). GitDiff's file argument is the exception: like the paths
// GitChanges returns, it is relative to the repository's top level.
//
// # Watching
//
// Watch reports the changes under a directory as a sequence of
// WatchEvents (created, modified, removed, renamed, overflow), one per
// changed path per burst, with paths relative to the watched directory.
// Local watches the host with the agent's own watcher (package
// agent/files/watch, over fsnotify), Remote streams the agent's
// FileService.Watch (gRPC, or newline-delimited JSON over REST), so the
// events are the same on every implementation.
//
// # Errors
//
// Errors carry the categories of package errdefs on every implementation:
// remote ones are mapped back from gRPC codes (errgrpc.FromGRPC), and from
// the JSON error bodies and HTTP statuses of the REST API, so
// errors.Is(err, errdefs.ErrNotFound) means the same thing everywhere. The
// main ones:
//
//   - errdefs.ErrInvalidArgument: a malformed request (an empty command, an
//     empty upload path, a negative timeout);
//   - errdefs.ErrNotFound: a missing file, or the missing parent directory
//     of an upload;
//   - errdefs.ErrFailedPrecondition: the state does not allow the call (a
//     program that cannot be run, a missing cwd, listing a file,
//     downloading a directory, a directory that is not a git repository, a
//     lease that is gone: see ErrLeaseLost);
//   - errdefs.ErrUnavailable: the sandbox cannot be reached, or the
//     workspace was closed (ErrClosed);
//   - context.Canceled and context.DeadlineExceeded when the caller's
//     context ended.
//
// A command that runs and fails is not an error: its exit code, signal and
// timed-out flag are in the Result.
package workspace
