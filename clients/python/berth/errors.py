"""Exceptions named after berth's error categories (the gRPC codes).

Every failed call raises a subclass of :class:`BerthError`. The class is
chosen from the ``code`` of the REST error body
(``{"code": N, "message": "...", "details": [...]}``); answers without
such a body (a proxy's plain-text error, a connection failure) are mapped
from the HTTP status.
"""

from __future__ import annotations

import json
from typing import Any, Optional

# _BY_CODE maps a gRPC code to its class; each category registers itself
# (BerthError.__init_subclass__).
_BY_CODE: dict[int, type[BerthError]] = {}


class BerthError(Exception):
    """A call to berth failed.

    Attributes:
        code: the gRPC status code (an int, 0..16).
        message: the server's message.
        http_status: the HTTP status, or None when no answer arrived.
        details: the error details (e.g. a ``google.rpc.ErrorInfo``).
        lease_state: the lease's state on 409/410 answers of the proxy
            (``X-Berth-Lease-State``), else None.
    """

    code: int = 2

    def __init_subclass__(cls, code: Optional[int] = None, **kwargs: Any) -> None:
        """A category names its gRPC code as a class keyword
        (``class NotFound(BerthError, code=5)``); a subclass without one
        keeps its parent's."""
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
            _BY_CODE[code] = cls

    def __init__(
        self,
        message: str,
        *,
        http_status: Optional[int] = None,
        details: Optional[list[Any]] = None,
        lease_state: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.http_status = http_status
        self.details = details or []
        self.lease_state = lease_state

    @property
    def reason(self) -> Optional[str]:
        """The machine-readable reason of an ErrorInfo detail, if any
        (e.g. ``COMMAND_NOT_FOUND``)."""
        for d in self.details:
            if isinstance(d, dict) and d.get("reason"):
                return str(d["reason"])
        return None

    def __str__(self) -> str:
        s = self.message
        if self.http_status is not None:
            s = f"{s} (HTTP {self.http_status})"
        return s


class Cancelled(BerthError, code=1):
    """CANCELLED: the call was cancelled (HTTP 499)."""


class Unknown(BerthError, code=2):
    """UNKNOWN: an error without a category."""


class InvalidArgument(BerthError, code=3):
    """INVALID_ARGUMENT: a malformed request; the message names the field."""


class DeadlineExceeded(BerthError, code=4):
    """DEADLINE_EXCEEDED: a timeout (HTTP 504)."""


class NotFound(BerthError, code=5):
    """NOT_FOUND: no such lease, file, process or ref."""


class AlreadyExists(BerthError, code=6):
    """ALREADY_EXISTS: e.g. an upload with overwrite=False onto a file."""


class PermissionDenied(BerthError, code=7):
    """PERMISSION_DENIED: the token may not do this."""


class ResourceExhausted(BerthError, code=8):
    """RESOURCE_EXHAUSTED: a limit was reached (HTTP 429, or 507 for a
    lease's disk limit)."""


class FailedPrecondition(BerthError, code=9):
    """FAILED_PRECONDITION: the state does not allow it (a released lease,
    a path that is no repository, a missing program or directory)."""


class Aborted(BerthError, code=10):
    """ABORTED: a conflict (e.g. another git process holds the index)."""


class OutOfRange(BerthError, code=11):
    """OUT_OF_RANGE."""


class Unimplemented(BerthError, code=12):
    """UNIMPLEMENTED: no such call."""


class Internal(BerthError, code=13):
    """INTERNAL: a server fault."""


class Unavailable(BerthError, code=14):
    """UNAVAILABLE: the server or sandbox cannot be reached (HTTP 502/503,
    or no answer at all)."""


class DataLoss(BerthError, code=15):
    """DATA_LOSS."""


class Unauthenticated(BerthError, code=16):
    """UNAUTHENTICATED: missing or invalid token (HTTP 401)."""


_BY_HTTP: dict[int, type[BerthError]] = {
    400: InvalidArgument, 401: Unauthenticated, 403: PermissionDenied, 404: NotFound,
    409: FailedPrecondition, 410: FailedPrecondition, 412: FailedPrecondition,
    429: ResourceExhausted, 499: Cancelled, 500: Internal, 501: Unimplemented,
    502: Unavailable, 503: Unavailable, 504: DeadlineExceeded, 507: ResourceExhausted,
}


def error_class(code: Optional[int] = None, http_status: Optional[int] = None) -> type[BerthError]:
    """The exception class for a gRPC code, else for an HTTP status."""
    if code is not None and code in _BY_CODE and code != 0:
        return _BY_CODE[code]
    if http_status is not None:
        return _BY_HTTP.get(http_status, Internal if http_status >= 500 else Unknown)
    return Unknown


def from_status(code: Any, message: str, details: Any = None, *,
                http_status: Optional[int] = None, lease_state: Optional[str] = None) -> BerthError:
    """Build the exception for an error status (a REST body or a stream's
    ``{"error": ...}`` line)."""
    c = code if isinstance(code, int) else None
    cls = error_class(c, http_status)
    return cls(message or cls.__name__, http_status=http_status,
               details=details if isinstance(details, list) else None, lease_state=lease_state)


def from_body(http_status: int, body: bytes, lease_state: Optional[str] = None) -> BerthError:
    """Build the exception for an error answer's body."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and ("code" in obj or "message" in obj):
        return from_status(obj.get("code"), str(obj.get("message") or obj.get("detail") or ""),
                           obj.get("details"), http_status=http_status, lease_state=lease_state)
    text = body.decode("utf-8", "replace").strip()
    return from_status(None, text or f"HTTP {http_status}", http_status=http_status, lease_state=lease_state)


class CommandFailed(Exception):
    """Raised by :meth:`berth.ExecResult.check` for a command that exited
    non-zero or timed out (not an API error: the call itself succeeded)."""

    def __init__(self, result: Any) -> None:
        self.result = result
        why = "timed out" if result.timed_out else f"exited {result.exit_code}"
        super().__init__(f"command {why}: {result.stderr[-500:]!r}")
