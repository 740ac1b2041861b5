"""The ``settle`` command while Settle is slow to answer: it says on stderr that it is waiting (for whom),
and stdout carries nothing but the answer. A local server that answers late stands in for Settle (a paused
storage makes Settle answer 503 only after its deadline: tests/devhost/test_deadline_host.py)."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from settle_client import cli
from settle_client._cli_context import NOTHING


@pytest.fixture
def slow_settle() -> Iterator[str]:
    """A Settle whose ``find`` answers, after 0.6 s, that nothing matches."""

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(0.6)
            body = json.dumps({"query": "evt", "count": 0, "items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    # shutdown() waits for serve_forever's next poll: every 0.05 s, not the default 0.5 s
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _run(url: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--url", url, *args], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_a_slow_answer_is_waited_for_out_loud_on_stderr_never_on_stdout(
    slow_settle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "WAIT_NOTICE_S", 0.2)
    monkeypatch.setattr(cli, "WAIT_REPEAT_S", 0.3)
    code, out, err = _run(slow_settle, "find", "evt-123", "--json")
    assert err.startswith(f"settle: waiting for Settle at {slow_settle}..."), err
    assert "still waiting" in err  # and again while it goes on
    # stdout is the answer alone (nothing found: nothing), and the answer's error is the last line of stderr,
    # still machine-readable after the notices
    assert out == "" and code == NOTHING
    assert json.loads(err.splitlines()[-1])["error"]["exitCode"] == NOTHING


def test_a_quick_answer_says_nothing_about_waiting(slow_settle: str) -> None:
    _, out, err = _run(slow_settle, "find", "evt-123", "--json")  # 0.6 s, inside WAIT_NOTICE_S
    assert "waiting" not in err and out == ""
    assert json.loads(err)["error"]["exitCode"] == NOTHING
