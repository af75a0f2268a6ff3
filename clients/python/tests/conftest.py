"""Fixtures: a client of the orchestrator named by $BERTH_URL (token
$BERTH_TOKEN) and one shared lease. The Go test e2e/python_client_test.go
starts a real orchestrator with Docker sandboxes and runs these tests."""

from __future__ import annotations

import os
import secrets
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import berth  # noqa: E402

IMAGE = os.environ.get("BERTH_IMAGE", "berth/base:latest")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("BERTH_URL"):
        skip = pytest.mark.skip(reason="BERTH_URL is not set: these tests need a running orchestrator")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def client() -> berth.Client:
    return berth.Client()


@pytest.fixture(scope="session")
def lease(client: berth.Client) -> Iterator[berth.Lease]:
    with client.acquire("py-" + secrets.token_hex(4), image=IMAGE, ttl=600,
                        secrets={"PY_SECRET": "py-secret-value-42"}) as l:
        yield l


@pytest.fixture(scope="session")
def sb(lease: berth.Lease) -> berth.Sandbox:
    return lease.sandbox
