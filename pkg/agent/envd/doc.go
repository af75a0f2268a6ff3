// Package envd serves the protocol of E2B's in-sandbox daemon (envd) from
// berth's agent, so that E2B's SDKs can drive a berth sandbox: the Connect
// services process.Process and filesystem.Filesystem (unary and server
// streaming, JSON and binary protobuf, over HTTP/1.1 or h2c; the messages
// are generated from proto/e2b/envd), and the plain HTTP routes GET and
// POST /files, GET /health, GET /envs and GET /metrics.
//
// The package is an edge only: processes run on the agent's process.Runner
// (background processes) or, with a PTY, as terminal.Manager sessions;
// files go through files.FS, acting as the request's user; watches are
// files.FS watches (package files/watch).
//
// # Users and paths
//
// A request names its OS user with "Authorization: Basic base64(USER:)"
// (the password is ignored), or /files with the username query
// parameter; without either it is the agent's default user. Relative paths
// (and a process's default cwd) resolve in Config.WorkDir for the default
// user and in the user's home directory for any other user.
//
// # Authentication
//
// With Config.AccessToken set, every request but GET /health carries it
// in X-Access-Token (compared in constant time); otherwise the Connect
// calls fail with code unauthenticated and the HTTP routes with 401. A
// /files request without the header may instead carry the signature of a
// signed URL (Signature; signature and signature_expiration query
// parameters), as E2B's SDKs make them for secure sandboxes.
//
// # Differences from E2B's envd
//
// Connect replays the output of a process still buffered (the runner's
// replay buffer, a terminal's scrollback) before following it. /init is
// not served (berth configures a sandbox through its own agent API), and
// /metrics reports the agent's cgroup memory when it is limited.
package envd

// Version is the envd version berth's agent reports (E2B's control plane
// returns it as a sandbox's envdVersion). E2B's SDKs gate features on it:
// recursive watches from 0.1.4, stdin for commands from 0.3.0, no default
// "user" in requests from 0.4.0 (the daemon picks its default user),
// CloseStdin from 0.5.2 and octet-stream uploads from 0.5.7 (0.6.0 in some
// SDK releases); this package serves all of them.
const Version = "0.6.0"
