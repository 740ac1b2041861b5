"""Every value the schema accepts can be stored; one step beyond is a 400 naming the field. Never a 500.

Each numeric and text field is tried through HTTP at its smallest and largest accepted value (which must
round-trip through Table Storage) and just outside (which must be refused before storage is touched).
Text limits are counted the way Table Storage counts: UTF-16 code units (an astral character is two).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common.keys import MAX_KEY_BYTES, key_bytes
from state.keys import MAX_VERSION, history_row_key
from state.model import RecordKey, Scope
from tests.state.conftest import new_key

# The documented limits (README, docs/tables.md), written out: a change in the code must not move them.
INT32_MAX = 2**31 - 1
MAX_TEXT_UNITS = 32_000  # one Table property: 64,000 bytes of UTF-16
MAX_LOCK_SECONDS = 7 * 24 * 3600
MAX_RETENTION_DAYS = 36_500
MAX_RETENTION_SECONDS = MAX_RETENTION_DAYS * 86_400
MAX_PAGE_SIZE = 1000
MAX_TOKEN_CHARS = 4096
MAX_DATA_BYTES = 512 * 1024
ASTRAL = "\U0001f600"  # two UTF-16 code units


def refused(result, field: str) -> None:
    assert result.status == 400, (result.status, result.body[:300])
    assert result.content_type.startswith("application/problem+json")
    assert result.json["field"] == field, result.json


# -- integers of the key ------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["tenantId", "entityId", "entityExecutionId", "sourceAppId"])
@pytest.mark.parametrize("value", [0, INT32_MAX])
def test_key_integers_at_their_limits_are_stored_and_read_back(state, field, value):
    key = new_key(**{field: value})
    record = state.set(key, status="Processed", data={"v": 1})
    assert record.status == 200, record.body
    assert state.get(key).json[field] == value
    assert state.exists(key).json["exists"] is True


@pytest.mark.parametrize("field", ["tenantId", "entityId", "entityExecutionId", "sourceAppId"])
@pytest.mark.parametrize("value", [-1, INT32_MAX + 1, 2**63, 1e400, 2.5, True, "7"], ids=repr)
def test_key_integers_beyond_their_limits_are_400(state, field, value):
    key = new_key(**{field: value})
    refused(state.set(key, status="Processed"), f"key.{field}")


@pytest.mark.parametrize("scope", [1, 7])
def test_scope_ids_at_their_limits(state, scope):
    key = new_key(scopeId=scope, entityExecutionId=5)
    assert state.set(key, status="Processed").json["scopeId"] == scope


@pytest.mark.parametrize("scope", [0, 8, -1, 2**40])
def test_scope_ids_beyond_their_limits_are_400(state, scope):
    refused(state.set(new_key(scopeId=scope), status="Processed"), "key.scopeId")


# -- text of the key: 1 KiB of RowKey in UTF-16 ------------------------------------------------------------
def _longest(key: dict[str, Any], field: str, char: str) -> int:
    """How many ``char`` fit in ``field`` of ``key`` (the other fields as they are)."""
    empty = RecordKey(
        tenant_id=1,
        scope=Scope.ELEMENT,
        entity_id=42,
        item_key=key["itemKey"],
        item_entity_key=key["itemEntityKey"],
        sub_item_key=key.get("subItemKey", ""),
        sub_item_entity_key=key.get("subItemEntityKey", ""),
    )
    attr = {"itemKey": "item_key", "itemEntityKey": "item_entity_key"}
    attr.update(subItemKey="sub_item_key", subItemEntityKey="sub_item_entity_key")
    empty = replace(empty, **{attr[field]: ""})  # type: ignore[arg-type]
    return (MAX_KEY_BYTES - key_bytes(history_row_key(empty, MAX_VERSION))) // key_bytes(char)


@pytest.mark.parametrize("field", ["itemKey", "itemEntityKey", "subItemKey", "subItemEntityKey"])
@pytest.mark.parametrize("char", ["k", "é", ASTRAL], ids=["ascii", "latin", "astral"])
def test_key_text_fills_the_key_exactly_and_one_more_character_is_400(state, field, char):
    key = new_key()
    n = _longest(key, field, char)
    key[field] = char * n
    assert state.set(key, status="Processed").status == 200
    assert state.get(key).json[field] == char * n
    assert state.upsert(key, data={"again": True}).status == 200  # a history row: the longest RowKey
    refused(state.set(dict(key, **{field: char * (n + 1)}), status="Processed"), f"key.{field}")


# -- numbers of the request ---------------------------------------------------------------------------
@pytest.mark.parametrize("seconds", [1, MAX_LOCK_SECONDS])
def test_lock_seconds_at_their_limits(state, key, seconds):
    lock = state.lock(key, lockSeconds=seconds).json
    assert lock["acquired"]
    record = state.get(key).json
    held = datetime.fromisoformat(record["lockedUntil"]) - datetime.fromisoformat(record["lockedAt"])
    assert abs(held.total_seconds() - seconds) < 1
    assert state.extend(key, lockToken=lock["lockToken"], lockSeconds=seconds).status == 200
    other = new_key()
    assert state.lock(other, handler={"options": {"lockSeconds": seconds}}).json["acquired"]


@pytest.mark.parametrize("seconds", [0, MAX_LOCK_SECONDS + 1, -1, 2**63])
def test_lock_seconds_beyond_their_limits_are_400(state, key, seconds):
    refused(state.lock(key, lockSeconds=seconds), "lockSeconds")
    refused(state.lock(key, handler={"options": {"lockSeconds": seconds}}), "handler.options.lockSeconds")
    token = state.lock(key).json["lockToken"]
    refused(state.extend(key, lockToken=token, lockSeconds=seconds), "lockSeconds")


@pytest.mark.parametrize(
    "options",
    [
        {"retentionSeconds": 1},
        {"retentionSeconds": 2**31},
        {"retentionSeconds": MAX_RETENTION_SECONDS},
        {"retentionDays": 1},
        {"retentionDays": 24_856},
        {"retentionDays": MAX_RETENTION_DAYS},
    ],
    ids=repr,
)
def test_retention_up_to_its_documented_maximum_is_stored(state, key, options):
    handler = {"options": options}
    lock = state.lock(key, handler=handler).json
    done = state.set(key, status="Processed", lockToken=lock["lockToken"], handler=handler)
    assert done.status == 200, done.body
    assert state.upsert(key, data={"v": 2}, handler=handler).status == 200
    assert state.release(key, error="x").status == 409  # nothing held: a clear conflict, not a 500
    items = state.history(key).json["items"]
    assert [i["status"] for i in items] == ["Processed", "Superseded", "Superseded"]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"retentionSeconds": MAX_RETENTION_SECONDS + 1}, "handler.options.retentionSeconds"),
        ({"retentionSeconds": 0}, "handler.options.retentionSeconds"),
        ({"retentionSeconds": 10**30}, "handler.options.retentionSeconds"),
        ({"retentionDays": MAX_RETENTION_DAYS + 1}, "handler.options.retentionDays"),
        ({"retentionDays": 0}, "handler.options.retentionDays"),
    ],
    ids=repr,
)
def test_retention_beyond_its_maximum_is_400(state, key, options, field):
    refused(state.set(key, status="Processed", handler={"options": options}), field)


@pytest.mark.parametrize("size", [1, MAX_PAGE_SIZE])
def test_page_sizes_at_their_limits(state, key, call, size):
    state.set(key, status="Processed")
    assert state.history(key, pageSize=size).status == 200
    assert call("state_query", {"tenantId": 1, "pageSize": size}).status == 200


@pytest.mark.parametrize("size", [0, MAX_PAGE_SIZE + 1])
def test_page_sizes_beyond_their_limits_are_400(state, key, call, size):
    refused(state.history(key, pageSize=size), "pageSize")
    refused(call("state_query", {"tenantId": 1, "pageSize": size}), "pageSize")


# -- text of the request: one Table property, counted in UTF-16 ---------------------------------------------
@pytest.mark.parametrize("field", ["error", "substatus"])
@pytest.mark.parametrize("char", ["e", ASTRAL], ids=["bmp", "astral"])
def test_text_that_fills_one_property_is_stored_and_one_more_unit_is_400(state, field, char):
    n = MAX_TEXT_UNITS // key_bytes(char) * 2
    key = new_key()
    token = state.lock(key).json["lockToken"]
    body: dict[str, Any] = {"status": "Failed", "lockToken": token, field: char * n}
    stored = state.set(key, **body)
    assert stored.status == 200, stored.body[:300]
    assert stored.json[field] == char * n and state.get(key).json[field] == char * n
    # a history row copies it (the same size again, in the same transaction)
    assert state.upsert(key, data={"n": 1}, substatus=char * n).status == 200
    body[field] = char * n + "e"
    refused(state.set(new_key(), **body), field)


@pytest.mark.parametrize("char", ["e", ASTRAL], ids=["bmp", "astral"])
def test_release_error_fills_one_property(state, key, char):
    n = MAX_TEXT_UNITS // key_bytes(char) * 2
    state.lock(key)
    assert state.release(key, error=char * n).json["error"] == char * n
    state.lock(key)
    refused(state.release(key, error=char * n + "e"), "error")


def test_the_largest_record_with_the_largest_texts_is_stored_with_its_history(state, key):
    # Azurite accepts more than Azure does, so the sizes Azure limits are measured on the wire too
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    from common import runtime
    from common.limits import MAX_ENTITY_BYTES, entity_size

    bodies: list[int] = []

    class BodySize(SansIOHTTPPolicy):  # type: ignore[type-arg]
        def on_request(self, request):
            body = request.http_request.body
            bodies.append(len(body.encode() if isinstance(body, str) else body or b""))

    runtime.reset(policies=[BodySize()])
    try:
        data = "d" * (MAX_DATA_BYTES - 1024)
        big = ASTRAL * (MAX_TEXT_UNITS // 2)
        first = state.set(key, status="Failed", data=data, error=big, substatus=big)
        assert first.status == 200, first.body[:300]
        second = state.upsert(key, data=data, substatus=big)
        assert second.status == 200, second.body[:300]
        history = state.history(key).json["items"]
        assert history[1]["error"] == big and history[1]["data"]["data"] == data
    finally:
        runtime.reset()
    # the transaction (new head + the superseded version) stays under Azure's 4 MiB request body
    assert max(bodies) < 4 * 1024 * 1024
    # and each row under 1 MiB by the service's own estimate
    from tests.reliability.records import read_rows

    rows = read_rows(key)
    assert rows.head is not None
    assert max(entity_size(r) for r in [rows.head, *rows.history.values()]) < MAX_ENTITY_BYTES


@pytest.mark.parametrize("length", [1, 128])
def test_request_ids_at_their_limits(state, length):
    key = new_key()
    first = state.lock(key, requestId="r" * length).json
    again = state.lock(key, requestId="r" * length).json
    assert first["acquired"] and again["replayed"]


def test_request_ids_beyond_their_limits_are_400(state, key):
    refused(state.lock(key, requestId=""), "requestId")
    refused(state.lock(key, requestId="r" * 129), "requestId")


def test_tokens_longer_than_the_limit_are_400(state, key, call):
    state.lock(key)
    refused(state.set(key, status="Processed", lockToken="t" * (MAX_TOKEN_CHARS + 1)), "lockToken")
    refused(state.history(key, continuationToken="t" * (MAX_TOKEN_CHARS + 1)), "continuationToken")
    refused(
        call("state_query", {"tenantId": 1, "continuationToken": "t" * (MAX_TOKEN_CHARS + 1)}),
        "continuationToken",
    )


# -- times of the query --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    ["1601-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-01-01T00:00:00", "2026-01-01T01:00:00+01:00"],
)
def test_query_times_table_storage_can_compare_are_accepted(state, call, value):
    key = new_key(tenantId=9_000_001)
    state.set(key, status="Processed")
    for field in ("updatedFrom", "updatedTo"):
        result = call("state_query", {"tenantId": 9_000_001, field: value})
        assert result.status == 200, result.body


@pytest.mark.parametrize("value", ["1600-12-31T23:59:59Z", "0001-01-01T00:00:00Z"])
def test_query_times_before_table_storage_begins_are_400(call, value):
    for field in ("updatedFrom", "updatedTo"):
        refused(call("state_query", {"tenantId": 1, field: value}), field)


def test_query_windows_at_the_instant_of_a_write(state, call):
    tenant = 9_000_002
    key = new_key(tenantId=tenant)
    at = datetime.fromisoformat(state.set(key, status="Processed").json["updatedAt"])
    ms = timedelta(milliseconds=1)

    def window(**bounds: datetime) -> list[str]:
        body = {"tenantId": tenant, **{k: v.astimezone(UTC).isoformat() for k, v in bounds.items()}}
        return [r["itemKey"] for r in call("state_query", body).json["items"]]

    assert window(updatedFrom=at, updatedTo=at + ms) == [key["itemKey"]]
    assert window(updatedTo=at) == []
    assert window(updatedFrom=at + ms) == []
    assert window(updatedFrom=at - ms) == [key["itemKey"]]
