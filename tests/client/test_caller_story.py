"""What a production caller trips over, end to end with real processes and signals (issue #24).

A worker process (``tests/client/worker.py``) holds a key in ``client.processing`` and is sent SIGKILL,
SIGSTOP/SIGCONT or SIGTERM; the next worker must learn how the previous attempt ended (``item.previous``)
whichever came first, its own lock or catch-up; SIGTERM releases the open block at once. And a storage
blip at the end of long work: the fenced outcome is retried while the lock is extended, until the lock
is close to expiry, never longer.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from settle_client import AsyncSettleClient, LockHeld, SettleClient, Unavailable

from tests.client import worker as workers
from tests.client.conftest import FAST_RETRY, some, wait_until
from tests.support.children import HostProcess

LOCK_S = 2
_started: list[subprocess.Popen[str]] = []


def start_worker(*args: Any, **kwargs: Any) -> subprocess.Popen[str]:
    process = workers.start_worker(*args, **kwargs)
    _started.append(process)
    return process


@pytest.fixture(autouse=True)
def no_worker_outlives_its_test() -> Iterator[None]:
    """A test that failed (a timeout waiting for a worker) must not leave the worker holding its lock."""
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def inside(state: Path) -> None:
    wait_until(lambda: state.exists() and state.read_text().startswith("inside"), what="worker inside")


def next_worker(client: SettleClient, key: Any) -> Any:
    """The next worker: retries while the dead holder's lock still holds, then processes the key."""

    def attempt() -> Any:
        try:
            with client.processing(key) as item:
                item.data = {"by": "next"}
            return item
        except LockHeld:
            return None

    return wait_until(attempt, what="the next worker getting in")


def catch_up(host: HostProcess) -> None:
    answer = httpx.post(f"{host.base_url}/admin/functions/state_catchup", json={}, timeout=30)
    assert answer.status_code in (200, 202, 204), answer.text


# -- one reliable "previous attempt" signal --------------------------------------------------------
def test_after_sigkill_the_next_worker_learns_the_previous_attempt_expired(host, settle, key, tmp_path):
    worker = start_worker(host.base_url, key, LOCK_S, tmp_path / "state")
    inside(tmp_path / "state")
    worker.kill()  # SIGKILL: no cleanup at all
    assert worker.wait(30) == -signal.SIGKILL
    item = next_worker(settle, key)  # a takeover, or after catch-up turned it Failed: either way
    assert item.previous is not None and item.previous.lock_expired is True
    assert item.previous.status in ("Processing", "Failed")
    assert item.previous_expired is True
    assert some(settle.get(key)).data == {"by": "next"}


def test_when_catch_up_came_first_the_previous_attempt_is_still_an_expiry(host, settle, key, tmp_path):
    worker = start_worker(host.base_url, key, LOCK_S, tmp_path / "state")
    inside(tmp_path / "state")
    worker.kill()
    worker.wait(30)
    until = some(some(settle.get(key)).locked_until)
    wait_until(lambda: datetime.now(UTC) > until + timedelta(seconds=1.5), what="lock expiry")
    catch_up(host)
    record = some(settle.get(key))
    assert (record.status, record.substatus) == ("Failed", "LockExpired")
    with settle.processing(key) as item:
        assert item.takeover is False  # not a takeover: catch-up ended the lock
        assert item.previous is not None and item.previous.lock_expired is True
        assert item.previous.status == "Failed" and (item.previous.error or "").startswith("The lock expired")


def test_sigstop_past_the_lock_the_rival_learns_it_and_the_stopped_holder_writes_nothing(
    host, settle, key, tmp_path
):
    worker = start_worker(host.base_url, key, LOCK_S, tmp_path / "state", work_s=LOCK_S * 3)
    inside(tmp_path / "state")
    worker.send_signal(signal.SIGSTOP)
    try:
        item = next_worker(settle, key)
        assert item.previous is not None and item.previous.lock_expired is True
    finally:
        worker.send_signal(signal.SIGCONT)
    out, err = worker.communicate(timeout=60)
    assert out.strip() == "lost", out + err
    assert some(settle.get(key)).data == {"by": "next"}
    assert all(r.data != {"pid": worker.pid} for r in settle.history(key))


# -- SIGTERM releases the open block ----------------------------------------------------------------
def test_sigterm_releases_the_open_block_at_once(host, settle, key, tmp_path):
    worker = start_worker(host.base_url, key, 60, tmp_path / "state")
    inside(tmp_path / "state")
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 128 + signal.SIGTERM, out + err
    record = some(settle.get(key))
    assert record.status == "Failed" and "SIGTERM" in (record.error or ""), record
    # the item is free now, not after the 60 s lock
    with settle.processing(key) as item:
        assert item.previous is not None and item.previous.lock_expired is False
        assert "SIGTERM" in (item.previous.error or "")


