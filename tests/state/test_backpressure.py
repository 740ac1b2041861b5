"""Backpressure, never loss: state traffic far beyond the storage budget (bench/throttle.py in front of
Azurite, answering 503 ServerBusy / 500 OperationTimedOut as Azure does) gets 503 + ``Retry-After``, never
a 500, and callers that retry end with every record complete: read from storage, every item Processed with
its one history row and no lock index row left, nothing twice."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from bench.proxy import CountingProxy
from bench.throttle import Budget, VirtualClock
from common import runtime
from state.keys import STATE_TABLE, node_partition_range
from tests.conftest import Caller, HttpResult
from tests.state.conftest import State, new_key


def _endpoint(connection: str) -> str:
    value = next(p.split("=", 1)[1] for p in connection.split(";") if p.startswith("TableEndpoint"))
    return value.rsplit("/", 1)[0]


@pytest.fixture
def throttled(
    azurite_connection: str, fresh_tables: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Budget]:
    # Virtual time (10 ms per request): the same throttling on a fast or a loaded machine.
    budget = Budget(partition_per_s=12, account_per_s=40, timeout_every=4, clock=VirtualClock(0.01))
    with CountingProxy(_endpoint(azurite_connection), budget=budget) as proxy:
        monkeypatch.setenv("SETTLE_TABLES", proxy.connection_string(azurite_connection))
        runtime.reset(client_options={"retry_total": 0})  # every refusal reaches Settle's own mapping
        yield budget
    monkeypatch.setenv("SETTLE_TABLES", azurite_connection)
    monkeypatch.delenv("SETTLE_STATE_SHARDS", raising=False)
    runtime.reset()


@pytest.mark.parametrize("shards", [1, 4])
def test_beyond_the_budget_every_answer_is_503_with_retry_after_and_nothing_is_lost(
    throttled: Budget, call: Caller, shards: int, monkeypatch: pytest.MonkeyPatch, azurite_connection: str
) -> None:
    monkeypatch.setenv("SETTLE_STATE_SHARDS", str(shards))
    runtime.reset(client_options={"retry_total": 0})
    state = State(call)
    entity = 900 + shards
    keys = [new_key(entityId=entity, itemKey=f"bp-{uuid.uuid4().hex[:8]}") for _ in range(24)]
    statuses: Counter[int] = Counter()
    bad: list[str] = []
    lock = threading.Lock()

    def patiently(send: Any) -> HttpResult:
        for _ in range(400):
            answer: HttpResult = send()
            with lock:
                statuses[answer.status] += 1
            if answer.status != 503:
                return answer
            retry_after = answer.headers.get("Retry-After") or answer.headers.get("retry-after")
            problem = answer.json or {}
            if not retry_after or int(retry_after) < 1 or problem.get("status") != 503:
                with lock:
                    bad.append(f"503 without Retry-After or problem: {answer.headers} {problem}")
            time.sleep(0.03)  # a caller honouring Retry-After, shortened for the test
        raise AssertionError("never admitted")

    def worker(mine: list[dict[str, Any]]) -> None:
        for k in mine:
            taken = patiently(lambda k=k: state.lock(k))
            body = taken.json
            if taken.status != 200 or not body.get("acquired"):
                with lock:
                    bad.append(f"lock: {taken.status} {body}")
                continue
            done = patiently(lambda k=k, t=body["lockToken"]: state.set(k, status="Processed", lockToken=t))
            if done.status != 200:
                with lock:
                    bad.append(f"set: {done.status} {done.json}")

    threads = [threading.Thread(target=worker, args=(keys[n::6],)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then storage refused a lot, Settle answered only 200 or 503 (never a 500), each 503 with Retry-After
    assert throttled.refusals() > 10 and statuses[503] > 0
    assert set(statuses) <= {200, 503} and not bad, (statuses, bad[:3])
    # And read from storage (not through the throttle): every item Processed once, its history, no index row
    from azure.data.tables import TableServiceClient

    direct = TableServiceClient.from_connection_string(azurite_connection).get_table_client(
        runtime.tables().settings.table_name(STATE_TABLE)
    )
    low, high = node_partition_range(1, 4, entity)
    rows = list(
        direct.query_entities(
            "PartitionKey ge @low and PartitionKey lt @high", parameters={"low": low, "high": high}
        )
    )
    heads = [r for r in rows if str(r["RowKey"]).endswith("|c")]
    assert len(heads) == len(keys) and {int(r["Status"]) for r in heads} == {1}
    assert {int(r["Version"]) for r in heads} == {2}
    assert len([r for r in rows if "|h" in str(r["RowKey"])]) == len(keys)
    assert not [r for r in rows if str(r["RowKey"]).startswith("~l") and "StateRK" in r]
    assert len({r["PartitionKey"] for r in heads}) == shards


def test_catch_up_beyond_the_budget_backs_off_and_a_later_run_finishes_with_nothing_lost(
    azurite_connection: str, fresh_tables: str, call: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from azure.data.tables import TableServiceClient

    from common.clock import utcnow
    from state import service

    # given 30 locks whose holders died, over 4 shards, made while storage had room
    monkeypatch.setenv("SETTLE_STATE_SHARDS", "4")
    runtime.reset()
    state = State(call)
    keys = [new_key(entityId=950, itemKey=f"cu-{uuid.uuid4().hex[:8]}") for _ in range(30)]
    for k in keys:
        assert state.lock(k, lockSeconds=1).json["acquired"] is True
    later = utcnow() + timedelta(seconds=30)
    # when catch-up runs against storage far beyond its budget (every refusal reaches Settle)
    clock = VirtualClock(0.01)
    # Azure's proportions (bench/throttle.py: a partition a tenth of the account), scaled down so that
    # catch-up runs into both (6, not 10 as before ADR-0021: with a lock's entry in its marker instead of a
    # row of its own, catch-up's range reads return fewer entities and its conclusions write fewer)
    budget = Budget(partition_per_s=6, account_per_s=60, timeout_every=5, clock=clock)
    # and a query page scaled alike (Azure: 1,000 rows against 2,000 entities/s; here 5 against 10)
    monkeypatch.setattr("state.catchup.INDEX_PAGE_ROWS", 5)
    # the budget refills by timer periods here, not wall time: a record's back-off need not wait
    monkeypatch.setattr("state.catchup.THROTTLED_BACKOFF_S", (0.001, 0.001))
    runs: list[Any] = []
    with CountingProxy(_endpoint(azurite_connection), budget=budget) as proxy:
        monkeypatch.setenv("SETTLE_TABLES", proxy.connection_string(azurite_connection))
        runtime.reset(client_options={"retry_total": 0})
        for _ in range(300):  # timer periods; each run must end normally, never raise
            runs.extend(service.catchup().drain(now=later))
            clock.now += 60.0  # a timer period passes: the budgets refill (one second of burst)
            if sum(r.locks_failed for r in runs) >= len(keys) and not runs[-1].storage_busy:
                break
    monkeypatch.setenv("SETTLE_TABLES", azurite_connection)
    runtime.reset()
    # then storage refused, runs stopped early saying so (backpressure), and later runs went on
    assert budget.refusals() > 0 and any(r.storage_busy for r in runs), "the throttle never bit"
    # and, read from storage: every lock Failed exactly once (version 2, one history row), no index row
    direct = TableServiceClient.from_connection_string(azurite_connection).get_table_client(
        runtime.tables().settings.table_name(STATE_TABLE)
    )
    low, high = node_partition_range(1, 4, 950)
    rows = list(
        direct.query_entities(
            "PartitionKey ge @low and PartitionKey lt @high", parameters={"low": low, "high": high}
        )
    )
    heads = [r for r in rows if str(r["RowKey"]).endswith("|c")]
    assert len(heads) == len(keys)
    assert {int(r["Status"]) for r in heads} == {3} and {int(r["Version"]) for r in heads} == {2}
    assert len([r for r in rows if "|h" in str(r["RowKey"])]) == len(keys)
    assert not [r for r in rows if str(r["RowKey"]).startswith("~l") and "StateRK" in r]
