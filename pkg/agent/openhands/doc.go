// Package openhands serves the subset of the OpenHands agent-server REST
// API that openhands-sdk's RemoteWorkspace calls, over the agent's own
// process, file and git services, so that an unmodified RemoteWorkspace
// pointed at a berth sandbox (through the orchestrator's proxy) works:
//
//	GET  /health                               {"status":"ok"} (no token)
//	GET  /server_info                          uptime, idle time, version
//	POST /api/bash/start_bash_command          start a shell command
//	POST /api/bash/execute_bash_command        run one and answer its last output
//	GET  /api/bash/bash_events/search          BashCommand / BashOutput events
//	GET  /api/bash/bash_events/{id}            one event
//	GET  /api/bash/bash_events/?event_ids=...  several events (null when unknown)
//	DELETE /api/bash/bash_events               forget the finished commands
//	POST /api/file/upload?path=ABS             multipart field "file"
//	GET  /api/file/download?path=ABS           the file's bytes
//	GET  /api/git/changes?path=REPO            changed paths
//	GET  /api/git/diff?path=FILE               a file's original and modified text
//
// Every /api route is also served under /api/conversations/{id}/..., the
// prefix newer clients put in front of them (berth has one workspace per
// sandbox, so the id selects nothing).
//
// # Bash events
//
// A command runs with /bin/sh -c through the agent's process.Runner, so the
// agent's limits, its user policy and its secret masking apply. Its output
// becomes BashOutput events: chunks of stdout or stderr (each at most
// ChunkBytes, flushed at the latest FlushInterval after the first byte
// waiting), with order 0, 1, 2, … and stable ids, then a last event that
// carries the exit code (and whatever output was still waiting). A command
// that passes its timeout is stopped (SIGTERM to its process group, SIGKILL
// a second later) and its exit code is -1, with "Command timed out after N
// seconds" added to stderr; one killed by another signal exits 128+N.
// Chunks end on UTF-8 character boundaries; invalid bytes become U+FFFD.
//
// Events live in memory: at most MaxCommands commands, MaxCommandOutput
// bytes of output each (the rest is dropped and the last event says how
// much) and MaxTotalOutput bytes together; the oldest finished commands are
// forgotten first.
//
// # Errors
//
// Errors answer with berth's categories mapped to HTTP statuses as
// everywhere in the agent (400 invalid argument or failed precondition,
// 404 not found, 429 resource exhausted, …) and a body that both FastAPI
// clients and berth clients read: {"detail": msg, "code": N, "message": msg}.
package openhands
