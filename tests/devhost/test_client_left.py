"""A client that leaves before its answer (a timeout, Ctrl-C, ``| head``) is one line in the host's log.

socketserver prints a traceback for every error of a connection; a client that hung up is not an error of
the host, so the development host logs it in one line and goes on serving.
"""

from __future__ import annotations

import socket
import struct
import time

import httpx
import pytest

from tests.support.children import HostProcess, StartHost


@pytest.fixture(scope="module")
def host(start_host: StartHost) -> HostProcess:
    return start_host(app="tests.devhost.sample_app:app")


def leave_at_once(port: int, path: str) -> None:
    """Send a request and hang up with a reset before the answer comes (SO_LINGER 0: an RST, not a FIN)."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())


def test_a_client_that_left_is_one_line_and_no_traceback(host: HostProcess) -> None:
    # Given a serving host
    port = int(host.base_url.rsplit(":", 1)[1])

    # When clients hang up before their answers, again and again
    for _ in range(30):
        leave_at_once(port, "/api/v1/context")
    time.sleep(0.5)

    # Then the log says so in one line each, with no traceback, and the host still answers
    assert httpx.get(host.base_url + "/api/v1/context").status_code == 200
    log = host.output()
    assert "Traceback" not in log and "BrokenPipeError:" not in log and "ConnectionResetError:" not in log, (
        log
    )
    assert "left before its answer was written" in log
