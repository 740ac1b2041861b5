"""Catch-up reads the expiry index only: its cost follows expired locks, not the table."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from common.clock import utcnow
from common.roundtrips import ROUND_TRIPS
from state import service
from tests.state.conftest import new_key


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
    service.store().expiry.flush()
    time.sleep(1.3)
    # when the timer function runs
    from azure.functions.timer import TimerRequest

    with ROUND_TRIPS.measure() as tally:
        result = service.catchup().run()
    functions["state_catchup"].get_user_function()(TimerRequest(past_due=False))
    # then it read 5 index rows and 5 records, and turned exactly those into Failed
    assert result.index_rows_read == 5 and result.records_read == 5
    assert result.locks_failed == 5 and result.stale_index_rows == 0
    # one query of lock rows, one of retention rows, then per lock: read, transaction, index delete
    assert tally.requests == 2 + 5 * 3
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


def test_locks_released_before_the_index_is_flushed_never_reach_it(state, fresh_tables):
    expiry = service.store().expiry
    for _ in range(10):
        k = new_key()
        lock = state.lock(k, lockSeconds=1).json
        state.set(k, status="Processed", lockToken=lock["lockToken"])
    expiry.flush()
    time.sleep(1.2)
    result = service.catchup().run()
    assert result.index_rows_read == 0


def test_locks_released_after_the_flush_are_deleted_from_the_index(state, fresh_tables):
    expiry = service.store().expiry
    keys = [new_key() for _ in range(4)]
    tokens = [state.lock(k, lockSeconds=1).json["lockToken"] for k in keys]
    expiry.flush()
    for k, t in zip(keys, tokens, strict=True):
        state.set(k, status="Processed", lockToken=t)
    expiry.flush()
    time.sleep(1.2)
    assert service.catchup().run().index_rows_read == 0


def test_a_late_holder_of_a_caught_up_lock_gets_409(state, fresh_tables):
    key = new_key()
    lock = state.lock(key, lockSeconds=1).json
    time.sleep(1.3)
    assert service.catchup().run().locks_failed == 1
    late = state.set(key, status="Processed", lockToken=lock["lockToken"])
    assert late.status == 409
    assert state.lock(key).json["acquired"] is True


def test_two_instances_running_catchup_at_once_fail_each_lock_once(state, fresh_tables):
    keys = [new_key() for _ in range(20)]
    for k in keys:
        state.lock(k, lockSeconds=1)
    service.store().expiry.flush()
    time.sleep(1.3)
    results = []

    def run() -> None:
        results.append(service.catchup().run())

    workers = [threading.Thread(target=run) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sum(r.locks_failed for r in results) == 20
    for k in keys:
        history = state.history(k).json["items"]
        assert [i["status"] for i in history] == ["Failed", "Superseded"]


def test_catchup_does_bounded_work_per_run(state, fresh_tables):
    for _ in range(12):
        state.lock(new_key(), lockSeconds=1)
    service.store().expiry.flush()
    time.sleep(1.3)
    first = service.catchup().run(max_rows=5)
    second = service.catchup().run(max_rows=5)
    third = service.catchup().run(max_rows=5)
    assert (first.locks_failed, second.locks_failed, third.locks_failed) == (5, 5, 2)


def test_retention_catchup_marks_old_records_expired(state, fresh_tables):
    key = new_key()
    state.set(key, status="Processed", data={"x": 1}, handler={"options": {"retentionSeconds": 1}})
    service.store().expiry.flush()
    result = service.catchup().run(now=utcnow() + timedelta(seconds=2))
    assert result.records_expired == 1
    record = state.get(key).json
    assert record["status"] == "Expired" and record["data"]["data"] == {"x": 1}
    assert [i["originalStatus"] for i in state.history(key).json["items"]] == [None, "Processed"]


def test_concurrent_flushes_write_each_index_row_once(state, fresh_tables):
    # given 150 buffered lock rows that expired (written by the loader, as the benchmark does)
    from state.bench_support import bulk_records
    from state.keys import EXPIRY_TABLE

    expiry = service.store().expiry
    loaded = bulk_records(0, expired_locks=150)
    # when several threads flush at once and catch-up runs while they do
    workers = [threading.Thread(target=expiry.flush) for _ in range(4)]
    for w in workers:
        w.start()
    result = service.catchup().run()
    for w in workers:
        w.join()
    expiry.flush()
    # then every expired lock was failed once and the index holds nothing any more
    second = service.catchup().run()
    assert result.locks_failed + second.locks_failed == len(loaded.expired_locks)
    assert second.stale_index_rows == 0
    table = service.store()._tables.table(EXPIRY_TABLE)
    assert list(table.list_entities()) == []
