"""Sharded partitions (state/keys.py ``Layout``, docs/tables.md): a node definition's records spread over
S partitions, every row of one record stays in its partition, reads of a node cover every shard, and a
deployment that changes S finds every record it wrote before (nothing lost, nothing written twice)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from common import layouts, runtime
from state import service
from state.keys import STATE_TABLE, Layout, node_partition_range, partition_key
from tests.layouts import fast_changes, reshard
from tests.state.conftest import State, new_key


@pytest.fixture
def shards(monkeypatch: pytest.MonkeyPatch, fresh_tables: str) -> Iterator[Any]:
    """``shards(S, previous)`` re-wires the process as a deployment with that layout (same tables): the
    first call records it, a later one changes the recorded layout (``make reshard``) and waits for it."""

    fast_changes(monkeypatch)

    def use(count: int, previous: str = "") -> None:
        monkeypatch.setenv("SETTLE_STATE_SHARDS", str(count))
        monkeypatch.setenv("SETTLE_STATE_SHARDS_PREVIOUS", previous)
        runtime.reset()  # a new store: what a restarted instance with the new app settings builds
        recorded = layouts.read_all(runtime.tables()).get(layouts.STATE)
        if recorded is not None and recorded.eras[-1].shards != count:
            reshard(layouts.STATE, count)  # the layout changes by the explicit step, never by the setting

    yield use
    monkeypatch.delenv("SETTLE_STATE_SHARDS")
    monkeypatch.delenv("SETTLE_STATE_SHARDS_PREVIOUS")
    runtime.reset()


def rows_of_node(tenant: int = 1, scope: int = 4, entity: int = 42) -> list[dict[str, Any]]:
    """Every row of one node definition, in every layout, straight from storage."""
    low, high = node_partition_range(tenant, scope, entity)
    table = runtime.tables().table(STATE_TABLE)
    query = "PartitionKey ge @low and PartitionKey lt @high"
    return [dict(e) for e in table.query_entities(query, parameters={"low": low, "high": high})]


def test_a_nodes_records_spread_over_its_shards_and_each_record_stays_in_one_partition(
    state: State, shards: Any
) -> None:
    shards(4)
    # fixed item keys (fresh tables): 40 random ones leave a shard with fewer than 4 about once in 50 runs
    keys = [new_key(itemKey=f"INV-spread-{n:02d}") for n in range(40)]
    # Given 40 records of one node: locked, set, locked again (a history row and a live index row)
    for k in keys:
        token = state.lock(k).json["lockToken"]
        assert state.set(k, status="Failed", lockToken=token).status == 200
        assert state.lock(k).json["acquired"]
    rows = rows_of_node()
    heads = [r for r in rows if r["RowKey"].endswith("|c")]
    # Then the heads sit in the 4 sharded partitions, none in the unsharded one, roughly evenly
    per_partition = Counter(r["PartitionKey"] for r in heads)
    assert set(per_partition) == {f"{partition_key(1, 4, 42)}.004-{n:03d}" for n in range(4)}
    assert min(per_partition.values()) >= 4
    # And every history and index row is in its head's partition (one transaction wrote them)
    partition_of_head = {r["RowKey"]: r["PartitionKey"] for r in heads}
    for r in rows:
        if r["RowKey"].startswith("~"):
            if "StateRK" in r:
                assert partition_of_head[r["StateRK"]] == r["PartitionKey"]
        elif "|h" in r["RowKey"]:
            assert partition_of_head[r["RowKey"].rsplit("|h", 1)[0] + "|c"] == r["PartitionKey"]
    # And history reads the record's two versions from its shard
    for k in keys[:5]:
        items = state.history(k).json["items"]
        assert [i["status"] for i in items] == ["Processing", "Superseded", "Superseded"]


def test_a_query_of_a_node_returns_every_record_of_every_shard_once_page_by_page(
    state: State, shards: Any
) -> None:
    shards(16)
    keys = {k["itemKey"]: k for k in (new_key() for _ in range(30))}
    for k in keys.values():
        assert state.upsert(k, data={"n": 1}).status == 200
    other = new_key(entityId=421)  # a node whose id starts with the same digits: never in the range
    assert state.upsert(other, data={"n": 1}).status == 200
    seen: list[str] = []
    token = None
    for _ in range(40):
        body: dict[str, Any] = {"tenantId": 1, "scopeId": 4, "entityId": 42, "pageSize": 7}
        if token:
            body["continuationToken"] = token
        page = state.query(**body).json
        seen += [i["itemKey"] for i in page["items"]]
        token = page.get("continuationToken")
        if not token:
            break
    assert sorted(seen) == sorted(keys)


def test_changing_the_shard_count_finds_every_earlier_record_and_never_writes_a_twin(
    state: State, shards: Any
) -> None:
    # Given records written by the unsharded layout: one finished, one Failed, one locked
    shards(1)
    done, failed, locked = new_key(), new_key(), new_key()
    assert state.upsert(done, data={"n": 1}).status == 200
    first = state.lock(failed).json["lockToken"]
    assert state.release(failed, error="boom", lockToken=first).status == 200
    token = state.lock(locked).json["lockToken"]
    # When the deployment moves to 8 shards, naming the earlier layout
    shards(8, "1")
    # Then every earlier record is found where it is
    assert state.get(done).json["status"] == "Processed"
    assert state.exists(done).json["exists"] is True
    refused = state.lock(done).json
    assert refused["acquired"] is False and refused["status"] == "Processed"
    # And a Failed one is locked again in its own partition (its history with it), not twinned
    again = state.lock(failed).json
    assert again["acquired"] is True
    assert state.set(failed, status="Processed", lockToken=again["lockToken"]).status == 200
    # And a token issued before the change still fences its record
    assert state.set(locked, status="Processed", lockToken=token).status == 200
    assert [i["status"] for i in state.history(failed).json["items"]] == [
        "Processed",
        "Superseded",
        "Superseded",
        "Superseded",
    ]
    # And a new key goes to the new layout
    fresh = new_key()
    assert state.lock(fresh).json["acquired"] is True
    heads = defaultdict(list)
    claims = {}
    for r in rows_of_node():
        if r["RowKey"].endswith("|c") and "MovedTo" in r:  # a key fence (common/fence.py), no head
            claims[r["RowKey"]] = (r["PartitionKey"], r["MovedTo"])
        elif r["RowKey"].endswith("|c"):
            heads[r["RowKey"]].append(r["PartitionKey"])
    assert all(len(pks) == 1 for pks in heads.values()), heads  # no record has two heads
    # And the new key was fenced in its earlier layout's partition, naming where it lives
    (fresh_rk,) = [rk for rk in heads if rk.startswith(f"invoice|{fresh['itemKey']}|")]
    assert claims == {fresh_rk: (partition_key(1, 4, 42), heads[fresh_rk][0])}
    old = partition_key(1, 4, 42)
    store = service.store()
    from state.schemas import KeyIn

    for k in (done, failed, locked):
        assert heads[_head_rk(KeyIn.model_validate(k).record_key())] == [old]
    assert heads[_head_rk(KeyIn.model_validate(fresh).record_key())] == [
        store.layout.partition(KeyIn.model_validate(fresh).record_key())
    ]
    # And a query of the node shows both layouts' records
    items = state.query(tenantId=1, scopeId=4, entityId=42, pageSize=50).json["items"]
    assert {i["itemKey"] for i in items} >= {k["itemKey"] for k in (done, failed, locked, fresh)}


def _head_rk(key: Any) -> str:
    from state.keys import head_row_key

    return head_row_key(key)


def test_catch_up_concludes_expired_locks_in_every_shard(state: State, shards: Any) -> None:
    shards(4)
    keys = [new_key() for _ in range(12)]
    untils = []
    for k in keys:
        lock = state.lock(k, lockSeconds=1).json
        untils.append(lock["lockedUntil"])
    from datetime import datetime

    now = max(datetime.fromisoformat(u) for u in untils) + timedelta(milliseconds=1)
    for _ in range(5):
        if service.catchup().run(now=now).locks_failed == 0:
            break
    # Read from storage: every head is Failed, and no lock index row is left in any shard
    rows = rows_of_node()
    heads = [r for r in rows if r["RowKey"].endswith("|c")]
    assert len(heads) == 12 and {int(r["Status"]) for r in heads} == {3}
    assert not [r for r in rows if r["RowKey"].startswith("~l") and "StateRK" in r]


def test_the_layout_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="SETTLE_STATE_SHARDS"):
        Layout(0)
    with pytest.raises(ValueError, match="SETTLE_STATE_SHARDS"):
        Layout(1000)
    assert Layout(1).single and not Layout(1, (4,)).single
