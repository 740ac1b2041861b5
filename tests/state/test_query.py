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


def test_query_filters_on_the_status_it_reports_after_retention_passed(state, call):
    # given records whose retention passed (catch-up has not run yet) and ones still within it
    import time

    tenant = 500_000 + uuid.uuid4().int % 100_000
    short = {"options": {"retentionSeconds": 1}}
    old = [new_key(tenantId=tenant, itemKey=f"old-{i}") for i in range(3)]
    for i, k in enumerate(old):
        state.set(k, status=["Processed", "Skipped", "Failed"][i], error="e", handler=short)
    young = new_key(tenantId=tenant, itemKey="young")
    state.set(young, status="Processed", handler={"options": {"retentionDays": 30}})
    forever = new_key(tenantId=tenant, itemKey="forever")
    state.set(forever, status="Processed")
    held = new_key(tenantId=tenant, itemKey="held")
    state.lock(held, handler=short)
    time.sleep(2.0)

    def keys(status: str) -> set[str]:
        items = collect(call, {"tenantId": tenant, "status": status})
        assert all(r["status"] == status for r in items), items
        return {r["itemKey"] for r in items}

    # then each status filter finds exactly the records reported with that status
    assert keys("Expired") == {"old-0", "old-1", "old-2"}
    assert keys("Processed") == {"young", "forever"}
    assert keys("Skipped") == set() and keys("Failed") == set()
    assert keys("Processing") == {"held"}
    assert {r["status"] for r in collect(call, {"tenantId": tenant})} == {
        "Expired",
        "Processed",
        "Processing",
    }
    # by code too
    assert {r["itemKey"] for r in collect(call, {"tenantId": tenant, "status": 6})} == keys("Expired")


def test_query_refuses_statuses_no_current_record_has(call):
    for status in ("Superseded", "None", 5, 0):
        result = call("state_query", {"tenantId": 1, "status": status})
        assert result.status == 400 and result.json["field"] == "status"


def test_query_never_returns_index_rows(state, call):
    tenant = 600_000 + uuid.uuid4().int % 100_000
    for i in range(3):
        state.lock(new_key(tenantId=tenant, itemEntityKey="~x", itemKey=f"~{i}"), lockSeconds=90)
    state.set(
        new_key(tenantId=tenant, itemEntityKey="élan"),
        status="Processed",
        handler={"options": {"retentionDays": 1}},
    )
    items = collect(call, {"tenantId": tenant, "pageSize": 2})
    assert sorted(r["itemEntityKey"] for r in items) == sorted(["élan", "~x", "~x", "~x"])


def _pages(call, body, first_page_size=2) -> str:
    page = call("state_query", {**body, "pageSize": first_page_size}).json
    assert page["continuationToken"]
    return str(page["continuationToken"])


def test_tampered_truncated_or_foreign_continuation_tokens_are_400(state, key, call):
    import base64

    tenant = 700_000 + uuid.uuid4().int % 100_000
    for i in range(5):
        state.set(new_key(tenantId=tenant, itemKey=f"k{i}"), status="Processed")
    body = {"tenantId": tenant}
    token = _pages(call, body)
    # the genuine token pages on (also with another page size)
    assert call("state_query", {**body, "continuationToken": token, "pageSize": 50}).status == 200
    forged = [
        base64.urlsafe_b64encode(b"{}").decode(),
        "e30",
        token[:-3],
        token[:20],
        token + "A",
        token.replace(token[10], "A" if token[10] != "A" else "B", 1),
        "v2." + token.split(".", 1)[1][::-1],
    ]
    for bad in forged:
        result = call("state_query", {**body, "continuationToken": bad})
        assert result.status == 400 and result.json["field"] == "continuationToken", (bad, result.body)
    # a token of another query (another filter or tenant) is refused too
    for other in ({"tenantId": tenant, "status": "Processed"}, {"tenantId": tenant + 1}):
        result = call("state_query", {**other, "continuationToken": token})
        assert result.status == 400 and result.json["field"] == "continuationToken"
    # and a history page token is bound to its record
    for v in range(4):
        state.upsert(key, data={"v": v})
    history_token = state.history(key, pageSize=1).json["continuationToken"]
    assert state.history(key, continuationToken=history_token).status == 200
    assert state.history(new_key(), continuationToken=history_token).status == 400
    assert call("state_query", {**body, "continuationToken": history_token}).status == 400
    assert state.history(key, continuationToken=token).status == 400
