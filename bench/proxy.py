"""A counting HTTP proxy between the Table SDK and Azurite (stdlib only, one thread per connection).

The round-trip figures count what Azurite *receives*, not what Settle's code believes it sends: every
request of every thread (the caller's, a background flusher's, a retry inside the SDK) passes through
here and is counted. :meth:`CountingProxy.wait_quiet` waits until no request has been in flight for a
while, so work an operation leaves to a background thread is drained before a count is read.

Each request is recorded with what it cost at the wire (:class:`Seen`): the bytes sent and received, the
entities it **wrote** (a ``$batch`` split into its operations, each named by kind: insert, replace,
upsert, merge, delete; nothing when storage refused the write or the whole transaction) and the entities
it **read** (counted in the response body of a GET). :func:`tally` sums a window of them, so a figure
reads storage's side of the conversation, never Settle's own count.

The proxy forwards bytes unchanged (the SDK's shared-key signature covers the path, not the port) and
adds no headers of its own, so the ``Date`` header the storage clock reads is Azurite's.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from bench.table_requests import COLLECTION, POINT, ROW_KEY_JSON, json_key, key_value
from bench.throttle import Budget, charge_of

# Hop-by-hop headers (RFC 9110 §7.6.1) and the length, which the proxy sets itself.
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


class _QuietServer(ThreadingHTTPServer):
    """A client closing its kept-alive connection (a bench section closing its clients) is not an error."""

    def handle_error(self, request: Any, client_address: Any) -> None:

        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _table_of(target: str) -> str:
    """The table a collection request names (``/{account}/{table}()``)."""
    parts = unquote(urlsplit(target).path).split("/")
    return parts[2].split("(")[0] if len(parts) > 2 else ""


# One operation of a $batch body: its request line, then its headers up to the blank line.
_INNER = re.compile(rb"^(GET|POST|PUT|MERGE|PATCH|DELETE) (\S+) HTTP/1\.1\r?\n((?:[^\r\n]+\r?\n)*)", re.M)
_INNER_STATUS = re.compile(rb"^HTTP/1\.1 (\d{3})", re.M)


@dataclass(frozen=True)
class Write:
    """One entity written: the kind of operation, the table and the row's RowKey."""

    kind: str  # insert | replace | upsert | merge | delete
    table: str
    row_key: str


def _kind(method: str, conditional: bool) -> str:
    """An entity operation's kind from its HTTP method (``conditional``: it carries ``If-Match``)."""
    if method == "POST":
        return "insert"
    if method == "DELETE":
        return "delete"
    if method == "PUT":
        return "replace" if conditional else "upsert"
    return "merge" if conditional else "upsert"  # MERGE / PATCH without If-Match: insert-or-merge


def _write_of(method: str, target: str, headers: str | bytes, body: bytes | None) -> Write | None:
    """The entity one (non-batch) request writes, or None (a read, a table operation)."""
    if method in ("GET", "HEAD"):
        return None
    path = unquote(urlsplit(target).path)
    conditional = b"if-match:" in (
        headers.lower() if isinstance(headers, bytes) else headers.lower().encode()
    )
    point = POINT.match(path)
    if point:
        return Write(_kind(method, conditional), point.group(2), key_value(point.group(4)))
    collection = COLLECTION.match(path)
    if method == "POST" and collection and collection.group(2) != "Tables":
        return Write("insert", collection.group(2), json_key(ROW_KEY_JSON, body or b"") or "")
    return None


def writes_of(method: str, target: str, headers: str, body: bytes | None) -> tuple[Write, ...]:
    """Every entity a request writes if storage applies it: one, or each operation of a ``$batch``."""
    if not urlsplit(target).path.endswith("/$batch"):
        one = _write_of(method, target, headers, body)
        return (one,) if one is not None else ()
    found = list(_INNER.finditer(body or b""))
    out = []
    for n, op in enumerate(found):
        end = found[n + 1].start() if n + 1 < len(found) else len(body or b"")
        one = _write_of(
            op.group(1).decode(), op.group(2).decode(), op.group(3), (body or b"")[op.end() : end]
        )
        if one is not None:
            out.append(one)
    return tuple(out)


