"""A cold instance's first lock reads the signing key beside its other first requests (``common.beside``),
and still takes no lock whose token it cannot issue.

Each test starts a new instance on empty tables (``fresh_tables``; ``runtime.reset``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from azure.core.pipeline.policies import SansIOHTTPPolicy

from common import runtime
from common.beside import Beside
from common.roundtrips import ROUND_TRIPS
from common.signing import KEY_PARTITION, KEY_ROW
from state.keys import EXPIRY_TABLE, STATE_TABLE
from tests.state.conftest import new_key


class Timeline(SansIOHTTPPolicy[Any, Any]):
    """Records when each request is sent and answered; holds the signing key's read for ``hold_s``."""

    def __init__(self, hold_s: float = 0.0) -> None:
        self.hold_s = hold_s
        self.events: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    @staticmethod
    def what(request: Any) -> str:
        http = request.http_request
        path = http.url.split("?", 1)[0]
        if f"(PartitionKey='{KEY_PARTITION}'" in path and http.method == "GET":
            return "key read"
        if path.endswith("$batch"):
            return "transaction"
        if path.rstrip("/").endswith("/Tables"):
            return "tables"
        body = http.body if isinstance(http.body, bytes) else str(http.body or "").encode()
        if http.method == "POST" and b'"RowKey": "~' in body:
            return "marker"
        return f"{http.method} {path.rsplit('/', 1)[-1].split('(', 1)[0]}"

    def on_request(self, request: Any) -> None:
        what = self.what(request)
        with self._lock:
            self.events.append((time.monotonic(), "sent", what))
        if what == "key read" and self.hold_s:
            time.sleep(self.hold_s)

    def on_response(self, request: Any, response: Any) -> None:
        with self._lock:
            self.events.append((time.monotonic(), "answered", self.what(request)))

    def at(self, step: str, what: str) -> float:
        return next(t for t, s, w in self.events if s == step and w == what)


def test_the_key_is_read_beside_the_first_preparation_and_the_lock_waits_for_it(
    state: Any, fresh_tables: str
) -> None:
    # Given a new instance whose signing-key read takes half a second
    timeline = Timeline(hold_s=0.5)
    runtime.reset(policies=[timeline])
    try:
        # When it takes its first lock
        with ROUND_TRIPS.measure() as tally:
            answer = state.lock(new_key())
        assert answer.status == 200 and answer.json["acquired"], answer.json
    finally:
        runtime.reset()
    # Then the minute's marker went out while the key was being read (not after it) ...
    assert timeline.at("sent", "marker") < timeline.at("answered", "key read")
    # ... and the lock's transaction only after the key was read: no lock without its token
    assert timeline.at("sent", "transaction") > timeline.at("answered", "key read")
    # and the read on the other thread is counted as the lock's own request
    assert tally.requests == len([e for e in timeline.events if e[1] == "sent"])


def test_a_lock_whose_token_cannot_be_issued_is_not_taken(state: Any, fresh_tables: str) -> None:
    # Given a deployment whose signing key row is damaged (16 bytes, not 32)
    tables = runtime.tables()
    tables.table(EXPIRY_TABLE).create_entity(
        {"PartitionKey": KEY_PARTITION, "RowKey": KEY_ROW, "Key": b"x" * 16}
    )
    key = new_key()
    # When a new instance is asked for a lock
    answer = state.lock(key)
    # Then it refuses, and wrote no record (only its expiry minute's marker, which locks nothing)
    assert answer.status >= 500, answer.json
    rows = [e["RowKey"] for e in tables.table(STATE_TABLE).list_entities()]
    assert rows and all(row.startswith("~") for row in rows), rows
    # and once the key is readable, the same lock is taken
    tables.table(EXPIRY_TABLE).delete_entity(KEY_PARTITION, KEY_ROW)
    runtime.reset()
    assert state.lock(key).json["acquired"]


def test_beside_hands_back_the_result_or_raises_on_the_callers_thread() -> None:
    assert Beside(lambda: 42, name="t").result() == 42

    def fails() -> int:
        raise RuntimeError("storage down")

    failing = Beside(fails, name="t")
    with pytest.raises(RuntimeError, match="storage down"):
        failing.result()
    failing.wait()  # waits without raising


def test_beside_runs_with_the_callers_tallies() -> None:
    seen: list[int] = []

    def count_open() -> None:
        seen.append(len(ROUND_TRIPS.open_tallies()))

    with ROUND_TRIPS.measure():
        Beside(count_open, name="t").result()
    Beside(count_open, name="t").result()
    assert seen == [1, 0]
