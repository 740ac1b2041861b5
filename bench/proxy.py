"""A counting HTTP proxy between the Table SDK and Azurite (stdlib only, one thread per connection).

The round-trip figures count what Azurite *receives*, not what Settle's code believes it sends: every
request of every thread (the caller's, a background flusher's, a retry inside the SDK) passes through
here and is counted. :meth:`CountingProxy.wait_quiet` waits until no request has been in flight for a
while, so work an operation leaves to a background thread is drained before a count is read.

The proxy forwards bytes unchanged (the SDK's shared-key signature covers the path, not the port) and
adds no headers of its own, so the ``Date`` header the storage clock reads is Azurite's.
"""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

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


@dataclass(frozen=True)
class Seen:
    """One request Azurite received through the proxy."""

    method: str
    path: str
    at: float


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

    def _begin(self, method: str, path: str) -> None:
        with self._lock:
            self._seen.append(Seen(method, path, time.monotonic()))
            self._in_flight += 1
            self._last = time.monotonic()

    def _end(self) -> None:
        with self._lock:
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
                proxy._begin(self.command, urlsplit(self.path).path)
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
                    proxy._end()
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