def applied(target: str, status: int, reply: bytes) -> bool:
    """Did storage apply the write? A single request: a 2xx. A ``$batch``: a 202 whose every operation
    answered 2xx (a refused transaction answers one error for all of them)."""
    if not 200 <= status < 300:
        return False
    if not urlsplit(target).path.endswith("/$batch"):
        return True
    return all(200 <= int(s) < 300 for s in _INNER_STATUS.findall(reply))


def entities_in(method: str, status: int, reply: bytes) -> int:
    """Entities a GET's answer holds (a query's ``value`` list, or one entity of a point read), whatever
    columns were selected."""
    if method != "GET" or status != 200 or not reply:
        return 0
    try:
        payload = json.loads(reply)
    except ValueError:
        return 0
    if isinstance(payload, dict):
        value = payload.get("value")
        if isinstance(value, list):
            return len([v for v in value if _is_entity(v)])
        return 1 if _is_entity(payload) else 0
    return 0


def _is_entity(value: object) -> bool:
    """An entity of an answer, its columns selected or not (a keys-only count's rows hold no PartitionKey,
    only their ETag and RowKey); a table of Query Tables is none."""
    return isinstance(value, dict) and any(k in value for k in ("PartitionKey", "RowKey", "odata.etag"))


@dataclass(frozen=True)
class Seen:
    """One request Azurite received through the proxy, and what it cost at the wire once answered."""

    method: str
    path: str
    at: float
    query: str = ""  # the URL's query, decoded ($filter names what a read looks for)
    status: int = 0
    sent: int = 0  # bytes of the request (request line, headers, body)
    received: int = 0  # bytes of the answer (status line, headers, body)
    written: tuple[Write, ...] = ()  # entities written (applied writes only)
    read: int = 0  # entities in the answer of a GET


@dataclass
class Tally:
    """A window of requests summed: requests, entities written by kind, entities read, bytes."""

    requests: int = 0
    written: Counter[str] = field(default_factory=Counter)
    read: int = 0
    sent: int = 0
    received: int = 0
    rows: list[Write] = field(default_factory=list)

    @property
    def writes(self) -> int:
        return sum(self.written.values())

    def add(self, other: Tally) -> Tally:
        return Tally(
            self.requests + other.requests,
            self.written + other.written,
            self.read + other.read,
            self.sent + other.sent,
            self.received + other.received,
            self.rows + other.rows,
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "entities_written": self.writes,
            "written_by_kind": dict(sorted(self.written.items())),
            "entities_read": self.read,
            "bytes_sent": self.sent,
            "bytes_received": self.received,
        }


def tally(seen: list[Seen]) -> Tally:
    """Sum what the requests ``seen`` cost at the wire."""
    out = Tally()
    for s in seen:
        out.requests += 1
        out.written.update(w.kind for w in s.written)
        out.rows.extend(s.written)
        out.read += s.read
        out.sent += s.sent
        out.received += s.received
    return out


