"""A lock refused because another caller holds it says what happens next: until when it is held
(``lockedUntil``), when to try again (``Retry-After``), and that after that time a lock call takes it over.
Real threads released together by a barrier, against Azurite."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from tests.conftest import HttpResult
from tests.state.conftest import new_key

CALLERS = 8


def at_once(state: Any, key: dict[str, Any], n: int, **body: Any) -> list[HttpResult]:
    barrier = threading.Barrier(n)
    answers: list[HttpResult] = []
    guard = threading.Lock()

    def contender() -> None:
        barrier.wait(10)
        answer = state.lock(key, **body)
        with guard:
            answers.append(answer)

    workers = [threading.Thread(target=contender) for _ in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert len(answers) == n
    return answers


def test_callers_refused_at_once_are_told_until_when_and_that_the_lock_is_then_taken_over(state):
    # Given eight callers locking one new item at once
    key = new_key()
    answers = at_once(state, key, CALLERS, lockSeconds=30)
    assert [a.status for a in answers] == [200] * CALLERS
    [held] = [a.json for a in answers if a.json["acquired"]]
    refused = [a for a in answers if not a.json["acquired"]]
    assert len(refused) == CALLERS - 1
    for answer in refused:
        # Then every refusal names the holder's expiry, and when to come back
        assert answer.json["lockedUntil"] == held["lockedUntil"], answer.json
        wait = int(answer.headers["retry-after"])
        until = datetime.fromisoformat(held["lockedUntil"])
        assert 1 <= wait <= 31 and abs(time.time() + wait - until.timestamp()) < 3
        reason = answer.json["reason"]
        assert held["lockedUntil"] in reason and "taken over" in reason, reason


def test_a_lock_call_after_the_time_a_refusal_gave_takes_the_lock_over(state):
    key = new_key()
    assert state.lock(key, lockSeconds=1).json["acquired"] is True
    refused = state.lock(key)
    assert refused.json["acquired"] is False
    time.sleep(int(refused.headers["retry-after"]) + 0.6)  # the storage clock's margin (state/store.py)
    again = state.lock(key).json
    assert again["acquired"] is True and again["takeover"] is True, again


def test_a_refusal_with_nothing_to_wait_for_has_no_retry_after(state):
    key = new_key()
    lock = state.lock(key).json
    assert state.set(key, status="Processed", lockToken=lock["lockToken"]).status == 200
    refused = state.lock(key)
    assert refused.json["acquired"] is False and refused.json["lockedUntil"] is None
    assert "retry-after" not in refused.headers
