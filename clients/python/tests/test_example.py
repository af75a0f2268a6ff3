from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import agent_loop  # noqa: E402
from conftest import IMAGE  # noqa: E402


def test_agent_loop_example() -> None:
    history = agent_loop.main(image=IMAGE, verbose=False)
    results = [m["result"] for m in history if m["role"] == "tool"]
    assert results[1]["exit_code"] != 0 and "AssertionError" in results[1]["stderr"]
    assert "a - b" in results[2]["content"]
    assert results[4] == {"exit_code": 0, "stdout": "tests pass\n", "stderr": "", "timed_out": False}
    assert results[5]["files"] == [("untracked", "calc.py")]
    assert "+    return a + b" in results[5]["diff"]
