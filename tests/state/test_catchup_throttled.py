"""Catch-up under throttling: storage answering 503 ServerBusy / 500 OperationTimedOut to
catch-up's transactions delays it, never aborts the run. A state write is not retried by the SDK (the
store settles an ambiguous answer itself, asking once more), so two refusals in a row reach catch-up: it
backs off and tries the record again instead of giving up the whole run (every other worker's pointers
with it). Outcome read from storage."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.proxy import CountingProxy
from bench.throttle import OPERATION_TIMED_OUT, SERVER_BUSY, Budget, Charge, Refusal
from common import runtime
from state.catchup import Catchup
from tests.support.state_calls import _backlog, _outcome, _store


class RefuseTransactions(Budget):
    """No rate limit; the first ``count`` entity-group transactions are refused as Azure throttles."""

    def __init__(self, count: int) -> None:
        super().__init__(partition_per_s=1e9, account_per_s=1e9)
        self.left = count
        self.answered: list[int] = []

    def admit(self, charge: Charge) -> Refusal | None:
        with self._lock:
            if charge.write and len(charge.rows) > 1 and self.left > 0:
                self.left -= 1
                refusal = Refusal(500, OPERATION_TIMED_OUT, "partition") if self.left % 3 == 0 else None
                refusal = refusal or Refusal(503, SERVER_BUSY, "partition")
                self.answered.append(refusal.status)
                return refusal
        return super().admit(charge)


@pytest.fixture
def refusing(azurite_connection: str, fresh_tables: str) -> Iterator[RefuseTransactions]:
    budget = RefuseTransactions(6)
    endpoint = next(
        p.split("=", 1)[1] for p in azurite_connection.split(";") if p.startswith("TableEndpoint")
    )
    with CountingProxy(endpoint.rsplit("/", 1)[0], budget=budget) as proxy:
        os.environ["SETTLE_TABLES"] = proxy.connection_string(azurite_connection)
        runtime.reset()
        try:
            yield budget
        finally:
            os.environ["SETTLE_TABLES"] = azurite_connection
            runtime.reset()


def test_catch_up_refused_by_a_throttled_partition_backs_off_and_fails_every_lock(
    refusing: RefuseTransactions, fresh_tables: str
) -> None:
    # Given expired locks (written before the refusals start: the first transactions are catch-up's)
    refusing.left = 0
    now = _backlog(_store(fresh_tables, shards=2), 6, entity=9)
    refusing.left = 6
    # When catch-up's transactions are refused six times (503 ServerBusy, 500 OperationTimedOut)
    result = Catchup(_store(fresh_tables, shards=2), parallelism=2).run(now=now)
    # Then the run is not aborted: every lock is Failed, no index row left, read from storage
    assert refusing.left == 0 and set(refusing.answered) == {500, 503}
    assert _outcome(9) == (6, 6, 0)
    assert result.locks_failed == 6
