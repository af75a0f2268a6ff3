"""Drives berth's OpenHands runtime API the way OpenHands' APIRemoteWorkspace
(openhands-workspace) does, with Python's standard library only: look for
an existing session (404), start a runtime, wait until GET /sessions/ID says
pod_status "ready" and the runtime url's /health answers without a key, run
commands through the url with the session API key (start_bash_command, then
poll bash_events/search as RemoteWorkspace does), pause, resume (wait
again), stop.

Run by e2e TestOpenHandsRuntimeAPI against a real orchestrator process on
Docker: RT_API is the runtime API url (.../openhands/runtime), RT_KEY a
client token, RT_OTHER_KEY another owner's client token, RT_IMAGE the image.
"""

import json
import os
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
import uuid

API = os.environ["RT_API"].rstrip("/")
KEY = os.environ["RT_KEY"]
OTHER_KEY = os.environ["RT_OTHER_KEY"]
IMAGE = os.environ["RT_IMAGE"]


def request(method, url, payload=None, headers=None, timeout=120):
    """One request; returns (status, parsed JSON or None, raw bytes)."""
    body = None if payload is None else json.dumps(payload).encode()
    h = dict(headers or {})
    if body is not None:
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=body, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw), raw
    except ValueError:
        return status, None, raw


def api(method, path, payload=None, key=KEY):
    """A runtime API call with X-API-Key, as the client's _api_headers."""
    return request(method, API + path, payload, {"X-API-Key": key} if key is not None else {})


def ok(method, path, payload=None):
    status, data, raw = api(method, path, payload)
    if status != 200:
        raise AssertionError(f"{method} {path}: HTTP {status}: {raw[:300]!r}")
    return data


class Runtime:
    """What the client keeps of a runtime: id, url, session API key."""

    def __init__(self, data):
        self.id = data.get("runtime_id") or data.get("id")
        self.url = data.get("url")
        self.key = data.get("session_api_key")
        if not self.id or not self.url:
            raise AssertionError(f"invalid runtime response: {data}")

    def bash(self, command, timeout=30):
        """RemoteWorkspace.execute_command: start, poll BashOutput events
        with order__gt until the first exit code. Returns (exit, stdout)."""
        headers = {"X-Session-API-Key": self.key}
        status, data, raw = request("POST", self.url + "/api/bash/start_bash_command",
                                    {"command": command, "timeout": timeout}, headers)
        if status != 200:
            raise AssertionError(f"start_bash_command: HTTP {status}: {raw[:300]!r}")
        cid, out, last, deadline = data["id"], [], -1, time.time() + timeout + 10
        while time.time() < deadline:
            q = urllib.parse.urlencode({"command_id__eq": cid, "kind__eq": "BashOutput", "order__gt": last,
                                        "sort_order": "TIMESTAMP", "limit": 100})
            status, page, raw = request("GET", self.url + "/api/bash/bash_events/search?" + q, None, headers)
            if status != 200:
                raise AssertionError(f"bash_events/search: HTTP {status}: {raw[:300]!r}")
            for ev in page["items"]:
                last = max(last, ev["order"])
                out.append(ev.get("stdout") or "")
                if ev.get("exit_code") is not None:
                    return ev["exit_code"], "".join(out)
            time.sleep(0.1)
        raise AssertionError(f"{command!r} did not finish")


def wait_alive(session_id, timeout=120):
    """The client's _wait_until_runtime_alive: GET /sessions/ID until
    pod_status is ready, then the url's /health without a key. Transient
    pod statuses are retried, failed ones raise."""
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        data = ok("GET", f"/sessions/{session_id}")
        pod = data.get("pod_status", "").lower()
        seen.append(pod)
        if pod == "ready":
            with urllib.request.urlopen(data["url"] + "/health", timeout=5) as resp:
                if 200 <= resp.status < 300:
                    return data, seen
        elif pod in ("failed", "unknown", "crashloopbackoff"):
            raise AssertionError(f"runtime failed: {data}")
        time.sleep(0.2)
    raise AssertionError(f"runtime not alive after {timeout}s: {seen[-5:]}")


