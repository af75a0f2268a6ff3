"""Drives berth's OpenHands surface the way the OpenHands SDK's
RemoteWorkspace does, with Python's standard library only and Python's JSON
rules (null is None, which is not a list).

Run by e2e TestOpenHandsPythonCompat against a real lease through the real
proxy: OH_HOST is the workspace host (.../v1/sandboxes/LEASE), OH_KEY the
lease token sent as X-Session-API-Key.
"""

import json
import os
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
import uuid

HOST = os.environ["OH_HOST"].rstrip("/")
KEY = os.environ["OH_KEY"]


def call(method, path, params=None, body=None, content_type=None, key=KEY):
    """One request; returns (status, raw body bytes)."""
    url = HOST + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    headers = {}
    if key is not None:
        headers["X-Session-API-Key"] = key
    if content_type:
        headers["Content-Type"] = content_type
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def call_json(method, path, params=None, payload=None):
    body = None if payload is None else json.dumps(payload).encode()
    status, raw = call(method, path, params, body, "application/json" if body else None)
    if status != 200:
        raise AssertionError(f"{method} {path}: HTTP {status}: {raw[:300]!r}")
    return json.loads(raw)


def execute(command, cwd=None, timeout=30.0):
    """The SDK's execute_command: start, then poll the command's BashOutput
    events every 0.1 s with order__gt, stopping at the first non-null
    exit_code. Returns (exit_code, stdout, stderr, polls)."""
    payload = {"command": command, "timeout": int(timeout)}
    if cwd is not None:
        payload["cwd"] = cwd
    command_id = call_json("POST", "/api/bash/start_bash_command", payload=payload).get("id")
    if not isinstance(command_id, str) or not command_id:
        raise AssertionError("no command id")
    stdout, stderr, exit_code, last_order, seen, polls = [], [], None, -1, set(), 0
    start = time.time()
    while time.time() - start < timeout:
        params = {"kind__eq": "BashOutput", "sort_order": "TIMESTAMP", "limit": 100,
                  "command_id__eq": command_id}
        if last_order >= 0:
            params["order__gt"] = last_order
        page = call_json("GET", "/api/bash/bash_events/search", params=params)
        polls += 1
        for event in page.get("items", []):  # the SDK's own line: fails on null
            if event.get("kind") != "BashOutput":
                continue
            if event.get("id") in seen:
                raise AssertionError(f"duplicate event {event.get('id')}")
            seen.add(event.get("id"))
            if event.get("order") is not None and event["order"] > last_order:
                last_order = event["order"]
            if event.get("stdout"):
                stdout.append(event["stdout"])
            if event.get("stderr"):
                stderr.append(event["stderr"])
            if event.get("exit_code") is not None:
                exit_code = event["exit_code"]
        if exit_code is not None:
            break
        time.sleep(0.1)
    if exit_code is None:
        raise AssertionError(f"{command!r}: no exit code in {timeout} s")
    return exit_code, "".join(stdout), "".join(stderr), polls


def multipart(field, filename, content):
    boundary = "berth-" + uuid.uuid4().hex
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; "
            f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    return head + content + f"\r\n--{boundary}--\r\n".encode(), "multipart/form-data; boundary=" + boundary


class Commands(unittest.TestCase):
    def test_first_poll_before_any_output(self):
        # The commands that failed with "'NoneType' object is not iterable".
        for command, want in [("sleep 0.05", ""), ("true", ""), ("ls -d /tmp", "/tmp\n"), ("git --version", "git version")]:
            for _ in range(5):
                code, out, err, _ = execute(command)
                self.assertEqual(code, 0, (command, out, err))
                self.assertTrue(out.startswith(want), (command, out))

    def test_output_exit_code_and_cwd(self):
        code, out, err, _ = execute("echo hello; echo oops >&2; pwd; exit 3", cwd="/tmp")
        self.assertEqual((code, out, err), (3, "hello\n/tmp\n", "oops\n"))

    def test_streamed_over_several_polls(self):
        code, out, _, polls = execute("for i in 1 2 3; do echo $i; sleep 0.3; done")
        self.assertEqual((code, out), (0, "1\n2\n3\n"))
        self.assertGreater(polls, 2)

    def test_execute_answers_all_output(self):
        # execute_bash_command answers the command's last BashOutput, as the
        # agent-server does: output written before a pause is in it too.
        out = call_json("POST", "/api/bash/execute_bash_command",
                        payload={"command": "echo one; sleep 0.3; echo two; exit 4", "timeout": 30})
        self.assertEqual((out.get("kind"), out.get("exit_code"), out.get("stdout")), ("BashOutput", 4, "one\ntwo\n"))

    def test_empty_search_is_a_list(self):
        page = call_json("GET", "/api/bash/bash_events/search",
                         params={"command_id__eq": uuid.uuid4().hex, "kind__eq": "BashOutput"})
        self.assertIsInstance(page["items"], list)
        self.assertEqual(page["items"], [])


