"""What a long-running caller needs from the lock answer and from extensions.

* The lock answer says how the previous attempt ended (``previousAttempt``: its status, its error, and
  whether it ended because its lock expired), the same whether the new lock took the expired lock over
  or catch-up had already turned it Failed.
* Extending a lock rewrites the head in place: an hour of extensions leaves one history row (the lock's
  start, written when the outcome supersedes it), while a stale or foreign token is still refused.
* Every time in an answer is ISO-8601 UTC to the millisecond, in one format.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

from common.clock import utcnow
from state import service
from tests.state.conftest import new_key
from tests.support.state_calls import lock_lost, rows_of

MS_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def history_rows(key: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in rows_of(key) if not r["RowKey"].endswith("|c")]


# -- the previous attempt -------------------------------------------------------------------------------
def test_a_new_key_has_no_previous_attempt(state, key):
    answer = state.lock(key).json
    assert answer["acquired"] and answer["previousAttempt"] is None


def test_a_takeover_reports_the_previous_attempt_as_expired(state, key):
    state.lock(key, lockSeconds=1)
    time.sleep(2.0)
    answer = state.lock(key).json
    assert answer["acquired"] and answer["takeover"] is True
    assert answer["previousAttempt"]["status"] == "Processing"
    assert answer["previousAttempt"]["lockExpired"] is True
    assert answer["previousAttempt"]["error"] is None


def test_after_catch_up_the_previous_attempt_is_still_reported_as_expired(state, key):
    # given a holder that crashed: its lock expired and catch-up made the record Failed
    state.lock(key, lockSeconds=1)
    time.sleep(1.1)
    assert service.catchup().run(now=utcnow() + timedelta(seconds=1)).locks_failed >= 1
    assert state.get(key).json["substatus"] == "LockExpired"
    # when the next worker locks it
    answer = state.lock(key).json
    # then it is no takeover, yet the answer says the previous attempt ended by expiry
    assert answer["acquired"] and answer["takeover"] is False
    previous = answer["previousAttempt"]
    assert previous["status"] == "Failed" and previous["lockExpired"] is True
    assert previous["error"].startswith("The lock expired")


def test_a_released_attempt_is_reported_with_its_error_and_not_as_expired(state, key):
    token = state.lock(key).json["lockToken"]
    state.release(key, error="ERP timeout", lockToken=token)
    previous = state.lock(key).json["previousAttempt"]
    assert previous == {**previous, "status": "Failed", "error": "ERP timeout", "lockExpired": False}


def test_a_replayed_lock_still_reports_the_previous_attempt(state, key):
    # given a takeover whose answer was lost
    state.lock(key, lockSeconds=1)
    time.sleep(2.0)
    first = state.lock(key, requestId="attempt-2").json
    assert first["takeover"] is True
    # when the caller retries with the same requestId
    again = state.lock(key, requestId="attempt-2").json
    # then it gets that lock back and the same account of the attempt before it
    assert again["replayed"] is True and again["previousAttempt"] == first["previousAttempt"]
    assert again["previousAttempt"]["lockExpired"] is True


def test_a_refused_lock_reports_no_previous_attempt(state, key):
    state.lock(key)
    answer = state.lock(key).json
    assert answer["acquired"] is False and answer["previousAttempt"] is None


# -- extensions do not flood history ------------------------------------------------------------------------
def test_many_extensions_add_one_history_row_and_fencing_stays_exact(state, key):
    first = state.lock(key, lockSeconds=60).json
    tokens = [first["lockToken"]]
    until = first["lockedUntil"]
    for _ in range(10):
        answer = state.extend(key, lockToken=tokens[-1], lockSeconds=60).json
        assert answer["lockedUntil"] >= until
        until = answer["lockedUntil"]
        tokens.append(answer["lockToken"])
    assert history_rows(key) == [], "an extension wrote a history row"
    head = state.get(key).json
    assert head["status"] == "Processing" and head["lockedUntil"] == until and head["version"] == 1
    # a token of another lock of the same record is refused, before and after the outcome
    other = new_key()
    foreign = state.lock(other).json["lockToken"]
    lock_lost(state.set(key, status="Processed", lockToken=foreign))
    done = state.set(key, status="Processed", data={"ok": 1}, lockToken=tokens[-1])
    assert done.status == 200 and done.json["version"] == 2
    statuses = [(r["status"], r.get("originalStatus")) for r in state.history(key).json["items"]]
    assert statuses == [("Processed", None), ("Superseded", "Processing")]
    # a stale token of the same (now ended) lock writes nothing
    lock_lost(state.release(key, error="late", lockToken=tokens[0]))
    lock_lost(state.extend(key, lockToken=tokens[3], lockSeconds=60))


def test_an_extended_lock_that_expires_is_taken_over_and_the_old_holder_is_refused(state, key):
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    token = state.extend(key, lockToken=token, lockSeconds=1).json["lockToken"]
    time.sleep(2.0)
    rival = state.lock(key).json
    assert rival["acquired"] and rival["takeover"] is True
    lock_lost(state.extend(key, lockToken=token, lockSeconds=60))
    lock_lost(state.set(key, status="Processed", lockToken=token))
    assert state.set(key, status="Processed", lockToken=rival["lockToken"]).status == 200


def test_catch_up_fails_an_extended_lock_once_its_extension_is_over(fresh_tables, state, key):
    # fresh tables: catch-up 70 s ahead would otherwise also fail the locks other tests left behind
    token = state.lock(key, lockSeconds=1).json["lockToken"]
    state.extend(key, lockToken=token, lockSeconds=2)
    # the first expiry is over, the extension is not: catch-up leaves it
    catchup = service.catchup()
    assert catchup.run(now=utcnow() + timedelta(seconds=1.2)).locks_failed == 0
    assert state.get(key).json["status"] == "Processing"
    # once the extension is over too, catch-up finds it through the index row the extension wrote
    later = utcnow() + timedelta(seconds=70)
    failed = sum(catchup.run(now=later).locks_failed for _ in range(3))
    assert failed == 1 and state.get(key).json["substatus"] == "LockExpired"


# -- times ---------------------------------------------------------------------------------------------------
def test_every_time_in_an_answer_is_utc_to_the_millisecond(state, key):
    lock = state.lock(key, lockSeconds=60).json
    extended = state.extend(key, lockToken=lock["lockToken"], lockSeconds=60).json
    record = state.set(key, status="Processed", lockToken=extended["lockToken"]).json
    history = state.history(key).json["items"]
    times = [lock["lockedUntil"], extended["lockedUntil"]]
    for row in [record, *history]:
        times += [
            row[f]
            for f in ("lockedAt", "lockedUntil", "createdAt", "updatedAt", "supersededAt")
            if row.get(f)
        ]
    assert len(times) >= 6
    assert [t for t in times if not MS_TIME.match(t)] == []
