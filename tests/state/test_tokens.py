"""Lock tokens cannot be forged or edited, and the fenced write copies the superseded version exactly.

A token is ``<version>.<base64url(JSON payload)>[.<mac>]``; these tests edit its payload like an attacker
would (whatever the format version) and expect 409 ``lock-lost`` and nothing written, never a 500.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from common import runtime
from state.keys import STATE_TABLE, head_row_key, partition_key
from state.schemas import KeyIn
from tests.state.conftest import new_key
from tests.support.state_calls import lock_lost, rows_of


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def payload_of(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))


def with_payload(token: str, payload: dict[str, Any] | str) -> str:
    parts = token.split(".")
    raw = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    parts[1] = b64(raw.encode())
    return ".".join(parts)


def test_editing_the_expiry_of_an_expired_token_does_not_bypass_the_fence(state, key):
    token = state.lock(key, lockSeconds=1).json["lockToken"]
    time.sleep(2.0)
    body = payload_of(token)
    body["u"] = body["u"] + 3_600_000  # an hour more
    before = rows_of(key)
    lock_lost(state.set(key, status="Processed", lockToken=with_payload(token, body)))
    assert rows_of(key) == before


def test_editing_version_or_creation_time_cannot_rewrite_history(state, key):
    token = state.lock(key).json["lockToken"]
    body = payload_of(token)
    body.update(n=42, c=0)
    lock_lost(state.set(key, status="Processed", lockToken=with_payload(token, body)))
    record = state.get(key).json
    assert record["version"] == 1 and record["status"] == "Processing"
    assert state.set(key, status="Processed", lockToken=token).json["version"] == 2


@pytest.mark.parametrize(
    "edit",
    [
        {"u": "1e400"},
        {"u": 10**30},
        {"a": -5},
        {"n": 1.5},
        {"e": {"not": "a string"}},
        {"e": 'W/"x"\r\nX-Injected: 1'},
        {"i": ["list"]},
        {"k": None},
        {"q": "other-request"},
        {"o": "a note of my own"},
        {"s": 99},
    ],
    ids=repr,
)
def test_every_edited_field_is_409_and_writes_nothing(state, key, edit):
    token = state.lock(key).json["lockToken"]
    body = payload_of(token)
    body.update(edit)
    before = rows_of(key)
    for operation in ("set", "release", "extend", "upsert"):
        args: dict[str, Any] = {"lockToken": with_payload(token, body)}
        if operation == "set":
            args["status"] = "Processed"
        if operation == "release":
            args["error"] = "x"
        if operation == "upsert":
            args["data"] = {"x": 1}
        lock_lost(getattr(state, operation)(key, **args))
    assert rows_of(key) == before


@pytest.mark.parametrize("payload", ["", "null", "[]", "{}", "not json", '{"u": 1e400}', "\ud800"], ids=repr)
def test_a_payload_that_is_not_claims_at_all_is_409(state, key, payload):
    token = state.lock(key).json["lockToken"]
    try:
        forged = with_payload(token, payload)
    except UnicodeEncodeError:
        forged = token.split(".")[0] + ".7f7f." + token.split(".")[-1]
    lock_lost(state.set(key, status="Processed", lockToken=forged))


def test_truncated_tokens_are_refused_at_every_length(state, key):
    token = state.lock(key).json["lockToken"]
    before = rows_of(key)
    for cut in sorted({*range(0, len(token), 7), len(token) - 1, len(token) - 2}):
        result = state.set(key, status="Processed", lockToken=token[:cut] or "x")
        assert result.status == 409, (cut, result.status, result.body)
    assert rows_of(key) == before


def test_a_token_with_a_recomputed_mac_under_another_key_is_refused(state, key):
    import hashlib
    import hmac

    token = state.lock(key).json["lockToken"]
    version, payload, *_ = token.split(".")
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    mac = hmac.new(b"\x00" * 32, b"lock\n" + raw, hashlib.sha256).digest()
    lock_lost(state.set(key, status="Processed", lockToken=f"{version}.{payload}.{b64(mac)}"))


def test_a_token_of_another_deployment_is_refused(state, key, call, azurite_connection, settle_tables):
    # given a token signed by another deployment (another table prefix: another key) for the same key
    from tests.conftest import _use_tables, new_prefix

    _use_tables(azurite_connection, new_prefix())
    try:
        foreign = state.lock(key).json["lockToken"]
    finally:
        _use_tables(azurite_connection, settle_tables)
    state.lock(key)
    lock_lost(state.set(key, status="Processed", lockToken=foreign))


def test_a_continuation_token_never_passes_as_a_lock_token(state, key):
    for v in range(3):
        state.upsert(key, data={"v": v})
    page = state.history(key, pageSize=1).json["continuationToken"]
    assert page
    locked = new_key()
    state.lock(locked)
    lock_lost(state.set(locked, status="Processed", lockToken=page))
    lock_lost(state.set(key, status="Processed", lockToken=page))


# -- the fenced fast path writes the superseded version's history row exactly as it was ----------------------
def _stored_head(key: dict[str, Any]) -> dict[str, Any]:
    rk = KeyIn.model_validate(key).record_key()
    return dict(
        runtime.tables()
        .table(STATE_TABLE)
        .get_entity(partition_key(rk.tenant_id, rk.scope, rk.entity_id), head_row_key(rk))
    )


def _as_history(head: dict[str, Any]) -> dict[str, Any]:
    """The columns a history row must copy from the head it supersedes (bookkeeping aside)."""
    skip = {"RowKey", "Status", "RecordedStatus", "SupersededAt", "SupersededByVersion", "LockIndexKey"}
    return {k: v for k, v in head.items() if k not in skip}


def _history_row(key: dict[str, Any], version: int) -> dict[str, Any]:
    rows = [r for r in rows_of(key) if not r["RowKey"].endswith("|c") and r["Version"] == version]
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize("operation", ["set", "release", "upsert", "extend"])
def test_the_superseded_processing_row_is_the_lockers_version_column_for_column(state, operation):
    # given a lock taken by app 7 in run 1001 (a takeover, with a requestId and retention) ...
    key = new_key(sourceAppId=7, entityExecutionId=1001)
    handler = {"options": {"retentionDays": 36500}}
    state.lock(key, lockSeconds=1, handler=handler)
    time.sleep(2.0)
    token = state.lock(key, requestId="req-1", handler=handler).json["lockToken"]
    locked = _stored_head(key)
    assert locked["Substatus"] == "LockTakenOver" and locked["Note"]
    # when another app and run write with the token (one transaction, from the token)
    writer = dict(key, sourceAppId=8, entityExecutionId=2002)
    extra: dict[str, dict[str, Any]] = {
        "set": {"status": "Processed"},
        "release": {"error": "x"},
        "upsert": {"data": {}},
        "extend": {},
    }
    args: dict[str, Any] = {"lockToken": token, **extra[operation]}
    answer = getattr(state, operation)(writer, **args)
    assert answer.status == 200
    moved: set[str] = set()
    if operation == "extend":  # an extension rewrites the version in place: its outcome supersedes it
        assert state.set(writer, status="Processed", lockToken=answer.json["lockToken"]).status == 200
        moved = {"UpdatedAt", "LockedUntil"}
    # then the history row of the Processing version is that version, exactly
    history = _history_row(key, int(locked["Version"]))
    unmoved = {k: v for k, v in _as_history(locked).items() if k not in moved}
    assert {k: v for k, v in _as_history(history).items() if k not in moved} == unmoved
    assert history["SourceAppId"] == 7 and history["EntityExecutionId"] == 1001
    assert history["LockRequestId"] == "req-1"


def test_an_extended_versions_history_row_says_when_it_was_extended(state, key):
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    time.sleep(0.05)
    new_token = state.extend(key, lockToken=token, lockSeconds=120).json["lockToken"]
    extended = _stored_head(key)
    assert extended["UpdatedAt"] > extended["LockedAt"]
    assert state.set(key, status="Processed", lockToken=new_token).status == 200
    assert _as_history(_history_row(key, 1)) == _as_history(extended)
