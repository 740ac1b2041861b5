"""Query: one tenant at a time, filtered, paged with continuation tokens; history paging."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.state.conftest import new_key


def collect(call, body) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token = None
    while True:
        page = call("state_query", {**body, **({"continuationToken": token} if token else {})}).json
        items += page["items"]
        token = page["continuationToken"]
        if not token:
            return items


def test_query_filters_and_pages_one_tenant(state, call):
    tenant = 100 + uuid.uuid4().int % 100_000
    for i in range(7):
        state.set(new_key(tenantId=tenant, entityId=1), status="Processed" if i % 2 else "Failed", error="e")
    state.lock(new_key(tenantId=tenant, entityId=2, itemEntityKey="customer"))
    state.set(new_key(tenantId=tenant + 1, entityId=1), status="Processed")

    everything = collect(call, {"tenantId": tenant, "pageSize": 3})
    assert len(everything) == 8 and {r["tenantId"] for r in everything} == {tenant}
    assert all(r["status"] != "Superseded" for r in everything)
    processed = collect(call, {"tenantId": tenant, "scopeId": 4, "entityId": 1, "status": "Processed"})
    assert len(processed) == 3
    customers = collect(call, {"tenantId": tenant, "itemEntityKey": "customer"})
    assert [r["status"] for r in customers] == ["Processing"]
    by_entity = collect(call, {"tenantId": tenant, "entityId": 2})
    assert len(by_entity) == 1
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert collect(call, {"tenantId": tenant, "updatedFrom": future}) == []
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert len(collect(call, {"tenantId": tenant, "updatedFrom": past, "updatedTo": future})) == 8


def test_query_by_execution(state, call):
    tenant = 200_000 + uuid.uuid4().int % 100_000
    state.set(new_key(tenantId=tenant, scopeId=5, entityExecutionId=11), status="Processed")
    state.set(new_key(tenantId=tenant, scopeId=5, entityExecutionId=12), status="Processed")
    rows = collect(call, {"tenantId": tenant, "scope": "ProcessExecution", "entityExecutionId": 11})
    assert [r["entityExecutionId"] for r in rows] == [11]


def test_odata_in_filter_values_never_leaves_the_tenant(state, call):
    tenant = 300_000 + uuid.uuid4().int % 100_000
    state.set(new_key(tenantId=tenant + 1, itemEntityKey="x"), status="Processed")
    for hostile in ["' or 1 eq 1 or '", "x' or PartitionKey ge '", "') or (true"]:
        assert collect(call, {"tenantId": tenant, "itemEntityKey": hostile}) == []
    assert collect(call, {"tenantId": tenant}) == []


def test_tenant_prefixes_do_not_overlap(state, call):
    base = 400_000 + uuid.uuid4().int % 10_000
    state.set(new_key(tenantId=base * 10 + 1), status="Processed")  # e.g. 4000021 vs 400002
    assert collect(call, {"tenantId": base}) == []


def test_history_pages_newest_first(state, key):
    state.set(key, status="Failed", error="1")
    for v in range(2, 6):
        state.upsert(key, data={"v": v})
    first = state.history(key, pageSize=2).json
    second = state.history(key, pageSize=2, continuationToken=first["continuationToken"]).json
    third = state.history(key, pageSize=2, continuationToken=second["continuationToken"]).json
    versions = [i["version"] for i in first["items"] + second["items"] + third["items"]]
    assert versions == [5, 4, 3, 2, 1] and third["continuationToken"] is None
