"""Bad input gets a 4xx problem+json naming the field, never a 500, and writes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from state.envelope import MAX_DATA_BYTES
from tests.state.conftest import new_key

OPERATIONS = [
    "state_exists",
    "state_lock",
    "state_lock_extend",
    "state_set",
    "state_upsert",
    "state_release",
    "state_get",
    "state_query",
    "state_history",
]


def problem(result, status: int, field: str | None = None) -> dict[str, Any]:
    assert result.status == status, result.body
    assert result.content_type.startswith("application/problem+json")
    body: dict[str, Any] = result.json
    assert body["type"].startswith("urn:settle:problem:") and body["title"] and body["status"] == status
    if field is not None:
        assert body["field"] == field, body
    return body


@pytest.mark.parametrize("name", OPERATIONS)
@pytest.mark.parametrize("raw", [b"", b"not json", b"{", b"[1,2]", b"42", b"\xff\xfe"])
def test_non_json_or_non_object_bodies_are_400(call, name, raw):
    problem(call(name, raw=raw), 400, "body")


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda k: k.pop("tenantId"), "key.tenantId"),
        (lambda k: k.update(tenantId="1"), "key.tenantId"),
        (lambda k: k.update(tenantId=-1), "key.tenantId"),
        (lambda k: k.update(entityId=1.5), "key.entityId"),
        (lambda k: k.update(scopeId=8), "key.scopeId"),
        (lambda k: k.update(scopeId=0), "key.scopeId"),
        (lambda k: k.pop("itemKey"), "key.itemKey"),
        (lambda k: k.update(itemKey=""), "key.itemKey"),
        (lambda k: k.update(itemEntityKey=None), "key.itemEntityKey"),
        (lambda k: k.update(subItemKey=5), "key.subItemKey"),
        (lambda k: k.update(itemKeyy="typo"), "key.itemKeyy"),
    ],
)
def test_missing_or_mistyped_key_fields_are_400_naming_the_field(state, mutate, field):
    key = new_key()
    mutate(key)
    problem(state.lock(key), 400, field)


def test_scope_out_of_range_and_unknown_scope_names(state):
    key = new_key()
    del key["scopeId"]
    problem(state.lock(key), 400, "key")
    key["scope"] = "Galaxy"
    body = problem(state.lock(key), 400)
    assert "Galaxy" in body["detail"]


def test_execution_scope_without_execution_id_is_400(state):
    body = problem(state.lock(new_key(scopeId=6)), 400)
    assert "entityExecutionId" in body["detail"]


def test_unknown_handler_is_400(state, key):
    problem(state.lock(key, handler={"key": "redis"}), 400, "handler.key")
    problem(state.lock(key, handler={"options": {"lockSecs": 5}}), 400, "handler.options.lockSecs")
    assert state.get(key).status == 404


@pytest.mark.parametrize("status", ["Processing", "Superseded", "Expired", "None", "Done", 2, 9, True])
def test_set_refuses_statuses_it_cannot_record(state, key, status):
    problem(state.set(key, status=status), 400, "status")
    assert state.get(key).status == 404


def test_lock_seconds_out_of_range(state, key):
    problem(state.lock(key, lockSeconds=0), 400, "lockSeconds")
    problem(state.lock(key, lockSeconds=10**9), 400, "lockSeconds")


def test_release_requires_the_error_text(state, key):
    state.lock(key)
    problem(state.release(key), 400, "error")


def test_extend_requires_a_token(state, key):
    state.lock(key)
    problem(state.extend(key), 400, "lockToken")


@pytest.mark.parametrize("token", ["garbage", "v1.", "v1.!!!", "v1.e30"])
def test_malformed_lock_tokens_are_409_naming_the_token(state, key, token):
    state.lock(key)
    problem(state.set(key, status="Processed", lockToken=token), 409, "lockToken")
    assert state.get(key).json["status"] == "Processing"


def test_a_key_too_long_for_table_storage_is_400_naming_the_field(state):
    key = new_key(itemKey="x" * 600)
    body = problem(state.lock(key), 400, "key.itemKey")
    assert "1024" in body["detail"]
    escaped = new_key(subItemKey="/" * 200)  # each "/" becomes "%2F": three characters in the key
    problem(state.set(escaped, status="Processed"), 400, "key.subItemKey")


def test_data_up_to_the_limit_is_stored_split_across_properties(state, key):
    payload = "é" * (300 * 1024 // 2)  # 300 KiB of UTF-8 in one string
    record = state.set(key, status="Processed", data={"blob": payload})
    assert record.status == 200
    assert state.get(key).json["data"]["data"]["blob"] == payload
    record = state.upsert(key, data={"blob": payload[::-1]})
    history = state.history(key).json["items"]
    assert history[1]["data"]["data"]["blob"] == payload


def test_data_beyond_the_limit_is_413_with_the_limit(state, key):
    body = problem(state.set(key, status="Processed", data="x" * (MAX_DATA_BYTES + 1)), 413, "data")
    assert str(MAX_DATA_BYTES) in body["detail"]
    assert state.get(key).status == 404


def test_query_requires_a_tenant_and_validates_filters(call):
    problem(call("state_query", {}), 400, "tenantId")
    problem(call("state_query", {"tenantId": 1, "status": "Bogus"}), 400, "status")
    problem(call("state_query", {"tenantId": 1, "updatedFrom": "yesterday"}), 400, "updatedFrom")
    problem(call("state_query", {"tenantId": 1, "pageSize": 5000}), 400, "pageSize")
    problem(call("state_query", {"tenantId": 1, "continuationToken": "%%%"}), 400, "continuationToken")


def test_history_rejects_a_forged_continuation_token(state, key):
    problem(state.history(key, continuationToken="bm9wZQ"), 400, "continuationToken")


@pytest.mark.parametrize("name", OPERATIONS)
def test_every_operation_answers_a_json_null_body_with_400(call, name):
    problem(call(name, raw=json.dumps(None).encode()), 400)
