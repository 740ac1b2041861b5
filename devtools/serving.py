"""HTTP on the wire for the development host: the threaded server, request bodies and answers.

What a request means (routing, auth, invocation) is :meth:`devtools.host.DevHost.handle`'s; this module
reads requests off the socket, hands them over as ``(method, target, headers, body, base)`` and writes
the :class:`Answer` back.

Stopping drains (:meth:`DrainingServer.drain`): the requests in flight are answered (for a bounded time)
before the host exits, and a request that arrives meanwhile on an open connection is answered 503 with
``Retry-After`` and the connection closed. An exit under a request's feet ended it with a 500 ("cannot
schedule new futures after interpreter shutdown") after its storage write may already have been applied.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import azure.functions as func

from devtools.invocation import body_bytes

PROBLEM = "application/problem+json"

log = logging.getLogger("settle.devhost")


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    function: str = "-"


def problem(status: int, title: str, detail: str, **extra: Any) -> Answer:
    document = {"type": f"urn:settle:problem:devhost-{status}", "title": title, "status": status}
    document["detail"] = detail
    document.update(extra)
    body = json.dumps(document).encode("utf-8")
    return Answer(status, [("Content-Type", f"{PROBLEM}; charset=utf-8")], body)


def from_function_response(response: Any, name: str) -> Answer:

    if response is None:
        return Answer(204, [], b"", name)
    if not isinstance(response, func.HttpResponse):
        text = response if isinstance(response, str | bytes) else json.dumps(response)
        return Answer(200, [("Content-Type", "text/plain; charset=utf-8")], body_bytes(text), name)
    headers = [(str(k), str(v)) for k, v in response.headers.items()]
    if response.mimetype and not any(k.lower() == "content-type" for k, _ in headers):
        mimetype = response.mimetype
        if response.charset and "charset" not in mimetype:
            mimetype += f"; charset={response.charset}"
        headers.append(("Content-Type", mimetype))
    return Answer(response.status_code, headers, response.get_body() or b"", name)


class DrainingServer(ThreadingHTTPServer):
    """A thread per connection, and a count of the requests in flight so stopping can wait for them."""

    # socketserver's default backlog is 5: a burst of clients (agents, a load test) got connection resets
    # that they retried as failures. A thread per connection serves them; the backlog holds the burst.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._idle = threading.Condition()
        self._in_flight = 0
        self.draining = False

    def begin(self) -> bool:
        """Count a request in; False once draining (the request is refused)."""
        with self._idle:
            if self.draining:
                return False
            self._in_flight += 1
            return True

    def end(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def drain(self, timeout: float) -> int:
        """Refuse new requests and wait up to ``timeout`` seconds for those in flight; how many are left."""
        with self._idle:
            self.draining = True
            self._idle.wait_for(lambda: self._in_flight == 0, timeout)
            return self._in_flight

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up (a timeout, Ctrl-C, `| head`) is not the host's error: one line, no traceback.
        if isinstance(sys.exception(), BrokenPipeError | ConnectionResetError):
            log.info("client %s:%s left before its answer was written", *client_address[:2])
            return
        super().handle_error(request, client_address)


Handle = Callable[[str, str, Mapping[str, str], bytes, str], Answer]


STOPPING = problem(
    503, "The development host is stopping", "This request arrived after the host began to stop: retry."
)
STOPPING.headers.append(("Retry-After", "1"))


def make_server(handle: Handle, host: str, port: int) -> DrainingServer:
    """A threaded HTTP/1.1 server on ``(host, port)`` answering every request with ``handle``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "SettleDevHost/1.0"

        def _serve(self) -> None:
            started = time.perf_counter()
            body = self._body()
            host_header = self.headers.get("Host") or f"{host}:{port}"
            if server.begin():
                try:
                    answer = handle(
                        self.command, self.path, dict(self.headers.items()), body, f"http://{host_header}"
                    )
                    self._send(answer)
                finally:
                    server.end()
            else:
                answer = STOPPING
                self.close_connection = True
                self._send(answer)
            elapsed = (time.perf_counter() - started) * 1000
            log.info(
                "%s %s -> %d %.1f ms [%s]", self.command, self.path, answer.status, elapsed, answer.function
            )

        def _send(self, answer: Answer) -> None:
            self.send_response(answer.status)
            for key, value in answer.headers:
                if key.lower() not in {"content-length", "connection", "transfer-encoding"}:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer.body)

        def _body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                # Azure's Functions host forwards a body only when Content-Length is over 0: a chunked
                # body never reaches the function there, so it does not here either. It is read (the
                # connection stays usable) and dropped; the headers still say it was chunked.
                while True:
                    size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b""
                    self.rfile.read(size)
                    self.rfile.readline()  # the CRLF after each chunk
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # one line per request is ours
            return

    server = DrainingServer((host, port), Handler)
    server.daemon_threads = True
    return server
