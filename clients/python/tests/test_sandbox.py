from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path

import pytest

import berth


def test_exec_result(sb: berth.Sandbox) -> None:
    r = sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    with pytest.raises(berth.CommandFailed):
        r.check()
    r = sb.exec(["sh", "-c", 'echo "$A:$(pwd)"; cat'], env={"A": "b"}, cwd="/tmp", stdin="piped")
    assert r.check().stdout == "b:/tmp\npiped"
    assert sb.exec(["cat"], stdin=b"\x00\x01bytes").stdout == "\x00\x01bytes"
    r = sb.exec("sleep 10", timeout=0.5)
    assert r.timed_out and not r.ok and r.duration < 5


def test_exec_masks_secret(sb: berth.Sandbox) -> None:
    assert sb.exec('echo "$PY_SECRET"').stdout == "<secret:PY_SECRET>\n"


def test_exec_errors(sb: berth.Sandbox) -> None:
    with pytest.raises(berth.FailedPrecondition) as e:
        sb.exec(["no-such-program"])
    assert e.value.reason == "COMMAND_NOT_FOUND"
    with pytest.raises(berth.InvalidArgument):
        sb.exec("true", cwd="relative")


def test_exec_stream(sb: berth.Sandbox) -> None:
    events = list(sb.exec_stream("echo one; sleep 0.2; echo two >&2; exit 7"))
    assert isinstance(events[0], berth.Started) and events[0].pid > 0
    assert isinstance(events[-1], berth.Exited) and events[-1].exit_code == 7
    out = b"".join(e.data for e in events if isinstance(e, berth.Stdout))
    err = b"".join(e.data for e in events if isinstance(e, berth.Stderr))
    assert (out, err) == (b"one\n", b"two\n")
    # Leaving the loop early stops the command.
    for ev in sb.exec_stream("yes"):
        if isinstance(ev, berth.Stdout):
            break


def test_background_process(sb: berth.Sandbox) -> None:
    p = sb.start(["sh", "-c", "read line; echo got:$line; sleep 30"])
    assert p.running and p.id.startswith("p-")
    assert sb.write_stdin(p.id, "hello\n") == 6
    assert p.id in [q.id for q in sb.processes()]
    seen = b""
    for ev in sb.logs(p.id):
        if isinstance(ev, berth.Stdout):
            seen += ev.data
            if b"got:hello" in seen:
                break
    sb.signal(p.id, "TERM")
    deadline = time.time() + 10
    while sb.process(p.id).running and time.time() < deadline:
        time.sleep(0.1)
    done = sb.process(p.id)
    assert not done.running and done.signal == "SIGTERM"
    replay = list(sb.logs(p.id, follow=False))
    assert any(isinstance(e, berth.Stdout) and b"got:hello" in e.data for e in replay)
    with pytest.raises(berth.NotFound):
        sb.process("p-0000000000000000")


def test_upload_download(sb: berth.Sandbox, tmp_path: Path) -> None:
    data = os.urandom(5 * 1024 * 1024 + 3)
    r = sb.upload("/workspace/py/deep/blob.bin", data)
    assert r.size == len(data) and r.sha256 == hashlib.sha256(data).hexdigest() and r.created
    assert sb.download("/workspace/py/deep/blob.bin") == data
    # From a local file and into one, streamed.
    src = tmp_path / "src.bin"
    src.write_bytes(data[:1_000_000])
    assert sb.upload("/workspace/py/from-file.bin", src, mode=0o600).size == 1_000_000
    dst = tmp_path / "dst.bin"
    assert sb.download("/workspace/py/from-file.bin", dst) == 1_000_000
    assert dst.read_bytes() == data[:1_000_000]
    assert sb.exec("stat -c %a /workspace/py/from-file.bin").stdout == "600\n"
    # From a file object of unknown length (chunked), into a file object.
    assert sb.upload("/workspace/py/stream.bin", io.BytesIO(b"streamed")).size == 8
    # Without the SHA-256: the file is written, the result has no digest.
    r = sb.upload("/workspace/py/nodigest.bin", data[:4096], digest=False)
    assert r.size == 4096 and r.sha256 == "" and r.created
    assert sb.download("/workspace/py/nodigest.bin") == data[:4096]
    buf = io.BytesIO()
    assert sb.download("/workspace/py/stream.bin", buf) == 8 and buf.getvalue() == b"streamed"
    with pytest.raises(berth.AlreadyExists):
        sb.upload("/workspace/py/stream.bin", b"x", overwrite=False)
    with pytest.raises(berth.NotFound):
        sb.download("/workspace/py/missing")
    with pytest.raises(berth.NotFound):
        sb.upload("/workspace/py/none/x", b"x", parents=False)


def test_git(sb: berth.Sandbox) -> None:
    sb.exec("""set -e; mkdir -p /workspace/gitrepo; cd /workspace/gitrepo; git init -q .
        git config user.email t@example.com; git config user.name t
        echo one > a.txt; git add a.txt; git commit -qm init
        echo two >> a.txt; echo new > b.txt""").check()
    st = sb.git_status("/workspace/gitrepo")
    assert len(st.head) == 40
    assert {(f.path, f.kind) for f in st.files} == {("a.txt", "modified"), ("b.txt", "untracked")}
    d = sb.git_diff("/workspace/gitrepo", file="a.txt")
    assert (d.original, d.modified, d.kind) == ("one\n", "one\ntwo\n", "modified")
    assert "+two" in sb.git_diff("/workspace/gitrepo").unified
    with pytest.raises(berth.FailedPrecondition):
        sb.git_status("/tmp")
