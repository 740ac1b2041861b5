"""Catch-up is complete and reads only the expiry index: its cost follows expired locks, not the table.

The index is two levels (state/expiry.py, ADR-0011): a lock's entry in its minute's marker beside its head
(ADR-0021), merged in the head's own transaction, and a row per (minute, partition) in ``statelocks``,
guarded by those markers.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from common import runtime
from common.clock import utcnow
from common.roundtrips import ROUND_TRIPS
from state import service
from state.catchup import Catchup
from state.keys import EXPIRY_TABLE, STATE_TABLE, head_row_key, partition_key
from state.lifecycle import WriteContext
from state.schemas import KeyIn
from state.store import StateStore
from tests.state.conftest import new_key

BUCKET_MS = 60_000  # the expiry index's minute


def epoch_ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def bucket_of(ms: int) -> int:
    return ms // BUCKET_MS


ROOT = Path(__file__).resolve().parents[2]


def index_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(level-2 rows and markers in the state table, level-1 rows), read straight from storage."""
    tables = runtime.tables()
    level2: list[dict[str, Any]] = list(
        tables.table(STATE_TABLE).query_entities(
            "RowKey ge @low and RowKey lt @high", parameters={"low": "~", "high": "~~"}
        )
    )
    level1 = [dict(e) for e in tables.table(EXPIRY_TABLE).list_entities() if e["PartitionKey"][0] in "lr"]
    return level2, level1


