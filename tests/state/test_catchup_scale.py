"""Catch-up that scales out (state/catchup.py): level-1 pointers (one per minute and partition) are worked
on in parallel, so a backlog spread over a node's shards is caught up by several workers at once; the
outcome is read from storage, never from catch-up's own report."""

from __future__ import annotations

import threading
from typing import Any

from azure.core.pipeline.policies import SansIOHTTPPolicy

from common.roundtrips import ROUND_TRIPS
from state.catchup import Catchup
from tests.support.state_calls import _backlog, _outcome, _store


class Threads(SansIOHTTPPolicy[Any, Any]):
    """Which threads sent requests."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def on_request(self, request: Any) -> None:
        self.names.add(threading.current_thread().name)


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
