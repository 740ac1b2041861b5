"""The bench's storage budget (bench/throttle.py): Azure's per-partition and per-account targets, scaled
down, answered as Azure answers throttling. Against Azurite through the proxy, with the SDK's own retries
off so every refusal reaches the test."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.proxy import CountingProxy
from bench.throttle import OPERATION_TIMED_OUT, SERVER_BUSY, Budget


def _endpoint(connection: str) -> str:
    value = next(p.split("=", 1)[1] for p in connection.split(";") if p.startswith("TableEndpoint"))
    return value.rsplit("/", 1)[0]


@pytest.fixture
def throttled(azurite_connection: str) -> Iterator[tuple[Budget, Any, Any]]:
    """(budget, throttled table client, the same table straight on Azurite)."""
    from azure.data.tables import TableServiceClient

    # A frozen clock: no budget refills during a test, whatever the machine's speed.
    budget = Budget(partition_per_s=10, account_per_s=40, timeout_every=0, clock=lambda: 0.0)
    name = "throttle" + uuid.uuid4().hex[:10]
    direct = TableServiceClient.from_connection_string(azurite_connection).create_table_if_not_exists(name)
    with CountingProxy(_endpoint(azurite_connection), budget=budget) as proxy:
        service = TableServiceClient.from_connection_string(
            proxy.connection_string(azurite_connection), retry_total=0
        )
        yield budget, service.get_table_client(name), direct


def _insert(table: Any, pk: str, rk: str) -> str | None:
    """None when stored, else the error code storage answered."""
    from azure.core.exceptions import HttpResponseError

    try:
        table.create_entity({"PartitionKey": pk, "RowKey": rk})
    except HttpResponseError as exc:
        assert exc.status_code in (500, 503), exc
        return _code(exc)
    return None


def _code(exc: Any) -> str:
    """The error code storage answered (the SDK raises throttling without decoding the body)."""
    return str(exc.response.headers["x-ms-error-code"])


def _body(exc: Any) -> str:
    return str(exc.response.text())


def _stored(direct: Any, pk: str) -> int:
    return len(list(direct.query_entities("PartitionKey eq @pk", parameters={"pk": pk})))


def test_one_partition_beyond_its_budget_is_answered_server_busy_and_nothing_refused_is_stored(
    throttled: tuple[Budget, Any, Any],
) -> None:
    budget, table, direct = throttled
    # Given 30 inserts into one partition as fast as one thread goes (budget: 10 entities/s)
    outcomes = [_insert(table, "hot", str(n)) for n in range(30)]
    refused = [o for o in outcomes if o is not None]
    # Then the ones beyond the budget are refused with Azure's code, and only admitted rows exist
    assert len(refused) == 20 and set(refused) == {SERVER_BUSY}
    assert _stored(direct, "hot") == 10
    assert budget.refused["partition"] == len(refused)


def test_spreading_over_partitions_is_admitted_until_the_account_budget(
    throttled: tuple[Budget, Any, Any],
) -> None:
    budget, table, _ = throttled
    # Given 8 inserts into each of 3 partitions (24 < the account's 40, each partition 8 < 10)
    outcomes = [_insert(table, f"p{n % 3}", str(n)) for n in range(24)]
    # Then every one is admitted
    assert outcomes == [None] * 24
    # And when 60 more go into 20 fresh partitions, the account budget refuses some
    more = [_insert(table, f"q{n % 20}", str(n)) for n in range(60)]
    assert any(o == SERVER_BUSY for o in more)
    assert budget.refused["account"] > 0 and budget.refused["partition"] == 0


def test_an_entity_group_transaction_costs_one_per_entity(throttled: tuple[Budget, Any, Any]) -> None:
    from azure.core.exceptions import HttpResponseError

    _, table, direct = throttled
    batch = [("create", {"PartitionKey": "egt", "RowKey": f"{n}"}) for n in range(5)]
    # Given two EGTs of 5 entities (the partition's whole second of budget)
    table.submit_transaction(batch)
    table.submit_transaction([("create", {"PartitionKey": "egt", "RowKey": f"b{n}"}) for n in range(5)])
    # When a third one follows at once
    with pytest.raises(HttpResponseError) as refused:
        table.submit_transaction([("create", {"PartitionKey": "egt", "RowKey": f"c{n}"}) for n in range(5)])
    # Then it is throttled whole: nothing of it is stored
    assert refused.value.status_code == 503 and _code(refused.value) == SERVER_BUSY
    assert _stored(direct, "egt") == 10


def test_a_query_is_charged_the_rows_it_returns(throttled: tuple[Budget, Any, Any]) -> None:
    budget, table, direct = throttled
    for n in range(9):
        direct.create_entity({"PartitionKey": "read", "RowKey": str(n)})
    # Given a query that returns 9 rows of one partition (budget 10 a second)
    assert len(list(table.query_entities("PartitionKey eq 'read'"))) == 9
    # Then the partition was charged 9, and a point read right after still fits, a second one does not
    table.get_entity("read", "0")
    assert _insert(table, "read", "x") == SERVER_BUSY
    assert budget.admitted[("devstoreaccount1", table.table_name, "read")] == 10


def test_operation_timed_out_is_answered_500_with_its_code(azurite_connection: str) -> None:
    from azure.core.exceptions import HttpResponseError
    from azure.data.tables import TableServiceClient

    budget = Budget(partition_per_s=1, account_per_s=100, timeout_every=1, clock=lambda: 0.0)
    name = "throttle" + uuid.uuid4().hex[:10]
    with CountingProxy(_endpoint(azurite_connection), budget=budget) as proxy:
        service = TableServiceClient.from_connection_string(
            proxy.connection_string(azurite_connection), retry_total=0
        )
        table = service.create_table_if_not_exists(name)
        table.create_entity({"PartitionKey": "p", "RowKey": "1"})
        with pytest.raises(HttpResponseError) as refused:
            table.create_entity({"PartitionKey": "p", "RowKey": "2"})
    assert refused.value.status_code == 500 and _code(refused.value) == OPERATION_TIMED_OUT
    assert json.loads(_body(refused.value))["odata.error"]["code"] == OPERATION_TIMED_OUT


def test_the_sdk_retries_a_throttled_request_until_the_budget_admits_it(azurite_connection: str) -> None:
    from azure.data.tables import TableServiceClient

    budget = Budget(partition_per_s=5, account_per_s=100, timeout_every=0)
    name = "throttle" + uuid.uuid4().hex[:10]
    with CountingProxy(_endpoint(azurite_connection), budget=budget) as proxy:
        # The SDK's default retry policy backs off on 503 as it does against Azure
        service = TableServiceClient.from_connection_string(
            proxy.connection_string(azurite_connection), retry_backoff_factor=0.2
        )
        table = service.create_table_if_not_exists(name)
        for n in range(12):
            table.create_entity({"PartitionKey": "p", "RowKey": str(n)})
    assert budget.refusals() > 0
    assert len(list(table.query_entities("PartitionKey eq 'p'"))) == 12


def test_the_resolver_floor_is_the_documented_minimum_so_an_extra_read_is_settles_alone() -> None:
    from bench.resolver import Call, documented_minimum

    read = Call("hoevents", "get_entity", ("p", "ev|1|e"), {})
    extra = Call("hoevents", "get_entity", ("p", "ev|1|m|x"), {})
    write = Call("hoevents", "submit_transaction", ([],), {})
    other = Call("hoendpoints", "create_entity", ({},), {})
    # Given a projection that made an extra read and an extra insert beside its read and transaction
    calls = [read, extra, write, other]
    # Then the floor replays only the read and the transaction the documented design needs
    assert documented_minimum(calls) == [read, write]


def test_the_writes_of_each_row_are_counted_so_a_hot_row_shows(throttled: tuple[Budget, Any, Any]) -> None:
    from azure.data.tables import UpdateMode

    budget, table, _ = throttled
    table.create_entity({"PartitionKey": "hot", "RowKey": "marker"})
    # Given three EGTs that each insert a row and merge the same one (as a lock merges its minute's marker)
    for n in range(3):
        table.submit_transaction(
            [
                ("create", {"PartitionKey": "hot", "RowKey": f"r{n}"}),
                ("update", {"PartitionKey": "hot", "RowKey": "marker", "n": n}, {"mode": UpdateMode.MERGE}),
            ]
        )
    # Then the merged row was written 4 times (its insert + 3 merges), each other row once
    written = {rk: n for (_, _, pk, rk), n in budget.row_writes.items() if pk == "hot"}
    assert written == {"marker": 4, "r0": 1, "r1": 1, "r2": 1}
    assert budget.hottest_row()[1] == 4


def test_a_batch_is_not_starved_by_single_entity_requests_and_its_excess_is_repaid(
    azurite_connection: str,
) -> None:
    from azure.data.tables import TableServiceClient

    now = [0.0]
    budget = Budget(partition_per_s=10, account_per_s=1000, timeout_every=0, clock=lambda: now[0])
    name = "throttle" + uuid.uuid4().hex[:10]
    direct = TableServiceClient.from_connection_string(azurite_connection).create_table_if_not_exists(name)
    with CountingProxy(_endpoint(azurite_connection), budget=budget) as proxy:
        service = TableServiceClient.from_connection_string(
            proxy.connection_string(azurite_connection), retry_total=0
        )
        table = service.get_table_client(name)
        # Given single inserts that leave the partition 2 entities of budget (as reads do between retries)
        assert [_insert(table, "p", f"s{n}") for n in range(8)] == [None] * 8
        # When a transaction of 3 entities comes: admitted while the partition is within its budget
        table.submit_transaction([("create", {"PartitionKey": "p", "RowKey": f"b{n}"}) for n in range(3)])
        # Then its excess is debt: nothing more is admitted until it is repaid at the partition's rate
        assert _insert(table, "p", "late") == SERVER_BUSY
        now[0] = 0.15  # +1.5 entities: still below one
        assert _insert(table, "p", "late") == SERVER_BUSY
        now[0] = 0.25  # +2.5: the debt of 1 repaid, 1.5 entities of budget
        assert _insert(table, "p", "late") is None
    assert _stored(direct, "p") == 12


def test_an_emptied_budget_holds_no_burst_so_a_sustained_rate_counts_none(azurite_connection: str) -> None:
    """``Budget.empty()`` (the scale-out figure's sustained window): every bucket, existing or new, holds
    no initial second of budget; what it admits afterwards is the budget's rate, nothing more."""
    from azure.data.tables import TableServiceClient

    now = [0.0]
    budget = Budget(partition_per_s=10, account_per_s=1000, timeout_every=0, clock=lambda: now[0])
    name = "throttle" + uuid.uuid4().hex[:10]
    direct = TableServiceClient.from_connection_string(azurite_connection).create_table_if_not_exists(name)
    with CountingProxy(_endpoint(azurite_connection), budget=budget) as proxy:
        service = TableServiceClient.from_connection_string(
            proxy.connection_string(azurite_connection), retry_total=0
        )
        table = service.get_table_client(name)
        assert _insert(table, "p", "first") is None  # a full bucket: its burst admits this at once
        budget.empty()
        # Then neither the partition used before nor a new one admits anything at the same instant
        assert _insert(table, "p", "no-burst") == SERVER_BUSY
        assert _insert(table, "q", "no-burst") == SERVER_BUSY
        now[0] = 0.1  # one entity of budget earned, in each partition
        assert _insert(table, "p", "earned") is None
        assert _insert(table, "q", "earned") is None
    assert _stored(direct, "p") == 2
    assert _stored(direct, "q") == 1
