"""State over two storage accounts (ADR-0015; state/accounts.py): two Azurite instances, the shard ->
account map read from each PartitionKey. Every record lives wholly in one account, reads and queries
find records of both, catch-up concludes expired locks in both; checked by reading each account."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from common import runtime
from devtools.azurite import Azurite
from state import service
from state.keys import STATE_TABLE, account_of, node_partition_range
from tests.state.conftest import State, new_key


@pytest.fixture(scope="module")
def second_azurite() -> Iterator[str]:
    with Azurite(services=("table",)) as azurite:
        yield azurite.connection_string


@pytest.fixture
def two_accounts(
    second_azurite: str, azurite_connection: str, fresh_tables: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[str]]:
    monkeypatch.setenv("SETTLE_TABLES_1", second_azurite)
    monkeypatch.setenv("SETTLE_STATE_SHARDS", "4")
    runtime.reset()
    yield [azurite_connection, second_azurite]
    monkeypatch.delenv("SETTLE_TABLES_1")
    monkeypatch.delenv("SETTLE_STATE_SHARDS")
    runtime.reset()


def rows(connection: str, entity: int) -> list[dict[str, Any]]:
    from azure.data.tables import TableServiceClient

    name = runtime.tables().settings.table_name(STATE_TABLE)
    table = TableServiceClient.from_connection_string(connection).create_table_if_not_exists(name)
    low, high = node_partition_range(1, 4, entity)
    query = "PartitionKey ge @low and PartitionKey lt @high"
    return [dict(e) for e in table.query_entities(query, parameters={"low": low, "high": high})]


def test_records_spread_over_two_accounts_and_each_stays_whole_in_its_own(
    state: State, two_accounts: list[str]
) -> None:
    keys = [new_key(entityId=77) for _ in range(24)]
    for k in keys:
        token = state.lock(k).json["lockToken"]
        assert state.set(k, status="Processed", lockToken=token).status == 200
    by_account = [rows(c, 77) for c in two_accounts]
    heads = [[r for r in found if str(r["RowKey"]).endswith("|c")] for found in by_account]
    # Then both accounts hold records, 24 in all, each partition in the account its key names
    assert all(heads) and sum(len(h) for h in heads) == 24
    for index, found in enumerate(by_account):
        assert {account_of(str(r["PartitionKey"])) for r in found} == {index}
        history = [r for r in found if "|h" in str(r["RowKey"])]
        assert len(history) == len(heads[index])  # each record's history beside its head
    # And reads, history and a paged query of the node find every record
    for k in keys[:6]:
        assert state.get(k).json["status"] == "Processed"
        assert [i["status"] for i in state.history(k).json["items"]] == ["Processed", "Superseded"]
    seen: list[str] = []
    token = None
    for _ in range(30):
        body: dict[str, Any] = {"tenantId": 1, "scopeId": 4, "entityId": 77, "pageSize": 5}
        if token:
            body["continuationToken"] = token
        page = state.query(**body).json
        assert "items" in page, page
        seen += [i["itemKey"] for i in page["items"]]
        token = page.get("continuationToken")
        if not token:
            break
    assert sorted(seen) == sorted(k["itemKey"] for k in keys)
    tenant = state.query(tenantId=1, pageSize=100).json
    more = [i["itemKey"] for i in tenant["items"]]
    while tenant.get("continuationToken"):
        tenant = state.query(tenantId=1, pageSize=100, continuationToken=tenant["continuationToken"]).json
        more += [i["itemKey"] for i in tenant["items"]]
    assert set(more) >= {k["itemKey"] for k in keys}


def test_catch_up_concludes_expired_locks_in_both_accounts(state: State, two_accounts: list[str]) -> None:
    untils = [state.lock(new_key(entityId=78), lockSeconds=1).json["lockedUntil"] for _ in range(16)]
    now = max(datetime.fromisoformat(u) for u in untils) + timedelta(milliseconds=1)
    for _ in range(5):
        if service.catchup().run(now=now).locks_failed == 0:
            break
    found = [rows(c, 78) for c in two_accounts]
    heads = [[r for r in f if str(r["RowKey"]).endswith("|c")] for f in found]
    assert all(heads) and sum(len(h) for h in heads) == 16
    assert {int(r["Status"]) for h in heads for r in h} == {3}
    assert not [r for f in found for r in f if str(r["RowKey"]).startswith("~l") and "StateRK" in r]