def test_sigterm_releases_a_block_running_in_another_thread_and_it_writes_nothing_after(
    host, settle, key, tmp_path
):
    worker = start_worker(host.base_url, key, 60, tmp_path / "state", thread=True)
    inside(tmp_path / "state")
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 128 + signal.SIGTERM, out + err
    assert out.strip() in ("", "lost"), out  # the thread's block noticed the release and wrote nothing
    record = some(settle.get(key))
    assert record.status == "Failed" and "SIGTERM" in (record.error or ""), record
    assert [r.status for r in settle.history(key)] == ["Failed", "Superseded"]


def test_sigterm_while_the_lock_is_being_taken_hands_a_granted_lock_back(host, settle, key, tmp_path):
    """The window before the block is entered: storage granted the lock, its answer is on its way, and
    SIGTERM arrives. The handler knows no open block yet; the lock must not stay Processing until expiry."""
    worker = start_worker(host.base_url, key, 60, tmp_path / "state", slow_lock=True)
    wait_until(
        lambda: (
            (tmp_path / "state").exists() and (tmp_path / "state").read_text().startswith("lock-answered")
        ),
        what="the lock answered",
    )
    assert some(settle.get(key)).status == "Processing"
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 128 + signal.SIGTERM, out + err
    record = some(settle.get(key))
    assert record.status == "Failed" and "SIGTERM" in (record.error or ""), record
    # the next worker gets in at once, and learns the attempt was released, not expired
    with settle.processing(key, lock_seconds=60) as item:
        assert item.previous is not None and item.previous.lock_expired is False
        item.data = {"by": "next"}


# -- the outcome outlives a storage blip -------------------------------------------------------------
class Blip(httpx.BaseTransport):
    """Real HTTP, except that requests to a path ending in ``suffix`` are answered 503 until ``end``."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.end = float("inf")
        self.inner = httpx.HTTPTransport()
        self.refused = 0
        self.paths: list[str] = []
        self.guard = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self.guard:
            self.paths.append(request.url.path)
        if request.url.path.endswith(self.suffix) and time.monotonic() < self.end:
            self.refused += 1
            return httpx.Response(
                503,
                json={"type": "urn:settle:problem:unavailable", "title": "Unavailable", "status": 503},
                headers={"content-type": "application/problem+json"},
            )
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_a_storage_blip_at_the_end_of_long_work_does_not_redo_the_job(host, key):
    blip = Blip("/v1/state/set")
    with SettleClient(host.base_url, transport=blip, retry=FAST_RETRY) as client:
        with client.processing(key, lock_seconds=6) as item:
            item.data = {"done": True}
            blip.end = time.monotonic() + 5  # longer than the call's own retries (~0.1 s here)
        assert item.record is not None and item.record.status == "Processed"
        assert blip.refused > FAST_RETRY.attempts
        assert any(p.endswith("/lock/extend") for p in blip.paths), "the lock was not kept meanwhile"
        assert some(client.get(key)).data == {"done": True}


def test_the_outcome_is_retried_only_until_the_lock_is_close_to_expiry(host, key):
    blip = Blip("/v1/state/set")
    with SettleClient(host.base_url, transport=blip, retry=FAST_RETRY) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable) as raised, client.processing(key, lock_seconds=3) as item:
            item.data = {"done": True}
        took = time.monotonic() - started
        # it kept trying for most of one lock length after leaving, and stopped before the lock ran out
        assert 1.5 < took < 3 + 1.0, took
        assert any("not recorded" in note for note in raised.value.__notes__)
        record = some(client.get(key))
        assert record.status == "Processing" and some(record.locked_until) > datetime.now(UTC)


class AsyncBlip(httpx.AsyncBaseTransport):
    """:class:`Blip` for the async client."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.end = float("inf")
        self.inner = httpx.AsyncHTTPTransport()
        self.refused = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith(self.suffix) and time.monotonic() < self.end:
            self.refused += 1
            return httpx.Response(503, json={"type": "urn:settle:problem:unavailable", "status": 503})
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_the_async_client_also_outlives_a_storage_blip_at_the_end(host, key):
    async def main() -> Any:
        blip = AsyncBlip("/v1/state/set")
        async with AsyncSettleClient(host.base_url, transport=blip, retry=FAST_RETRY) as client:
            async with client.processing(key, lock_seconds=6) as item:
                item.data = {"done": "async"}
                blip.end = time.monotonic() + 3
            assert blip.refused > FAST_RETRY.attempts
            return item.record

    record = asyncio.run(main())
    assert record is not None and record.status == "Processed" and record.data == {"done": "async"}
