from __future__ import annotations

import secrets

import pytest

import berth
from conftest import IMAGE


def test_acquire_context_manager_releases(client: berth.Client) -> None:
    conv = "py-ctx-" + secrets.token_hex(4)
    with client.acquire(conv, image=IMAGE, ttl="120s", labels={"suite": "python"}) as lease:
        assert lease.state == "READY"
        assert lease.token and lease.created
        assert lease.conversation_id == conv and lease.labels == {"suite": "python"}
        # Idempotent per conversation: the same lease and token.
        again = client.acquire(conv, image=IMAGE)
        assert again.id == lease.id and again.token == lease.token and not again.created
        assert lease.sandbox.exec("echo in-sandbox").stdout == "in-sandbox\n"
        lease_id = lease.id
    assert lease.state == "RELEASED"
    assert client.get(lease_id).state == "RELEASED"
    with pytest.raises(berth.FailedPrecondition) as e:
        lease.sandbox.exec("true")
    assert e.value.http_status == 410 and e.value.lease_state == "RELEASED"


def test_release_on_exception(client: berth.Client) -> None:
    with pytest.raises(RuntimeError):
        with client.acquire("py-exc-" + secrets.token_hex(4), image=IMAGE, ttl=120) as lease:
            raise RuntimeError("boom")
    assert client.get(lease.id).state == "RELEASED"


def test_renew_get_list(client: berth.Client, lease: berth.Lease) -> None:
    before = client.get(lease.id).expires_at
    renewed = client.renew(lease.id, ttl=1200)
    assert renewed.id == lease.id and renewed.expires_at > before
    assert lease.renew(900).state == "READY"
    ids = [l.id for l in client.list(state="READY")]
    assert lease.id in ids
    assert lease.id in [l.id for l in client.list(conversation_id=lease.conversation_id)]
    assert lease.refresh().state == "READY"


def test_lease_token_scope(client: berth.Client, lease: berth.Lease) -> None:
    own = berth.Client(client.url, token=lease.token)
    assert own.get(lease.id).id == lease.id
    assert own.sandbox(lease.id).exec(["true"]).ok


def test_errors(client: berth.Client) -> None:
    with pytest.raises(berth.NotFound):
        client.get("0000000000000000000000000a")
    with pytest.raises(berth.Unauthenticated) as e:
        berth.Client(client.url, token="not-a-token").list()
    assert e.value.code == 16 and e.value.http_status == 401
    with pytest.raises(berth.InvalidArgument):
        client.acquire("py-bad-" + secrets.token_hex(4), image=IMAGE, ttl="soon")
    with pytest.raises(berth.Unavailable):
        berth.Client("http://127.0.0.1:9", token="x", timeout=5).list()
    assert issubclass(berth.NotFound, berth.BerthError)
