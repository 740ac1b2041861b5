"""The state invariants under the bench's storage budget (bench/throttle.py): Azure's per-partition and
per-account targets scaled down (÷ 200) in front of Azurite, refusals answered 503 ServerBusy / 500
OperationTimedOut as Azure answers them, the SDK's own retries on (the production set-up). Lock, set and
release races on one partition, far beyond its budget: the checkers of tests/reliability must find 0
violations, read from storage."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from bench.proxy import CountingProxy
from bench.throttle import Budget
from common import runtime
from tests.conftest import Caller, new_prefix
from tests.reliability.records import check_head_and_history, check_one_holder, check_recorded_once, new_key
from tests.reliability.tally import TALLY, sized
from tests.reliability.test_state_faults import call_with_retries

pytestmark = pytest.mark.slow
AREA = "state throttled"


def _endpoint(connection: str) -> str:
    value = next(p.split("=", 1)[1] for p in connection.split(";") if p.startswith("TableEndpoint"))
    return value.rsplit("/", 1)[0]


@pytest.fixture
def throttled(azurite_connection: str, settle_tables: str) -> Iterator[Budget]:
    """This test's own tables behind the throttle (SDK retries on); the budget reports what it refused."""
    budget = Budget.scaled()
    with CountingProxy(_endpoint(azurite_connection), budget=budget) as proxy:
        os.environ["SETTLE_TABLES"] = proxy.connection_string(azurite_connection)
        os.environ["SETTLE_TABLE_PREFIX"] = new_prefix()
        runtime.reset()
        try:
            yield budget
        finally:
            os.environ["SETTLE_TABLES"] = azurite_connection
            os.environ["SETTLE_TABLE_PREFIX"] = settle_tables
            runtime.reset()


def _race(call: Caller, calls: list[tuple[str, dict[str, Any]]], where: str) -> list[Any]:
    """Every call at the same instant, each retried on 503 as the documented client does."""
    answers: list[Any] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def caller(n: int) -> None:
        barrier.wait()
        answers[n] = call_with_retries(call, calls[n][0], calls[n][1], where)[0]

    workers = [threading.Thread(target=caller, args=(n,)) for n in range(len(calls))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    return answers


def test_lock_set_and_release_races_beyond_a_partitions_budget_break_no_invariant(
    throttled: Budget, call: Caller
) -> None:
    threads = 6
    for round_no in range(sized(8, 3)):
        key = new_key()
        where = f"throttled round {round_no}"
        # Given six callers locking one key at the same instant (one partition, beyond its budget)
        bodies = [{"key": key, "lockSeconds": 600, "requestId": f"r{round_no}-{n}"} for n in range(threads)]
        answers = _race(call, [("state_lock", b) for b in bodies], where)
        TALLY.add(AREA, operations=threads, races=1)
        TALLY.check(AREA, all(a.status == 200 for a in answers), f"{where}: {[a.status for a in answers]}")
        jsons = [a.json for a in answers]
        rows = check_head_and_history(AREA, call, key, where)
        holder = check_one_holder(AREA, jsons, threads, rows.head, where)
        token = holder["lockToken"]
        # When the holder sets while the others release with its token at once (one must win, once)
        racing = [("state_set", {"key": key, "lockToken": token, "status": "Processed"})]
        racing += [
            ("state_release", {"key": key, "lockToken": token, "error": f"gave up {n}"})
            for n in range(threads - 1)
        ]
        finished = _race(call, racing, where)
        TALLY.add(AREA, operations=threads, races=1)
        statuses = [f.status for f in finished]
        TALLY.check(AREA, all(s in (200, 409) for s in statuses), f"{where}: finish answers {statuses}")
        # Then storage holds the lock recorded once and exactly one outcome, versions contiguous
        rows = check_head_and_history(AREA, call, key, where)
        check_recorded_once(AREA, rows, [["Processing", "Processed"], ["Processing", "Failed"]], where)
    # And the budget did refuse (counted as the faults of this area): the invariants held under throttling
    TALLY.add(AREA, faults=throttled.refusals())
    TALLY.check(AREA, throttled.refusals() > 0, "the throttle refused nothing: the test proved nothing")
