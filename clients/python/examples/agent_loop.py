"""A complete agent loop on berth: one sandbox per conversation; the model's
tool calls (run a command, write or read a file, show the changes) run in
that sandbox and their results go back to the model until it is done.

    BERTH_URL=http://127.0.0.1:7070 BERTH_TOKEN=... python3 agent_loop.py

`model` is a scripted stand-in so the example runs as it is; replace it with
a call to your LLM that returns the next tool call (or None when done).
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Optional

import berth

REPO = "/workspace/app"

TOOLS = {
    "bash": "run a shell command in the sandbox",
    "write_file": "write a file (absolute path)",
    "read_file": "read a file (absolute path)",
    "changes": "list the files changed in the repository",
}


def model(history: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """Stand-in for the LLM: the next tool call, or None when done."""
    script = [
        {"tool": "write_file", "path": f"{REPO}/calc.py", "content": "def add(a, b):\n    return a - b\n"},
        {"tool": "bash", "command": f"cd {REPO} && python3 -B -c 'from calc import add; assert add(2, 3) == 5, add(2, 3)'"},
        {"tool": "read_file", "path": f"{REPO}/calc.py"},
        {"tool": "write_file", "path": f"{REPO}/calc.py", "content": "def add(a, b):\n    return a + b\n"},
        {"tool": "bash", "command": f"cd {REPO} && python3 -B -c 'from calc import add; assert add(2, 3) == 5' && echo tests pass"},
        {"tool": "changes"},
    ]
    done = sum(1 for m in history if m["role"] == "tool")
    return script[done] if done < len(script) else None


def run_tool(sb: berth.Sandbox, call: dict[str, Any]) -> dict[str, Any]:
    """Run one tool call in the sandbox and return what the model sees."""
    tool = call["tool"]
    if tool == "bash":
        r = sb.exec(call["command"], timeout=120)
        return {"exit_code": r.exit_code, "stdout": r.stdout[-8000:], "stderr": r.stderr[-8000:],
                "timed_out": r.timed_out}
    if tool == "write_file":
        return {"written": sb.upload(call["path"], call["content"].encode()).size}
    if tool == "read_file":
        return {"content": sb.download(call["path"]).decode("utf-8", "replace")}
    if tool == "changes":
        return {"files": [(f.kind, f.path) for f in sb.git_status(REPO).files],
                "diff": sb.git_diff(REPO).unified}
    return {"error": f"unknown tool {tool!r}; tools: {sorted(TOOLS)}"}


def main(conversation_id: Optional[str] = None, image: str = "berth/base", verbose: bool = True) -> list[dict[str, Any]]:
    client = berth.Client()  # BERTH_URL (or BERTH_ADDR) and BERTH_TOKEN
    conversation_id = conversation_id or "demo-" + secrets.token_hex(4)
    # One sandbox per conversation; the with block releases it, also on errors.
    with client.acquire(conversation_id, image=image, ttl=900) as lease:
        sb = lease.sandbox
        sb.exec(f"mkdir -p {REPO} && cd {REPO} && git init -q && "
                "git -c user.name=agent -c user.email=agent@example.com commit -q --allow-empty -m start").check()
        history: list[dict[str, Any]] = [{"role": "user", "content": "Make add() in calc.py correct."}]
        while (call := model(history)) is not None:
            try:
                result = run_tool(sb, call)
            except berth.BerthError as e:
                # A bad path, a missing file, a limit: the model gets to see it.
                result = {"error": type(e).__name__, "message": e.message}
            history.append({"role": "tool", "call": call, "result": result})
            if verbose:
                print(json.dumps({"call": call, "result": result})[:300])
            lease.renew()  # a long conversation keeps its sandbox
    return history


if __name__ == "__main__":
    main()
