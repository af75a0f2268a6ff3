"""The sandbox API (the agent inside a lease's sandbox), reached through the
orchestrator's proxy at ``/v1/sandboxes/LEASE/...``."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterator, Mapping, Optional, Sequence, Union

from . import errors
from ._transport import Transport, duration, parse_duration

#: A command: a shell line (run with ``/bin/sh -c``) or an argv list (no shell).
Command = Union[str, Sequence[str]]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class ExecResult:
    """The outcome of :meth:`Sandbox.exec`. A command that ran is a result,
    whatever its exit; see :meth:`check`."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    signal: str = ""
    duration: float = 0.0
    pid: int = 0
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0 and did not time out."""
        return self.exit_code == 0 and not self.timed_out

    def check(self) -> "ExecResult":
        """Return self, or raise :class:`berth.CommandFailed` unless ok."""
        if not self.ok:
            raise errors.CommandFailed(self)
        return self

    @classmethod
    def _from(cls, d: Mapping[str, Any]) -> "ExecResult":
        return cls(
            exit_code=int(d.get("exitCode", 0)), stdout=d.get("stdout", ""), stderr=d.get("stderr", ""),
            timed_out=bool(d.get("timedOut")), signal=d.get("signal", ""),
            duration=parse_duration(d.get("duration")), pid=int(d.get("pid", 0)),
            oom_killed=bool(d.get("oomKilled")), stdout_truncated=bool(d.get("stdoutTruncated")),
            stderr_truncated=bool(d.get("stderrTruncated")),
        )


@dataclass
class Started:
    """The first event of a stream: the command's pid (and a background
    process's id)."""

    pid: int
    process_id: str = ""


@dataclass
class Stdout:
    """A chunk of standard output, raw bytes."""

    data: bytes


@dataclass
class Stderr:
    """A chunk of standard error, raw bytes."""

    data: bytes


@dataclass
class Exited:
    """The last event: how the command ended."""

    exit_code: int
    signal: str = ""
    timed_out: bool = False
    duration: float = 0.0
    oom_killed: bool = False


@dataclass
class Gap:
    """A log replay skipped this many bytes that the buffer no longer holds."""

    dropped_bytes: int


#: An event of :meth:`Sandbox.exec_stream` and :meth:`Sandbox.logs`.
Event = Union[Started, Stdout, Stderr, Exited, Gap]


def _event(d: Mapping[str, Any]) -> Optional[Event]:
    if "started" in d:
        s = d["started"] or {}
        return Started(pid=int(s.get("pid", 0)), process_id=s.get("processId", ""))
    if "stdout" in d:
        return Stdout(base64.b64decode(d["stdout"] or ""))
    if "stderr" in d:
        return Stderr(base64.b64decode(d["stderr"] or ""))
    if "exited" in d:
        e = d["exited"] or {}
        return Exited(exit_code=int(e.get("exitCode", 0)), signal=e.get("signal", ""),
                      timed_out=bool(e.get("timedOut")), duration=parse_duration(e.get("duration")),
                      oom_killed=bool(e.get("oomKilled")))
    if "gap" in d:
        return Gap(int((d["gap"] or {}).get("droppedBytes", 0)))
    return None


@dataclass
class Process:
    """A background process."""

    id: str
    pid: int
    state: str  # "running" or "exited"
    argv: list[str] = field(default_factory=list)
    command: str = ""
    cwd: str = ""
    exit_code: int = 0
    signal: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    stdin_closed: bool = False
    started_at: str = ""
    exited_at: str = ""

    @property
    def running(self) -> bool:
        """True while the process runs."""
        return self.state == "running"

    @classmethod
    def _from(cls, d: Mapping[str, Any]) -> "Process":
        return cls(
            id=d.get("id", ""), pid=int(d.get("pid", 0)),
            state=str(d.get("state", "")).removeprefix("PROCESS_STATE_").lower(),
            argv=list(d.get("argv") or []), command=d.get("command", ""), cwd=d.get("cwd", ""),
            exit_code=int(d.get("exitCode", 0)), signal=d.get("signal", ""), timed_out=bool(d.get("timedOut")),
            oom_killed=bool(d.get("oomKilled")), stdin_closed=bool(d.get("stdinClosed")),
            started_at=d.get("startedAt") or "", exited_at=d.get("exitedAt") or "",
        )


@dataclass
class UploadResult:
    """A written file."""

    path: str
    size: int
    sha256: str
    created: bool