class RuntimeAPITest(unittest.TestCase):
    def test_lifecycle(self):
        sid = f"agent-server-{uuid.uuid4()}"
        # _check_existing_runtime: an unknown session is a 404.
        status, data, raw = api("GET", f"/sessions/{sid}")
        self.assertEqual(status, 404, raw)

        payload = {"image": IMAGE, "command": [], "working_dir": "/", "environment": {"FORWARDED": "from-host"},
                   "session_id": sid, "run_as_user": 10001, "fs_group": 10001, "image_pull_policy": "IfNotPresent",
                   "runtime_class": "sysbox-runc"}
        rt = Runtime(ok("POST", "/start", payload))
        self.assertTrue(rt.key)
        data, _ = wait_alive(sid)
        self.assertEqual((data["runtime_id"], data["url"], data["session_api_key"], data["status"]),
                         (rt.id, rt.url, rt.key, "running"))
        self.assertEqual(data["restart_count"], 0)
        # The same start again (a retried client) is the same runtime.
        again = Runtime(ok("POST", "/start", payload))
        self.assertEqual((again.id, again.url, again.key), (rt.id, rt.url, rt.key))
        # Another owner does not see it.
        status, _, raw = api("GET", f"/sessions/{sid}", key=OTHER_KEY)
        self.assertEqual(status, 404, raw)
        status, _, raw = api("POST", "/stop", {"runtime_id": rt.id}, key=OTHER_KEY)
        self.assertEqual(status, 404, raw)

        code, out = rt.bash("id -u; id -g; echo $FORWARDED")
        self.assertEqual((code, out.split()), (0, ["10001", "10001", "from-host"]))
        code, out = rt.bash("echo kept > /tmp/note && cat /tmp/note")
        self.assertEqual((code, out), (0, "kept\n"))

        # pause (hibernate): the session says paused; resume, wait, the
        # files are still there.
        self.assertEqual(ok("POST", "/pause", {"runtime_id": rt.id})["status"], "paused")
        data = ok("GET", f"/sessions/{sid}")
        self.assertEqual((data["status"], data["pod_status"]), ("paused", "pending"))
        self.assertEqual(ok("POST", "/resume", {"runtime_id": rt.id})["status"], "running")
        data, _ = wait_alive(sid)
        self.assertEqual(data["runtime_id"], rt.id)
        code, out = rt.bash("cat /tmp/note")
        self.assertEqual((code, out), (0, "kept\n"))

        # stop: the session is stopped, the url's lease ending or ended.
        self.assertEqual(ok("POST", "/stop", {"runtime_id": rt.id})["status"], "stopped")
        data = ok("GET", f"/sessions/{sid}")
        self.assertEqual((data["status"], data["pod_status"]), ("stopped", "not found"))
        self.assertNotIn("session_api_key", data)
        status, _, _ = request("GET", rt.url + "/health")
        self.assertIn(status, (409, 410))  # RELEASING, then RELEASED

    def test_default_user(self):
        """Without run_as_user the image's default user runs the commands:
        on berth/base the sandbox user, who owns /workspace (uid 10001, what
        the client asks for, may not write there)."""
        sid = f"agent-server-{uuid.uuid4()}"
        rt = Runtime(ok("POST", "/start", {"image": IMAGE, "session_id": sid}))
        try:
            wait_alive(sid)
            code, out = rt.bash("id -un && echo mine > /workspace/f && cat /workspace/f")
            self.assertEqual((code, out), (0, "sandbox\nmine\n"))
        finally:
            ok("POST", "/stop", {"runtime_id": rt.id})

    def test_image_exists(self):
        data = ok("GET", "/image_exists?image=" + urllib.parse.quote(IMAGE))
        self.assertTrue(data["exists"])
        self.assertGreater(data["image"]["image_size_bytes"], 1 << 20)
        missing = IMAGE.split(":")[0] + ":no-such-tag-" + uuid.uuid4().hex[:8]
        data = ok("GET", "/image_exists?image=" + urllib.parse.quote(missing))
        self.assertEqual((data["exists"], data["image"]), (False, None))

    def test_refusals(self):
        for key in (None, "wrong-key-0123456789abcdef"):
            status, _, raw = api("GET", "/sessions/any", key=key)
            self.assertEqual(status, 401, raw)
        # A command of the wrong type is refused naming the field, and no
        # runtime is left behind (TestOpenHandsApp runs commands).
        sid = f"agent-server-{uuid.uuid4()}"
        status, data, raw = api("POST", "/start", {"image": IMAGE, "session_id": sid, "command": {"argv": 1}})
        self.assertEqual(status, 400, raw)
        self.assertIn("command", data["message"])
        status, _, raw = api("GET", f"/sessions/{sid}")
        self.assertEqual(status, 404, raw)
        status, data, raw = api("POST", "/start", {"image": IMAGE, "session_id": sid, "resource_factor": 3})
        self.assertEqual(status, 400, raw)
        self.assertIn("resource_factor", data["message"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
