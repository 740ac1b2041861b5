"""Catch-up split across instances (state/catchup.py, ADR-0011): a run leases each level-1 pointer it works
on (a conditional merge of the pointer row), so several instances' runs divide the backlog instead of all
walking the same pointers. The outcome is read from storage."""

from __future__ import annotations

import threading
from datetime import timedelta

from common import runtime
from state.catchup import Catchup, CatchupResult
from state.keys import STATE_TABLE, node_partition_range
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope
from tests.support.state_calls import _backlog, _outcome, _store


def _history_rows(entity: int) -> dict[str, int]:
    """History rows per item of the node, read straight from storage."""
    low, high = node_partition_range(3, 4, entity)
    rows = (
        runtime.tables()
        .table(STATE_TABLE)
        .query_entities(
            "PartitionKey ge @low and PartitionKey lt @high", parameters={"low": low, "high": high}
        )
    )
    per: dict[str, int] = {}
    for r in rows:
        rk = str(r["RowKey"])
        if rk.startswith("~") or rk.endswith("|c"):
            continue
        item = rk.split("|")[1]
        per[item] = per.get(item, 0) + 1
    return per


def test_two_instances_divide_the_backlog_and_fail_each_lock_once(fresh_tables: str) -> None:
    # Given 64 expired locks spread over 16 shards (16 level-1 pointers)
    store = _store(fresh_tables, shards=16)
    now = _backlog(store, 64, entity=6)
    runners = [
        Catchup(_store(fresh_tables, shards=16), parallelism=2, owner=f"instance-{n}") for n in range(2)
    ]
    assert runners[0].owner != runners[1].owner
    results: list[list[CatchupResult]] = [[], []]
    start = threading.Barrier(2)

    def instance(n: int) -> None:
        start.wait()
        results[n] = runners[n].drain(now=now, max_rows=24)  # bounded runs

    threads = [threading.Thread(target=instance, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then storage holds every record Failed, no lock index row left, one history row per item
    assert _outcome(6) == (64, 64, 0)
    history = _history_rows(6)
    assert len(history) == 64 and set(history.values()) == {1}
    # And both instances did work, and no head was read by both (each pointer had one worker)
    failed = [sum(r.locks_failed for r in mine) for mine in results]
    assert all(n > 0 for n in failed), failed
    assert sum(failed) == 64
    assert sum(r.records_read for mine in results for r in mine) == 64
    assert sum(r.leases_skipped for mine in results for r in mine) > 0


def test_a_pointer_leased_by_another_instance_waits_for_its_lease_to_end(fresh_tables: str) -> None:
    store = _store(fresh_tables, shards=4)
    ctx = WriteContext()
    untils = []
    for n in range(8):
        outcome = store.lock(RecordKey(3, Scope(4), 7, "invoice", f"item-{n}"), ctx, 1)
        assert outcome.locked_until is not None
        untils.append(outcome.locked_until)
    last = max(untils)
    first, other = (
        Catchup(_store(fresh_tables, shards=4), parallelism=1, lease_ms=30_000, owner=f"instance-{n}")
        for n in range(2)
    )
    # Given one instance's run, just before the last lock expires, that leased the pointers it visited
    # (the clock estimate may step, so two expiries can fall within a millisecond: count, don't assume 7)
    before = last - timedelta(milliseconds=1)
    due = sum(until < before for until in untils)
    assert 1 <= due < 8
    done = first.run(now=before)
    assert done.locks_failed == due and done.minutes_visited >= 1
    # When another instance runs after the last lock expired, but within the lease
    skipped = other.run(now=last + timedelta(milliseconds=1))
    # Then it leaves the leased pointers alone (the last locks are still Processing in storage)
    assert skipped.locks_failed == 0 and skipped.records_read == 0
    assert skipped.leases_skipped == done.minutes_visited
    assert _outcome(7) == (8, due, 8 - due)
    # And once the lease has ended, it takes the pointer over and fails the last locks
    later = other.run(now=last + timedelta(seconds=31))
    assert later.locks_failed == 8 - due
    assert _outcome(7) == (8, 8, 0)
