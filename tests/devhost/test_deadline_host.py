"""Storage that does not answer, and a host that stops, under real requests: every answer within the deadline.

* A private Azurite is paused (SIGSTOP) under requests to the development host: each is answered 503
  problem+json with ``Retry-After`` within the HTTP deadline (shortened here to keep the test short), and
  the lock, whose write went out, says its outcome is unknown; once storage is back, the same lock retried
  (same ``requestId``) is answered from what was written.
* The development host is stopped (SIGTERM) while locks are in flight: none is answered 500, and every
  lock storage applied was answered to its caller.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from devtools.azurite import Azurite
from tests.support.children import HostProcess

pytestmark = [pytest.mark.storage, pytest.mark.heavy]  # starts Azurite and development hosts of its own

DEADLINE_S = 3.0
ANSWER_MARGIN_S = 2.0  # the answer's own way back (the dev host, the worker's runtime)


def _key(name: str) -> dict[str, Any]:
    return {"tenantId": 1, "scopeId": 4, "entityId": 44, "itemEntityKey": "invoice", "itemKey": name}


@pytest.fixture
def private_azurite() -> Iterator[Azurite]:
    """An Azurite of this test's own (the paused one must not stall anyone else's requests)."""
    azurite = Azurite(services=("table",)).start()
    try:
        yield azurite
    finally:
        assert azurite.process is not None
        os.killpg(azurite.process.pid, signal.SIGCONT)  # a paused process would not see SIGTERM
        azurite.stop()


def _timed(send: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = send()
    return response, time.monotonic() - started


def test_paused_storage_is_a_503_with_retry_after_within_the_deadline(
    start_host: Callable[..., HostProcess], private_azurite: Azurite
) -> None:
    # Given a host whose storage answers, warmed (tables listed, signing key read)
    host = start_host(
        env={
            "SETTLE_TABLES": private_azurite.connection_string,
            "SETTLE_HTTP_DEADLINE_SECONDS": str(DEADLINE_S),
        }
    )
    api = f"{host.base_url}/api/v1"
    with httpx.Client(timeout=60) as http:
        assert http.post(f"{api}/state/lock", json={"key": _key("warm")}).status_code == 200
        assert http.get(f"{api}/find", params={"q": "evt-warm"}).status_code == 200
        request_id = str(uuid.uuid4())
        lock = {"key": _key(f"paused-{uuid.uuid4().hex}"), "requestId": request_id}

        # When storage stops answering (its process paused) under a read, a lock and a search
        assert private_azurite.process is not None
        os.killpg(private_azurite.process.pid, signal.SIGSTOP)
        calls: dict[str, Callable[[], httpx.Response]] = {
            "exists": lambda: http.post(f"{api}/state/exists", json={"key": _key("warm")}),
            "lock": lambda: http.post(f"{api}/state/lock", json=lock),
            "find": lambda: http.get(f"{api}/find", params={"q": "evt-paused"}),
        }
        with ThreadPoolExecutor(len(calls)) as pool:
            futures = {name: pool.submit(_timed, send) for name, send in calls.items()}
            answers = {name: future.result() for name, future in futures.items()}

        # Then each is a 503 problem+json with Retry-After, within the deadline
        for name, (response, took) in answers.items():
            assert response.status_code == 503, (name, response.text)
            assert response.headers["content-type"].startswith("application/problem+json"), name
            assert int(response.headers["retry-after"]) >= 1, name
            assert took < DEADLINE_S + ANSWER_MARGIN_S, (name, took)
            print(f"{name}: 503 after {took:.2f} s: {response.json()['detail']}")
        # and the lock, whose write went out, says its outcome is unknown; the reads claim nothing
        assert answers["lock"][0].json()["outcome"] == "unknown"
        assert "outcome" not in answers["exists"][0].json()
        assert "outcome" not in answers["find"][0].json()

        # When storage comes back, the same lock retried is answered from what was written
        os.killpg(private_azurite.process.pid, signal.SIGCONT)
        again = http.post(f"{api}/state/lock", json=lock)
        assert again.status_code == 200, again.text
        assert again.json()["acquired"] is True


def test_sigterm_answers_every_lock_in_flight_before_the_host_exits(
    start_host: Callable[..., HostProcess],
) -> None:
    # Given a host serving a stream of locks from many callers
    prefix = "t" + uuid.uuid4().hex[:12]
    host = start_host(env={"SETTLE_TABLE_PREFIX": prefix})
    api = f"{host.base_url}/api/v1"
    answers: list[tuple[str, int | str]] = []  # (item key, status or the transport error's kind)
    stop = threading.Event()

    def caller(n: int) -> None:
        with httpx.Client(timeout=60) as http:
            for i in range(1000):
                name = f"c{n}-{i}"
                try:
                    status: int | str = http.post(
                        f"{api}/state/lock", json={"key": _key(f"{prefix}-{name}")}
                    ).status_code
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                answers.append((name, status))
                if stop.is_set() and status != 200:
                    return

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)

    # When the host is told to stop while locks are in flight
    stop.set()
    host.process.send_signal(signal.SIGTERM)
    assert host.process.wait(timeout=60) == 0, host.output()
    for thread in threads:
        thread.join(timeout=60)

    # Then none was answered 500, and every lock storage applied was answered to its caller
    assert answers and not [a for a in answers if a[1] == 500], host.output()
    unanswered = [name for name, status in answers if status != 200]
    reader = start_host(env={"SETTLE_TABLE_PREFIX": prefix})
    with httpx.Client(timeout=60) as http:
        applied = [
            name
            for name in unanswered
            if http.post(f"{reader.base_url}/api/v1/state/get", json={"key": _key(f"{prefix}-{name}")})
            .json()
            .get("status")
            == "Processing"
        ]
    assert applied == [], f"locks applied but not answered: {applied}"
    kinds = {status for _, status in answers}
    print(f"{len(answers)} locks sent; answers: {sorted(map(str, kinds))}")
    assert kinds <= {200, 503, "ConnectError", "RemoteProtocolError", "ReadError"}, kinds
