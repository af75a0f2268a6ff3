// Package terminal runs programs on pseudo-terminals for the sandbox agent:
// interactive shells, REPLs and full-screen programs that a person (or an
// xterm.js page) drives over the agent's API.
//
// The core type, Manager, knows nothing about protobuf or WebSockets; Server
// adapts it to berth.agent.v1.TerminalService (a bidirectional gRPC stream)
// and WebSocket serves the same sessions at GET /v1/terminals/ws, with the
// framing documented in docs/terminals.md.
//
// # Sessions
//
// A session is one program on one pseudo-terminal (github.com/creack/pty),
// started in a new session (setsid) with the terminal as its controlling
// terminal. The program is chosen and checked by the same policy as the
// agent's commands (process.Runner.Command: argv or command, cwd, env, the
// user and the root policy); without argv or command it is the user's login
// shell from /etc/passwd, or /bin/sh. TERM defaults to "xterm-256color".
//
// A session outlives its clients. Output goes to a bounded scrollback
// (Config.Scrollback, default 256 KiB: the most recent bytes, which may
// start in the middle of a line or an escape sequence) and to every attached
// client; attaching replays the scrollback first, then follows. Several
// clients may attach to one session, and each may type into it, resize it
// and signal it.
//
// # Slow clients
//
// The terminal's reader never waits for a client: each attached client has
// a queue bounded by Config.ClientBuffer (default 1 MiB). A client that
// falls further behind is disconnected (its Next returns ErrSlowClient
// after the queued output; the WebSocket closes with status 1013 and the
// gRPC stream ends with UNAVAILABLE), rather than having bytes silently
// dropped from the middle of its stream, which would corrupt what it
// shows. It can re-attach, and gets the scrollback again.
//
// # Ending
//
// A session ends when its program exits: whatever is left in the terminal's
// session (background jobs, processes that ignore SIGHUP) is killed with
// SIGKILL, the output is drained (for at most 500ms more), and clients get
// the exit status. Kill ends a session on request: SIGHUP (and SIGCONT) to
// every process of the session, SIGKILL after Config.KillGrace. Close ends
// every session the same way; the agent calls it when it stops.
//
// At most Config.MaxSessions sessions run at once (more are
// RESOURCE_EXHAUSTED); an ended session stays visible for
// Config.EndedRetention (default 5 minutes, at most MaxSessions of them) so
// that a client can still read its last output and exit status.
//
// Sessions do not hold slots of the process runner's --max-processes.
package terminal
