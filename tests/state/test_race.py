"""Among N concurrent callers exactly one acquires: real threads racing against Azurite."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.state.conftest import new_key


def race(state, key, threads: int, **body) -> list[dict[str, Any]]:
    barrier = threading.Barrier(threads)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def contender() -> None:
        barrier.wait()
        answer = state.lock(key, **body)
        with lock:
            results.append(answer.json)

    workers = [threading.Thread(target=contender) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results


@pytest.mark.parametrize("round_", range(5))
def test_fifty_threads_racing_for_a_new_key_exactly_one_acquires(state, round_):
    results = race(state, new_key(), 50)
    assert len(results) == 50
    assert sum(r["acquired"] for r in results) == 1


def test_fifty_threads_racing_for_a_failed_key_exactly_one_acquires(state):
    key = new_key()
    state.set(key, status="Failed", error="earlier attempt")
    results = race(state, key, 50)
    assert sum(r["acquired"] for r in results) == 1


def test_fifty_threads_racing_to_take_over_an_expired_lock_exactly_one_acquires(state):
    key = new_key()
    state.lock(key, lockSeconds=1)
    time.sleep(2.0)
    results = race(state, key, 50)
    winners = [r for r in results if r["acquired"]]
    assert len(winners) == 1 and winners[0]["takeover"] is True
    history = state.history(key).json["items"]
    assert [i["status"] for i in history] == ["Processing", "Superseded"]
