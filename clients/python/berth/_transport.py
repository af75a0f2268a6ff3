"""HTTP transport on the standard library (http.client): one connection per
call, request bodies and responses streamed, errors mapped to
:mod:`berth.errors`."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, Optional, Union
from urllib.parse import quote, urlencode, urlsplit

from . import errors

Body = Union[bytes, BinaryIO, Iterable[bytes], None]

#: Response header naming the lease state on the proxy's 409 and 410 answers.
LEASE_STATE_HEADER = "X-Berth-Lease-State"

_CHUNK = 256 * 1024


class Response:
    """A streamed answer. Read it with :meth:`read`, :meth:`json`,
    :meth:`iter_chunks` or :meth:`iter_json_lines`; :meth:`close` (or a
    ``with`` block) ends the connection."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp
        self.status: int = resp.status
        self.headers = resp.headers

    def read(self) -> bytes:
        try:
            return self._resp.read()
        finally:
            self.close()

    def json(self) -> Any:
        b = self.read()
        return json.loads(b) if b.strip() else {}

    def iter_chunks(self, size: int = _CHUNK) -> Iterator[bytes]:
        try:
            while True:
                b = self._resp.read1(size) if hasattr(self._resp, "read1") else self._resp.read(size)
                if not b:
                    return
                yield b
        finally:
            self.close()

    def iter_json_lines(self) -> Iterator[Any]:
        """Newline-delimited JSON: ``{"result": ...}`` lines are yielded,
        an ``{"error": ...}`` line raises."""
        try:
            for line in self._resp:
                line = line.strip()
                if not line:
                    continue
                obj = json.loads(line)
                if isinstance(obj, dict) and "error" in obj and obj["error"]:
                    e = obj["error"]
                    raise errors.from_status(e.get("code"), str(e.get("message", "")), e.get("details"),
                                             http_status=self.status)
                yield obj.get("result", obj) if isinstance(obj, dict) else obj
        finally:
            self.close()

    def close(self) -> None:
        try:
            self._resp.close()
        finally:
            self._conn.close()

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def duration(v: Union[float, int, str, None]) -> Optional[str]:
    """A duration as protojson wants it: seconds (a number) or a string
    like "5s" passed as is."""
    if v is None:
        return None
    if isinstance(v, str):
        return v
    return f"{float(v):g}s"


def parse_duration(v: Any) -> float:
    """protojson's "1.5s" as seconds."""
    if isinstance(v, str) and v.endswith("s"):
        try:
            return float(v[:-1])
        except ValueError:
            return 0.0
    return float(v or 0)


class Transport:
    """Sends requests to one berth orchestrator with one token."""

    def __init__(self, base_url: str, token: Optional[str], timeout: Optional[float] = 60.0) -> None:
        u = urlsplit(base_url if "://" in base_url else "http://" + base_url)
        if u.scheme not in ("http", "https"):
            raise errors.InvalidArgument(f"url: scheme must be http or https, got {u.scheme!r}")
        self.scheme = u.scheme
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port
        self.prefix = u.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.base_url = f"{u.scheme}://{u.netloc}{self.prefix}"

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, blocksize=_CHUNK,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout, blocksize=_CHUNK)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        json_body: Any = None,
        body: Body = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Union[float, None, bool] = False,
        token: Optional[str] = None,
    ) -> Response:
        """Send one request and return its answer, which is streamed. An
        answer of 400 or above is raised as a :class:`berth.BerthError`.
        ``timeout=False`` uses the transport's; None waits forever."""
        url = self.prefix + quote(path, safe="/:@!$&'()*+,;=-._~%")
        if query:
            q = {k: ("true" if v is True else "false" if v is False else v)
                 for k, v in query.items() if v is not None}
            if q:
                url += "?" + urlencode(q, doseq=True)
        h: dict[str, str] = {"Accept": "application/json"}
        tok = token if token is not None else self.token
        if tok:
            h["Authorization"] = "Bearer " + tok
        if json_body is not None:
            body = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        if headers:
            h.update(headers)
        if isinstance(body, (bytes, bytearray)):
            h["Content-Length"] = str(len(body))
        elif body is None and method in ("POST", "PUT", "PATCH"):
            body, h["Content-Length"] = b"", "0"
        conn = self._connect(self.timeout if timeout is False else timeout)
        try:
            # A file object or an iterable without a Content-Length goes
            # out with chunked transfer encoding.
            conn.request(method, url, body=body, headers=h)
            resp = conn.getresponse()
        except (socket.timeout, TimeoutError) as e:
            conn.close()
            raise errors.DeadlineExceeded(f"{method} {self.base_url}{path}: {e}") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise errors.Unavailable(f"{method} {self.base_url}{path}: {e}") from e
        r = Response(conn, resp)
        if r.status >= 400:
            b = r.read()
            raise errors.from_body(r.status, b, resp.headers.get(LEASE_STATE_HEADER))
        return r
