// Package process runs commands for the sandbox agent: to completion (Exec),
// streamed as they run (Stream) or in the background (Start, Logs,
// WriteStdin, Signal). The core type, Runner, knows nothing about protobuf;
// Server is a thin gRPC adapter over it for berth.agent.v1.ProcessService.
//
// The Runner makes no assumption about running as PID 1, so a host-side
// workspace can use it as well. It relies on Unix process groups; exit
// handling is exact on Linux (see below) and best effort elsewhere.
//
// # Process groups and termination
//
// Every command runs as the leader of its own process group (Setpgid). When a
// command has to be stopped — its timeout passed, its context was cancelled,
// a stream's consumer went away, or the Runner is closing — the whole group
// gets SIGTERM (and SIGCONT, so stopped members can act on it), then, if the
// leader has not exited after the kill grace (default 2s), SIGKILL.
//
// A command must not leave strays behind: as soon as the leader exits —
// normally or not — every remaining member of its group is killed with
// SIGKILL. On Linux the leader is observed with waitid(WNOWAIT) and only
// reaped after that kill, so the group id cannot have been reused by an
// unrelated process. Long-lived work belongs in a background process (Start),
// whose group lives as long as its leader.
//
// Processes that leave the group (setsid, setpgid) are not tracked. If one of
// them still holds the command's stdout or stderr open, the Runner stops
// reading 500ms after the leader exited, so a call never hangs on it; a
// cgroup is the tool for containing such processes.
//
// # Errors
//
// Errors wrap the errdefs categories: ErrInvalidArgument names the request
// field (argv, command, cwd, env, stdin, timeout, kill_grace, output_limit,
// and id, data, signal for background processes); a missing or non-executable program, a missing shell and a
// missing or non-directory cwd are ErrFailedPrecondition naming the field
// (argv[0], command, cwd), and a program that cannot start carries a reason
// (errdefs.Reason, an ErrorInfo detail on the wire) telling a missing
// program (ReasonCommandNotFound, a shell's 127) from one that cannot be
// executed (ReasonCommandNotExecutable, 126); an unknown background process is ErrNotFound; the
// MaxProcesses limit, and the kernel refusing to fork (EAGAIN, ENOMEM), are
// ErrResourceExhausted; a closed Runner answers ErrUnavailable. A command
// that runs and fails is not an error: its exit code, signal and timed-out
// flag are in the result.
//
// # Reaping
//
// The Runner waits for the processes it starts itself. A PID 1 that reaps
// orphans with wait4(-1, ...) in the same process would steal those exit
// statuses; such a reaper must only reap children it did not start (or run
// as a separate init process in front of the agent).
package process