def entries_of(level2: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """Every lock entry of the markers read: (partition, lock id) -> (its value, the marker)."""
    return {
        (m["PartitionKey"], name[1:]): (value, m)
        for m in level2
        if "StateRK" not in m
        for name, value in m.items()
        if name.startswith("L")
    }


def until_of(state, key) -> datetime:
    return datetime.fromisoformat(state.get(key).json["lockedUntil"])


def catch_up_until_quiet(now: datetime, *, runs: int = 20) -> int:
    failed = 0
    for _ in range(runs):
        result = service.catchup().run(now=now)
        failed += result.locks_failed
        if result.locks_failed == 0 and result.records_expired == 0 and result.stale_index_rows == 0:
            break
    return failed


def test_catchup_over_many_records_reads_only_the_expired_locks(state, fresh_tables, call, functions):
    # given 300 finished records, 20 live locks and 5 locks that expire
    for _ in range(300):
        k = new_key()
        lock = state.lock(k).json
        state.set(k, status="Processed", lockToken=lock["lockToken"])
    live = [new_key() for _ in range(20)]
    for k in live:
        state.lock(k)
    expiring = [new_key() for _ in range(5)]
    for k in expiring:
        state.lock(k, lockSeconds=1)
    untils = [until_of(state, k) for k in expiring]
    now = max(untils)  # every short lock is due, no minute is over yet
    # when catch-up runs
    with ROUND_TRIPS.measure() as tally:
        result = service.catchup().run(now=now)
    # then it read the level-1 rows, the markers of those minutes (the 5 locks' entries) and the 5
    # records, and turned exactly those into Failed: never a finished record or a live lock of later minutes
    minutes = len({bucket_of(epoch_ms(u)) for u in untils})
    assert result.minutes_visited == minutes and result.minutes_closed == 0
    assert result.index_rows_read == 2 * minutes and result.records_read == 5
    assert result.locks_failed == 5 and result.stale_index_rows == 0
    # two level-1 queries (locks, retention), per minute its lease (a conditional merge that keeps other
    # instances' runs off it) and one range read, per lock a read and a transaction
    assert tally.requests == 2 + 2 * minutes + 5 * 2
    for k in expiring:
        record = state.get(k).json
        assert record["status"] == "Failed" and record["substatus"] == "LockExpired"
        assert "expired" in record["error"]
        history = state.history(k).json["items"]
        assert [(i["status"], i["originalStatus"]) for i in history] == [
            ("Failed", None),
            ("Superseded", "Processing"),
        ]
    for k in live:
        assert state.get(k).json["status"] == "Processing"
    # and the timer function does the same work (nothing left)
    from azure.functions.timer import TimerRequest

    functions["state_catchup"].get_user_function()(TimerRequest(past_due=False))


def test_every_live_lock_has_its_index_rows_and_a_finished_one_has_none(state, fresh_tables):
    keys = [new_key(entityId=e) for e in range(1, 5) for _ in range(25)]
    for k in keys:
        assert state.lock(k, lockSeconds=random.choice([1, 30, 90, 600])).json["acquired"]
    for k in keys[::2]:
        state.release(k, error="done")
    level2, level1 = index_rows()
    entries = entries_of(level2)
    pointers = {(r["PartitionKey"], r["RowKey"]) for r in level1}
    for k in keys:
        record = state.get(k).json
        rk = KeyIn.model_validate(k).record_key()
        head = (
            runtime.tables()
            .table(STATE_TABLE)
            .get_entity(partition_key(rk.tenant_id, rk.scope, rk.entity_id), head_row_key(rk))
        )
        if record["status"] == "Processing":
            # its minute's marker names it (ADR-0021), and level 1 points at that minute
            value, marker = entries[(head["PartitionKey"], head["LockId"])]
            assert value == f"{epoch_ms(head['LockedUntil'])}|{head['RowKey']}"
            bucket = bucket_of(epoch_ms(head["LockedUntil"]))
            assert marker["RowKey"].startswith(f"~l|{bucket:010d}|n")
            assert (f"l{bucket:010d}", head["PartitionKey"]) in pointers
        else:
            assert "LockIndexKey" not in head
    # no lock has an index row (the outcome deleted nothing, the lock wrote none); every lock has an entry
    assert [r for r in level2 if "StateRK" in r] == []
    assert len(entries) == len(keys)


def test_240_locks_of_one_second_taken_by_8_threads_are_all_caught_up(state, fresh_tables):
    # given 8 threads each taking 30 one-second locks over 6 partitions
    keys = [new_key(entityId=1 + i % 6) for i in range(240)]
    errors: list[str] = []

    def locker(mine: list[dict[str, Any]]) -> None:
        for k in mine:
            answer = state.lock(k, lockSeconds=1)
            if answer.status != 200 or not answer.json["acquired"]:
                errors.append(f"{answer.status} {answer.body!r}")

    workers = [threading.Thread(target=locker, args=(keys[i::8],)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
    assert errors == []
    # when catch-up runs once the locks expired (until nothing is left to do)
    failed = catch_up_until_quiet(utcnow() + timedelta(seconds=3))
    # then every lock became Failed with its history row, and none is left Processing
    assert failed == 240
    for k in keys:
        items = state.history(k).json["items"]
        assert [(i["status"], i["substatus"]) for i in items] == [
            ("Failed", "LockExpired"),
            ("Superseded", None),
        ]


def test_locks_of_a_process_that_exits_normally_are_caught_up(state, fresh_tables):
    # given a process that takes five one-second locks and exits normally
    keys = [new_key() for _ in range(5)]
    script = (
        "import json, sys\n"
        "import azure.functions as func\n"
        "import function_app\n"
        "fn = {f.get_function_name(): f for f in function_app.app.get_functions()}['state_lock']\n"
        "for key in json.loads(sys.argv[1]):\n"
        "    body = json.dumps({'key': key, 'lockSeconds': 1}).encode()\n"
        "    req = func.HttpRequest('POST', 'http://localhost/api/v1/state/lock', body=body, headers={})\n"
        "    assert fn.get_user_function()(req).status_code == 200\n"
    )
    import json

    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(keys)], cwd=ROOT, env=dict(os.environ), timeout=120
    )
    assert done.returncode == 0
    # when catch-up runs here after the locks expired
    failed = catch_up_until_quiet(utcnow() + timedelta(seconds=3))
    # then all five are Failed
    assert failed == 5
    assert [state.get(k).json["status"] for k in keys] == ["Failed"] * 5


def test_locks_released_before_they_expire_are_read_once_and_not_again(state, fresh_tables):
    # ADR-0021: the outcome deletes nothing, so catch-up reads a finished lock's head once when its
    # minute is due, skips it, and a later run of the process passes it by without a read
    for _ in range(10):
        k = new_key()
        lock = state.lock(k, lockSeconds=1).json
        state.set(k, status="Processed", lockToken=lock["lockToken"])
    level2, _ = index_rows()
    assert [r for r in level2 if "StateRK" in r] == []
    result = service.catchup().run(now=utcnow() + timedelta(seconds=2))
    assert result.records_read == 10 and result.locks_failed == 0
    again = service.catchup().run(now=utcnow() + timedelta(seconds=2))
    assert again.records_read == 0 and again.locks_failed == 0


def test_a_minute_that_is_over_is_closed_and_leaves_no_index_rows(state, fresh_tables):
    # given locks that were concluded, expired and extended in several partitions
    keys = [new_key(entityId=e) for e in range(1, 4) for _ in range(4)]
    tokens = [state.lock(k, lockSeconds=1).json["lockToken"] for k in keys]
    state.set(keys[0], status="Processed", lockToken=tokens[0])
    state.extend(keys[1], lockToken=tokens[1], lockSeconds=120)
    # when catch-up runs once every minute involved is over
    later = utcnow() + timedelta(minutes=4)
    catch_up_until_quiet(later)
    # then the expired locks are Failed and no index row, marker or level-1 row is left
    assert [state.get(k).json["status"] for k in keys[1:]] == ["Failed"] * (len(keys) - 1)
    level2, level1 = index_rows()
    assert (level2, level1) == ([], [])


def test_a_lock_in_a_minute_catch_up_just_closed_prepares_again_and_is_found(state, fresh_tables):
    # given a process that prepared a partition's minute M (its marker is cached) ...
    first = new_key()
    token = state.lock(first, lockSeconds=90).json["lockToken"]
    bucket = bucket_of(epoch_ms(until_of(state, first)))
    state.set(first, status="Processed", lockToken=token)
    # ... and a catch-up that closed M meanwhile (deleted the marker and the level-1 row)
    after_m = datetime.fromtimestamp(((bucket + 1) * BUCKET_MS + 10_000) / 1000, tz=UTC)
    assert service.catchup().run(now=after_m).minutes_closed == 1
    assert index_rows() == ([], [])
    # when the same process takes another lock expiring in M (its cached marker is gone)
    second = new_key()
    seconds = round(((bucket * BUCKET_MS + 30_000) - epoch_ms(utcnow())) / 1000)
    answer = state.lock(second, lockSeconds=seconds).json
    assert answer["acquired"] and bucket_of(epoch_ms(until_of(state, second))) == bucket
    # then it made a new marker and level-1 row, and catch-up finds the lock
    _, level1 = index_rows()
    assert [r["PartitionKey"] for r in level1] == [f"l{bucket:010d}"]
    assert service.catchup().run(now=after_m).locks_failed == 1
    assert state.get(second).json["substatus"] == "LockExpired"


def test_a_late_holder_of_a_caught_up_lock_gets_409(state, fresh_tables):
    key = new_key()
    lock = state.lock(key, lockSeconds=1).json
    time.sleep(2.0)
    # Catch-up on its own clock would wait out the estimate's uncertainty (up to seconds on a fresh
    # instance); this test is about the late holder, so catch-up runs at an instant surely past.
    assert service.catchup().run(now=utcnow() + timedelta(seconds=10)).locks_failed == 1
    late = state.set(key, status="Processed", lockToken=lock["lockToken"])
    assert late.status == 409
    assert state.lock(key).json["acquired"] is True


def test_two_instances_running_catchup_at_once_fail_each_lock_once(state, fresh_tables):
    keys = [new_key(entityId=1 + i % 3) for i in range(30)]
    for k in keys:
        state.lock(k, lockSeconds=1)
    now = utcnow() + timedelta(seconds=3)
    results = []
    barrier = threading.Barrier(2)

    def instance() -> None:
        catchup = Catchup(StateStore(runtime.tables()))  # its own caches, like another instance
        barrier.wait()
        for _ in range(5):
            results.append(catchup.run(now=now))

    workers = [threading.Thread(target=instance) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert sum(r.locks_failed for r in results) == 30
    for k in keys:
        history = state.history(k).json["items"]
        assert [i["status"] for i in history] == ["Failed", "Superseded"]


def test_catchup_does_bounded_work_per_run(state, fresh_tables):
    for _ in range(12):
        state.lock(new_key(), lockSeconds=1)
    now = utcnow() + timedelta(seconds=2)
    runs = [service.catchup().run(now=now, max_rows=6) for _ in range(4)]
    # each run visits at most 6 pointers + rows; together they fail all 12 locks, none twice
    assert all(r.minutes_visited + r.locks_failed <= 6 for r in runs)
    assert sum(r.locks_failed for r in runs) == 12 and runs[0].locks_failed >= 4


def test_retention_catchup_marks_old_records_expired(state, fresh_tables):
    key = new_key()
    state.set(key, status="Processed", data={"x": 1}, handler={"options": {"retentionSeconds": 1}})
    result = service.catchup().run(now=utcnow() + timedelta(seconds=2))
    assert result.records_expired == 1
    record = state.get(key).json
    assert record["status"] == "Expired" and record["data"]["data"] == {"x": 1}
    assert [i["originalStatus"] for i in state.history(key).json["items"]] == [None, "Processed"]


def test_a_caught_up_lock_with_retention_gets_its_retention_deadline(state, fresh_tables):
    key = new_key()
    state.lock(key, lockSeconds=1, handler={"options": {"retentionSeconds": 60}})
    later = utcnow() + timedelta(seconds=2)
    assert service.catchup().run(now=later).locks_failed == 1
    assert service.catchup().run(now=later + timedelta(seconds=61)).records_expired == 1
    assert [i["originalStatus"] for i in state.history(key).json["items"]] == [None, "Failed", "Processing"]


def test_one_timer_run_catches_up_more_expired_locks_than_one_run_handles(
    state, fresh_tables, functions, monkeypatch
):
    # Given more expired locks than one catch-up run handles (after a crashed fleet, say; the run's bound
    # is lowered from DEFAULT_MAX_ROWS so the backlog stays small), over three partitions
    from azure.functions.timer import TimerRequest

    from state import catchup

    monkeypatch.setattr(catchup, "DEFAULT_MAX_ROWS", 20)
    monkeypatch.setattr(catchup, "DRAIN_SECONDS", 600.0)  # ample on any machine: no timing is asserted
    store = service.store()  # the timer's own store and clock
    keys = [KeyIn.model_validate(new_key(entityId=900 + i % 3)).record_key() for i in range(60)]
    for k in keys:
        assert store.lock(k, WriteContext(), 1).acquired
    assert service.catchup().run(now=utcnow() + timedelta(seconds=2)).exhausted  # one run cannot do it all
    time.sleep(2.0)  # every lock has expired (the timer runs at the real time)
    # When the timer fires once
    functions["state_catchup"].get_user_function()(TimerRequest(past_due=False))
    # Then every lock is Failed: the timer ran as many bounded runs as the backlog needed
    heads = {
        e["RowKey"]: e
        for pk in {partition_key(k.tenant_id, k.scope, k.entity_id) for k in keys}
        for e in runtime.tables()
        .table(STATE_TABLE)
        .query_entities("PartitionKey eq @pk and Status ne 5", parameters={"pk": pk})
        if "Version" in e
    }
    assert [heads[head_row_key(k)]["Status"] for k in keys] == [3] * len(keys)
    assert {heads[head_row_key(k)]["Substatus"] for k in keys} == {"LockExpired"}


def test_the_timer_stops_draining_when_its_time_budget_is_spent(state, fresh_tables, monkeypatch):
    # Given a backlog larger than one run, and a time budget already spent after the first run
    from state import catchup

    for _ in range(8):
        state.lock(new_key(), lockSeconds=1)
    monkeypatch.setattr(catchup, "DRAIN_SECONDS", 0.0)
    # When the timer drains with runs of 3 rows
    results = service.catchup().drain(max_rows=3, now=utcnow() + timedelta(seconds=2))
    # Then it did one bounded run and left the rest for the next timer
    assert len(results) == 1 and results[0].exhausted and results[0].locks_failed < 8
    # and without the time limit it drains the backlog, each run bounded
    monkeypatch.setattr(catchup, "DRAIN_SECONDS", 600.0)
    more = service.catchup().drain(max_rows=3, now=utcnow() + timedelta(seconds=2))
    assert results[0].locks_failed + sum(r.locks_failed for r in more) == 8
    assert not more[-1].exhausted and all(r.minutes_visited + r.locks_failed <= 3 for r in more)