@dataclass
class GitFileChange:
    """One changed path. kind is one of added, modified, deleted, renamed,
    copied, untracked, conflicted, type_changed."""

    path: str
    kind: str
    old_path: str = ""
    staged: bool = False
    unstaged: bool = False


@dataclass
class GitStatus:
    """A repository's branch, HEAD and changed files."""

    branch: str
    head: str
    files: list[GitFileChange]
    upstream: str = ""
    ahead: int = 0
    behind: int = 0
    detached: bool = False


@dataclass
class GitDiff:
    """A unified diff of the work tree, or (with ``file``) one file's two
    versions."""

    unified: str = ""
    path: str = ""
    old_path: str = ""
    original: str = ""
    modified: str = ""
    binary: bool = False
    kind: str = ""


def _kind(v: Any) -> str:
    return str(v or "").removeprefix("CHANGE_KIND_").lower()


class Sandbox:
    """One lease's sandbox. Get it from :attr:`berth.Lease.sandbox` or
    :meth:`berth.Client.sandbox`; the token is the lease's (or the
    operator's)."""

    def __init__(self, transport: Transport, lease_id: str, token: Optional[str] = None) -> None:
        self._t = transport
        self.lease_id = lease_id
        self._token = token

    def _path(self, agent_path: str) -> str:
        return f"/v1/sandboxes/{self.lease_id}{agent_path}"

    def _req(self, method: str, agent_path: str, **kw: Any) -> Any:
        return self._t.request(method, self._path(agent_path), token=self._token, **kw)

    @staticmethod
    def _command(cmd: Command, cwd: Optional[str], env: Optional[Mapping[str, str]],
                 timeout: Union[float, str, None], stdin: Union[str, bytes, None],
                 user: Optional[str]) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if isinstance(cmd, str):
            body["command"] = cmd
        else:
            body["argv"] = list(cmd)
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if timeout is not None:
            body["timeout"] = duration(timeout)
        if isinstance(stdin, str):
            body["stdin"] = stdin
        elif stdin is not None:
            body["stdinData"] = base64.b64encode(stdin).decode()
        if user is not None:
            body["user"] = user
        return body

    def exec(self, cmd: Command, *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
             timeout: Union[float, str, None] = None, stdin: Union[str, bytes, None] = None,
             user: Optional[str] = None) -> ExecResult:
        """Run a command to completion. ``cmd`` is a shell line (str) or an
        argv list; ``timeout`` is in seconds (or a string like "5s")."""
        body = self._command(cmd, cwd, env, timeout, stdin, user)
        return ExecResult._from(self._req("POST", "/v1/exec", json_body=body, timeout=None).json())

    def exec_stream(self, cmd: Command, *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                    timeout: Union[float, str, None] = None, stdin: Union[str, bytes, None] = None,
                    user: Optional[str] = None) -> Iterator[Event]:
        """Run a command and yield its events as they happen: Started,
        Stdout/Stderr chunks (raw bytes), then Exited. Leaving the loop
        early closes the stream, and the agent stops the command."""
        body = self._command(cmd, cwd, env, timeout, stdin, user)
        resp = self._req("POST", "/v1/exec:stream", json_body=body, timeout=None)
        return self._events(resp.iter_json_lines())

    @staticmethod
    def _events(lines: Iterator[Any]) -> Iterator[Event]:
        for d in lines:
            ev = _event(d)
            if ev is not None:
                yield ev

    # Background processes.

    def start(self, cmd: Command, *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
              timeout: Union[float, str, None] = None, stdin: Union[str, bytes, None] = None,
              user: Optional[str] = None) -> Process:
        """Start a command in the background; returns at once."""
        body = self._command(cmd, cwd, env, timeout, stdin, user)
        return Process._from(self._req("POST", "/v1/processes", json_body=body).json())

    def process(self, process_id: str) -> Process:
        """A background process, running or recently exited."""
        return Process._from(self._req("GET", f"/v1/processes/{process_id}").json())

    def processes(self) -> list[Process]:
        """The background processes, oldest first."""
        return [Process._from(p) for p in self._req("GET", "/v1/processes").json().get("processes") or []]

    def logs(self, process_id: str, *, follow: bool = True) -> Iterator[Event]:
        """A background process's output: the replay buffer, then (with
        follow) what it prints until it exits."""
        resp = self._req("GET", f"/v1/processes/{process_id}/logs", query={"follow": follow}, timeout=None)
        return self._events(resp.iter_json_lines())

    def signal(self, process_id: str, signal: Union[str, int] = "TERM") -> None:
        """Signal a background process's group ("TERM", "SIGKILL", 9, ...)."""
        self._req("POST", f"/v1/processes/{process_id}:signal", json_body={"signal": str(signal)}).read()

    def write_stdin(self, process_id: str, data: Union[str, bytes] = b"", *, close: bool = False) -> int:
        """Write to a background process's stdin (and close it); returns
        the bytes written."""
        body: dict[str, Any] = {"close": close}
        if isinstance(data, str):
            body["text"] = data
        else:
            body["data"] = base64.b64encode(data).decode()
        return int(self._req("POST", f"/v1/processes/{process_id}:stdin", json_body=body).json().get("written", 0))

    # Files.

    def upload(self, path: str, src: Union[bytes, PathLike, BinaryIO], *, mode: Optional[int] = None,
               parents: bool = True, overwrite: bool = True, digest: bool = True) -> UploadResult:
        """Write the file at ``path`` (absolute, in the sandbox) from bytes,
        a local file path or a binary file object, streamed. Missing parent
        directories are created unless ``parents=False``; ``overwrite=False``
        raises AlreadyExists for an existing file. ``digest=False`` asks the
        sandbox not to compute the content's SHA-256 (less CPU per byte;
        the result's ``sha256`` is then empty)."""
        query: dict[str, Any] = {}
        if not digest:
            query["digest"] = "none"
        if mode is not None:
            query["mode"] = format(mode, "04o")
        if not parents:
            query["parents"] = False
        if not overwrite:
            query["overwrite"] = "fail"
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(src, (bytes, bytearray)):
            r = self._req("PUT", "/v1/files" + path, query=query, body=bytes(src), headers=headers, timeout=None)
            return self._upload_result(r.json())
        if isinstance(src, (str, os.PathLike)):
            with open(src, "rb") as f:
                headers["Content-Length"] = str(os.fstat(f.fileno()).st_size)
                r = self._req("PUT", "/v1/files" + path, query=query, body=f, headers=headers, timeout=None)
                return self._upload_result(r.json())
        r = self._req("PUT", "/v1/files" + path, query=query, body=src, headers=headers, timeout=None)
        return self._upload_result(r.json())

    @staticmethod
    def _upload_result(d: Mapping[str, Any]) -> UploadResult:
        return UploadResult(path=d.get("path", ""), size=int(d.get("size", 0)), sha256=d.get("sha256", ""),
                            created=bool(d.get("created")))

    def download(self, path: str, dst: Union[PathLike, BinaryIO, None] = None) -> Union[bytes, int]:
        """Read the file at ``path``. Without ``dst`` its bytes are
        returned; with a local path or a binary file object they are
        streamed there and the byte count is returned."""
        resp = self._req("GET", "/v1/files" + path, timeout=None)
        if dst is None:
            return resp.read()
        n = 0
        if isinstance(dst, (str, os.PathLike)):
            with open(dst, "wb") as f:
                for chunk in resp.iter_chunks():
                    n += f.write(chunk)
            return n
        for chunk in resp.iter_chunks():
            n += dst.write(chunk) or 0
        return n

    # Git.

    def git_status(self, repo: Optional[str] = None) -> GitStatus:
        """The repository's state (default: the workspace)."""
        d = self._req("GET", "/v1/git/status", query={"repo": repo}).json()
        files = [GitFileChange(path=f.get("path", ""), kind=_kind(f.get("kind")), old_path=f.get("oldPath", ""),
                               staged=bool(f.get("staged")), unstaged=bool(f.get("unstaged")))
                 for f in d.get("files") or []]
        return GitStatus(branch=d.get("branch", ""), head=d.get("head", ""), files=files,
                         upstream=d.get("upstream", ""), ahead=int(d.get("ahead", 0)),
                         behind=int(d.get("behind", 0)), detached=bool(d.get("detached")))

    def git_diff(self, repo: Optional[str] = None, *, ref: Optional[str] = None,
                 file: Optional[str] = None) -> GitDiff:
        """The work tree against ``ref`` (default HEAD): a unified diff, or
        with ``file`` that file's original and modified text."""
        d = self._req("GET", "/v1/git/diff", query={"repo": repo, "ref": ref, "file": file}).json()
        return GitDiff(unified=d.get("unified", ""), path=d.get("path", ""), old_path=d.get("oldPath", ""),
                       original=d.get("original", ""), modified=d.get("modified", ""),
                       binary=bool(d.get("binary")), kind=_kind(d.get("kind")))

    def info(self) -> dict[str, Any]:
        """The agent's version, uptime, workspace and whether git is there."""
        return dict(self._req("GET", "/v1/info").json())