class AsTheAgentServer(unittest.TestCase):
    """What the agent-server does, which berth matches."""

    def test_shell_killed_by_signal_exits_minus_signal(self):
        code, _, _, _ = execute("kill -TERM $$")
        self.assertEqual(code, -15)

    def test_detached_child_outlives_its_command(self):
        code, out, err, _ = execute("nohup sleep 30 >/dev/null 2>&1 & echo $!")
        self.assertEqual(code, 0, err)
        pid = out.strip()
        code, out, _, _ = execute(
            f"grep -q '^State:[[:space:]]*[^Z]' /proc/{pid}/status && echo alive; kill {pid}")
        self.assertEqual(out, "alive\n")

    def test_rename_and_nested_repository(self):
        repo = "/tmp/compat-mv-" + uuid.uuid4().hex[:8]
        code, _, err, _ = execute(
            f"set -e; git init -q {repo}; cd {repo}; git config user.email t@e; git config user.name t; "
            "printf 'c\\n' > c.txt; git add .; git commit -qm init; git mv c.txt moved.txt; "
            "mkdir inner; git -C inner init -q; printf 'n\\n' > inner/n.txt")
        self.assertEqual(code, 0, err)
        got = {c["path"]: c["status"] for c in call_json("GET", "/api/git/changes", params={"path": repo})}
        self.assertEqual(got, {"c.txt": "DELETED", "moved.txt": "ADDED", "inner/n.txt": "ADDED"})


class Files(unittest.TestCase):
    def test_upload_download_binary(self):
        content = bytes(range(256)) * 1024 + b"\x00end"
        path = "/tmp/compat/" + uuid.uuid4().hex + "/blob.bin"
        body, ctype = multipart("file", "blob.bin", content)
        status, raw = call("POST", "/api/file/upload", {"path": path}, body, ctype)
        self.assertEqual(status, 200, raw)
        result = json.loads(raw)
        self.assertTrue(result.get("success", True), result)
        status, got = call("GET", "/api/file/download", {"path": path})
        self.assertEqual(status, 200)
        self.assertEqual(got, content)

    def test_download_missing_is_404(self):
        status, _ = call("GET", "/api/file/download", {"path": "/tmp/no-such-" + uuid.uuid4().hex})
        self.assertEqual(status, 404)


class Git(unittest.TestCase):
    def test_changes_and_diff(self):
        repo = "/tmp/compat-repo-" + uuid.uuid4().hex[:8]
        code, out, err, _ = execute(
            f"set -e; git init -q {repo}; cd {repo}; git config user.email t@e; git config user.name t; "
            "printf 'one\\n' > a.txt; printf 'gone\\n' > b.txt; git add .; git commit -qm init; "
            "printf 'two\\n' > a.txt; rm b.txt; printf 'new\\n' > c.txt")
        self.assertEqual(code, 0, err)
        changes = call_json("GET", "/api/git/changes", params={"path": repo})
        self.assertIsInstance(changes, list)
        got = {}
        for change in changes:  # what TypeAdapter(list[GitChange]) accepts
            self.assertIsInstance(change["path"], str)
            self.assertIn(change["status"], ("ADDED", "DELETED", "UPDATED", "MOVED"))
            got[change["path"]] = change["status"]
        self.assertEqual(got, {"a.txt": "UPDATED", "b.txt": "DELETED", "c.txt": "ADDED"})
        diff = call_json("GET", "/api/git/diff", params={"path": repo + "/a.txt"})
        self.assertEqual((diff["original"], diff["modified"]), ("one\n", "two\n"))

    def test_changes_outside_a_repository_is_a_list(self):
        self.assertEqual(call_json("GET", "/api/git/changes", params={"path": "/"}), [])


class Keys(unittest.TestCase):
    def test_wrong_and_missing_keys(self):
        payload = json.dumps({"command": "true", "timeout": 5}).encode()
        for key in ("wrong-" + uuid.uuid4().hex, None, ""):
            status, _ = call("POST", "/api/bash/start_bash_command", body=payload,
                             content_type="application/json", key=key)
            self.assertEqual(status, 401, key)
            status, _ = call("GET", "/api/file/download", {"path": "/etc/hostname"}, key=key)
            self.assertEqual(status, 401, key)


if __name__ == "__main__":
    unittest.main(verbosity=2)
