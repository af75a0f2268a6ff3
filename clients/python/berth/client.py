"""The orchestrator API: leases."""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from ._transport import Transport, duration
from .sandbox import Sandbox

#: The orchestrator's default address (the CLI's too).
DEFAULT_URL = "http://127.0.0.1:7070"


def _state(v: Any) -> str:
    return str(v or "").removeprefix("LEASE_STATE_")


class Lease:
    """A lease: one conversation's sandbox. ``with`` releases it on exit.

    Attributes:
        id, conversation_id, state ("READY", "RELEASED", ...), image,
        owner, labels, expires_at, reason: from the lease.
        token: the lease token (set by acquire; None for get and list).
        created: True when acquire created the sandbox (False when it
            returned the conversation's existing lease).
        data: the lease as the API returned it (camelCase JSON).
    """

    def __init__(self, client: "Client", data: Mapping[str, Any], token: Optional[str] = None,
                 created: bool = False) -> None:
        self._client = client
        self.token = token
        self.created = created
        self._set(data)

    def _set(self, data: Mapping[str, Any]) -> None:
        self.data = dict(data)
        self.id: str = data.get("id", "")
        self.conversation_id: str = data.get("conversationId", "")
        self.state: str = _state(data.get("state"))
        self.image: str = data.get("image", "")
        self.owner: str = data.get("owner", "")
        self.labels: dict[str, str] = dict(data.get("labels") or {})
        self.expires_at: str = data.get("expiresAt") or ""
        self.reason: str = data.get("reason", "")

    @property
    def sandbox(self) -> Sandbox:
        """The lease's sandbox, opened with the lease token (or, for a lease
        from get or list, with the client's token)."""
        return self._client.sandbox(self.id, token=self.token)

    def refresh(self) -> "Lease":
        """Read the lease again."""
        self._set(self._client._get_data(self.id))
        return self

    def renew(self, ttl: Union[float, str, None] = None) -> "Lease":
        """Extend the lease by ttl seconds (default: its own TTL)."""
        self._set(self._client._renew_data(self.id, ttl))
        return self

    def release(self, reason: Optional[str] = None) -> "Lease":
        """Release the lease and remove its sandbox."""
        self._set(self._client._release_data(self.id, reason))
        return self

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.state not in ("RELEASED", "EXPIRED", "FAILED"):
            self.release()

    def __repr__(self) -> str:
        return f"Lease(id={self.id!r}, conversation_id={self.conversation_id!r}, state={self.state!r})"


class Client:
    """A client of one orchestrator.

    Args:
        url: the orchestrator's address; default ``$BERTH_URL``, else
            ``$BERTH_ADDR``, else http://127.0.0.1:7070.
        token: a client token (or the operator token, or a lease token for
            that lease only); default ``$BERTH_TOKEN``.
        timeout: seconds to wait for an answer to ordinary calls (exec,
            streams and file transfers wait as long as they run).
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: Optional[float] = 60.0) -> None:
        url = url or os.environ.get("BERTH_URL") or os.environ.get("BERTH_ADDR") or DEFAULT_URL
        if token is None:
            token = os.environ.get("BERTH_TOKEN")
        self._t = Transport(url, token, timeout)

    @property
    def url(self) -> str:
        """The orchestrator's base URL."""
        return self._t.base_url

    def acquire(
        self,
        conversation_id: str,
        *,
        image: Optional[str] = None,
        ttl: Union[float, str, None] = None,
        idle_timeout: Union[float, str, None] = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        owner: Optional[str] = None,
        user: Optional[str] = None,
        public_ports: Optional[Sequence[int]] = None,
        resources: Optional[Mapping[str, Any]] = None,
        **extra: Any,
    ) -> Lease:
        """Acquire the conversation's sandbox (idempotent per owner and
        conversation). Durations are seconds or strings like "600s"; extra
        keyword arguments are sent as they are (camelCase API fields).
        Use the result in a ``with`` block to release it at the end."""
        body: dict[str, Any] = {"conversationId": conversation_id}
        for k, v in (("image", image), ("ttl", duration(ttl)), ("idleTimeout", duration(idle_timeout)),
                     ("labels", labels), ("env", env), ("secrets", secrets), ("owner", owner), ("user", user),
                     ("publicPorts", list(public_ports) if public_ports else None), ("resources", resources)):
            if v is not None:
                body[k] = dict(v) if isinstance(v, Mapping) else v
        body.update(extra)
        d = self._t.request("POST", "/v1/leases", json_body=body, timeout=None).json()
        return Lease(self, d.get("lease") or {}, token=d.get("token"), created=bool(d.get("created")))

    def get(self, lease_id: str) -> Lease:
        """A lease by id (ended ones too)."""
        return Lease(self, self._get_data(lease_id))

    def list(self, *, state: Optional[str] = None, owner: Optional[str] = None,
             label_selector: Optional[str] = None, conversation_id: Optional[str] = None,
             include_ended: bool = False) -> list[Lease]:
        """The leases the token may see, all pages."""
        return list(self.iter(state=state, owner=owner, label_selector=label_selector,
                              conversation_id=conversation_id, include_ended=include_ended))

    def iter(self, *, state: Optional[str] = None, owner: Optional[str] = None,
             label_selector: Optional[str] = None, conversation_id: Optional[str] = None,
             include_ended: bool = False, page_size: int = 100) -> Iterator[Lease]:
        """Like :meth:`list`, one page at a time."""
        if state and not state.startswith("LEASE_STATE_"):
            state = "LEASE_STATE_" + state.upper()
        page = ""
        while True:
            d = self._t.request("GET", "/v1/leases", query={
                "state": state, "owner": owner, "labelSelector": label_selector,
                "conversationId": conversation_id, "includeEnded": include_ended or None,
                "pageSize": page_size, "pageToken": page or None,
            }).json()
            for l in d.get("leases") or []:
                yield Lease(self, l)
            page = d.get("nextPageToken") or ""
            if not page:
                return

    def renew(self, lease_id: str, ttl: Union[float, str, None] = None) -> Lease:
        """Extend a lease by ttl seconds (default: its own TTL)."""
        return Lease(self, self._renew_data(lease_id, ttl))

    def release(self, lease_id: str, reason: Optional[str] = None) -> Lease:
        """Release a lease and remove its sandbox."""
        return Lease(self, self._release_data(lease_id, reason))

    def sandbox(self, lease_id: str, token: Optional[str] = None) -> Sandbox:
        """The sandbox of a lease, opened with token (default: the
        client's token, which must be the lease's or the operator's)."""
        return Sandbox(self._t, lease_id, token)

    def _get_data(self, lease_id: str) -> dict[str, Any]:
        return dict(self._t.request("GET", f"/v1/leases/{lease_id}").json())

    def _renew_data(self, lease_id: str, ttl: Union[float, str, None]) -> dict[str, Any]:
        body = {"ttl": duration(ttl)} if ttl is not None else {}
        return dict(self._t.request("POST", f"/v1/leases/{lease_id}:renew", json_body=body).json())

    def _release_data(self, lease_id: str, reason: Optional[str]) -> dict[str, Any]:
        return dict(self._t.request("DELETE", f"/v1/leases/{lease_id}", query={"reason": reason}).json())
