"""Catch-up that scales out (state/catchup.py): level-1 pointers (one per minute and partition) are worked
on in parallel, so a backlog spread over a node's shards is caught up by several workers at once; the
outcome is read from storage, never from catch-up's own report."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

from azure.core.pipeline.policies import SansIOHTTPPolicy

from common import runtime
from common.roundtrips import ROUND_TRIPS
from common.settings import TableSettings
from common.tables import Tables
from state.catchup import Catchup
from state.keys import STATE_TABLE, Layout, node_partition_range
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope, Status
from state.store import StateStore


class Threads(SansIOHTTPPolicy[Any, Any]):
    """Which threads sent requests."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def on_request(self, request: Any) -> None:
        self.names.add(threading.current_thread().name)


def _store(fresh: str, policies: list[Any] | None = None, shards: int = 8) -> StateStore:
    settings = TableSettings.from_env()
    assert settings.prefix == fresh
    return StateStore(Tables(settings, policies=policies or []), layout=Layout(shards))


def _backlog(store: StateStore, count: int, entity: int) -> datetime:
    ctx = WriteContext()
    untils = []
    for n in range(count):
        key = RecordKey(3, Scope(4), entity, "invoice", f"item-{n}")
        outcome = store.lock(key, ctx, 1)
        assert outcome.acquired and outcome.locked_until is not None
        untils.append(outcome.locked_until)
    return max(untils) + timedelta(milliseconds=1)


def _outcome(entity: int) -> tuple[int, int, int]:
    """(heads, heads Failed, heads still Processing: locks not caught up) of the node, read straight from
    storage (a lock has no index row of its own: its entry is in its minute's marker, ADR-0021)."""
    low, high = node_partition_range(3, 4, entity)
    rows = list(
        runtime.tables()
        .table(STATE_TABLE)
        .query_entities(
            "PartitionKey ge @low and PartitionKey lt @high", parameters={"low": low, "high": high}
        )
    )
    heads = [r for r in rows if str(r["RowKey"]).endswith("|c")]
    failed = [r for r in heads if int(r["Status"]) == int(Status.FAILED)]
    left = [r for r in heads if int(r["Status"]) == int(Status.PROCESSING)]
    return len(heads), len(failed), len(left)


def test_a_backlog_over_shards_is_caught_up_by_parallel_workers(fresh_tables: str) -> None:
    store = _store(fresh_tables)
    now = _backlog(store, 48, entity=1)
    seen = Threads()
    catchup = Catchup(_store(fresh_tables, [seen]), parallelism=4)
    # When one run works on the 8 shards' pointers with 4 workers
    with ROUND_TRIPS.measure() as tally:
        result = catchup.run(now=now)
    # Then storage holds every record Failed and no lock index row (not catch-up's word for it)
    assert _outcome(1) == (48, 48, 0)
    assert result.locks_failed == 48 and result.minutes_visited >= 8
    # And the work was spread over several threads, each counted in the caller's measure
    assert len(seen.names) >= 2
    assert tally.requests >= 2 + 2 * result.minutes_visited + 48 * 2


def test_one_worker_and_many_do_the_same_work(fresh_tables: str) -> None:
    store = _store(fresh_tables)
    now = _backlog(store, 24, entity=2)
    now2 = _backlog(store, 24, entity=5)
    one = Catchup(_store(fresh_tables), parallelism=1).run(now=max(now, now2))
    assert _outcome(2) == (24, 24, 0) and _outcome(5) == (24, 24, 0)
    assert one.locks_failed == 48


def test_a_bounded_run_stops_at_its_budget_with_many_workers(fresh_tables: str) -> None:
    store = _store(fresh_tables)
    now = _backlog(store, 40, entity=4)
    catchup = Catchup(_store(fresh_tables), parallelism=8)
    first = catchup.run(now=now, max_rows=20)
    assert first.exhausted and first.locks_failed < 40
    results = catchup.drain(now=now, max_rows=20)
    assert _outcome(4) == (40, 40, 0)
    assert first.locks_failed + sum(r.locks_failed for r in results) == 40


def test_a_drain_reaches_every_pointer_when_its_runs_are_smaller_than_the_pointers_open(
    fresh_tables: str,
) -> None:
    # Given 64 expired locks over 16 shards: 16 open pointers (this minute's), more than one run's budget
    store = _store(fresh_tables, shards=16)
    now = _backlog(store, 64, entity=8)
    # When one timer drains them in runs of 6 rows (a pointer and 4 rows cost 5)
    results = Catchup(_store(fresh_tables, shards=16), parallelism=1).drain(now=now, max_rows=6)
    # Then every lock is Failed (read from storage): later runs did not spend their budget re-visiting
    # the pointers earlier runs emptied (they did, and the drain stopped with 10 pointers never reached)
    assert _outcome(8) == (64, 64, 0), [r.locks_failed for r in results]
    assert sum(r.locks_failed for r in results) == 64