class CountingProxy:
    """Forwards to ``upstream`` (``http://host:port``) and records every request."""

    def __init__(self, upstream: str, *, budget: Budget | None = None) -> None:
        parts = urlsplit(upstream)
        # Optional storage budget (bench/throttle.py): beyond it a request is answered as Azure throttles.
        self.budget = budget
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        self._in_flight = 0
        self._last = time.monotonic()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- counting ----------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        with self._lock:
            return len(self._seen)

    def since(self, start: int) -> list[Seen]:
        """The requests received after the first ``start`` ones."""
        with self._lock:
            return list(self._seen[start:])

    def wait_quiet(self, quiet_s: float, timeout_s: float = 60.0) -> None:
        """Return once no request is in flight and none arrived for ``quiet_s`` seconds (background
        work drained); raise if the traffic never stops within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                idle = self._in_flight == 0
                waited = time.monotonic() - self._last
            if idle and waited >= quiet_s:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"storage traffic did not stop within {timeout_s:.0f} s")
            time.sleep(max(0.02, quiet_s - waited) if idle else 0.02)

    def _begin(self, method: str, target: str) -> int:
        parts = urlsplit(target)
        with self._lock:
            self._seen.append(Seen(method, parts.path, time.monotonic(), unquote(parts.query)))
            self._in_flight += 1
            self._last = time.monotonic()
            return len(self._seen) - 1

    def _end(self, at: int, **cost: object) -> None:
        with self._lock:
            self._seen[at] = replace(self._seen[at], **cost)  # type: ignore[arg-type]
            self._in_flight -= 1
            self._last = time.monotonic()

    # -- serving -----------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._server is not None, "the proxy is not started"
        return int(self._server.server_address[1])

    def connection_string(self, upstream_connection: str) -> str:
        """``upstream_connection`` with its table endpoint pointed at this proxy."""
        target = f"{self.upstream_host}:{self.upstream_port}"
        if target not in upstream_connection:
            raise ValueError(f"{target} is not in the connection string")
        return upstream_connection.replace(target, f"127.0.0.1:{self.port}")

    def start(self) -> CountingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in separate writes: without this, Nagle's algorithm and the
                # client's delayed ACK add ~40 ms to every answer.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._upstream: http.client.HTTPConnection | None = None

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                at = proxy._begin(self.command, self.path)
                status, reply, reply_headers = 0, b"", list[tuple[str, str]]()
                try:
                    budget = proxy.budget
                    charge = charge_of(self.command, self.path, body) if budget is not None else None
                    refusal = budget.admit(charge) if budget is not None and charge is not None else None
                    if refusal is not None:
                        status, reason, reply_headers, reply = refusal.reply()
                    else:
                        status, reason, reply_headers, reply = self._exchange(body, headers)
                        if budget is not None and charge is not None and charge.read and status == 200:
                            table = next(iter(charge.partitions), ("", ""))[0] or _table_of(self.path)
                            budget.charge_rows(charge.account, table, reply)
                finally:
                    head = f"{self.requestline}\r\n{self.headers}"
                    proxy._end(
                        at,
                        status=status,
                        sent=len(head.encode()) + len(body or b""),
                        received=len(reply) + sum(len(k) + len(v) + 4 for k, v in reply_headers) + 17,
                        written=(
                            writes_of(self.command, self.path, str(self.headers), body)
                            if applied(self.path, status, reply)
                            else ()
                        ),
                        read=entities_in(self.command, status, reply),
                    )
                self.send_response_only(status, reason)
                for name, value in reply_headers:
                    if name.lower() not in _HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def _exchange(
                self, body: bytes | None, headers: dict[str, str]
            ) -> tuple[int, str, list[tuple[str, str]], bytes]:
                for attempt in (1, 2):  # a kept-alive upstream connection may have been closed
                    if self._upstream is None:
                        self._upstream = http.client.HTTPConnection(
                            proxy.upstream_host, proxy.upstream_port, timeout=120
                        )
                        self._upstream.connect()
                        assert self._upstream.sock is not None
                        self._upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    try:
                        self._upstream.request(self.command, self.path, body=body, headers=headers)
                        response = self._upstream.getresponse()
                        return response.status, response.reason, response.getheaders(), response.read()
                    except (ConnectionError, http.client.HTTPException):
                        self._upstream.close()
                        self._upstream = None
                        if attempt == 2:
                            raise
                raise AssertionError("unreachable")

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_MERGE = do_HEAD = _forward  # noqa: N815

            def finish(self) -> None:
                if self._upstream is not None:
                    self._upstream.close()
                super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = _QuietServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="counting-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
