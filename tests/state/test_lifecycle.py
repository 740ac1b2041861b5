"""Every operation and transition of the state machine, through the function entry points."""

from __future__ import annotations

import time

from tests.state.conftest import new_key


def test_a_new_item_does_not_exist_and_has_no_record(state, key):
    assert state.exists(key).json == {"exists": False, "status": "None"}
    missing = state.get(key)
    assert missing.status == 404
    assert missing.content_type.startswith("application/problem+json")


def test_seed_pattern_exists_lock_act_set_processed(state, key):
    # given a new item, when a node checks, locks and records Processed
    assert state.exists(key).json["exists"] is False
    lock = state.lock(key).json
    assert lock["acquired"] is True and lock["lockToken"] and lock["lockedUntil"].endswith("Z")
    done = state.set(key, status="Processed", data={"dispatchedAt": "now"}, lockToken=lock["lockToken"])
    # then it exists, and a second lock is refused with the reason
    assert done.status == 200 and done.json["status"] == "Processed" and done.json["statusCode"] == 1
    assert state.exists(key).json == {"exists": True, "status": "Processed"}
    again = state.lock(key).json
    assert again["acquired"] is False and "Processed" in again["reason"]


def test_default_lock_is_thirty_minutes_and_options_change_it(state):
    key = new_key()
    lock = state.lock(key).json
    record = state.get(key).json
    from datetime import datetime

    held = datetime.fromisoformat(record["lockedUntil"]) - datetime.fromisoformat(record["lockedAt"])
    assert abs(held.total_seconds() - 1800) < 1
    other = new_key()
    state.lock(other, handler={"key": "built-in", "options": {"lockSeconds": 60}})
    rec = state.get(other).json
    held = datetime.fromisoformat(rec["lockedUntil"]) - datetime.fromisoformat(rec["lockedAt"])
    assert abs(held.total_seconds() - 60) < 1
    assert lock["acquired"]


def test_a_valid_lock_refuses_a_second_caller(state, key):
    first = state.lock(key).json
    second = state.lock(key).json
    assert first["acquired"] is True
    assert second["acquired"] is False and second["lockToken"] is None
    assert second["status"] == "Processing" and "holds the lock" in second["reason"]


def test_failure_path_release_then_lock_again(state, key):
    lock = state.lock(key).json
    released = state.release(key, error="ERP timed out", lockToken=lock["lockToken"])
    assert released.json["status"] == "Failed" and released.json["error"] == "ERP timed out"
    assert state.exists(key).json == {"exists": False, "status": "Failed"}
    again = state.lock(key).json
    assert again["acquired"] is True
    history = state.history(key).json["items"]
    assert [i["status"] for i in history] == ["Processing", "Superseded", "Superseded"]
    assert [i["originalStatus"] for i in history[1:]] == ["Failed", "Processing"]


def test_crashed_holder_lock_expires_is_taken_over_and_the_old_token_gets_409(state, key):
    old = state.lock(key, lockSeconds=1).json
    time.sleep(2.0)
    new = state.lock(key).json
    assert new["acquired"] is True and new["takeover"] is True
    late = state.set(key, status="Processed", data={"by": "old"}, lockToken=old["lockToken"])
    assert late.status == 409 and late.json["type"] == "urn:settle:problem:lock-lost"
    assert late.json["field"] == "lockToken"
    done = state.set(key, status="Processed", data={"by": "new"}, lockToken=new["lockToken"])
    assert done.status == 200 and done.json["data"]["data"] == {"by": "new"}
    steps = [(i["status"], i["originalStatus"], i["substatus"]) for i in state.history(key).json["items"]]
    assert steps == [
        ("Processed", None, None),
        ("Superseded", "Processing", "LockTakenOver"),
        ("Superseded", "Processing", None),
    ]


def test_an_expired_token_cannot_write_even_when_nobody_took_over(state, key):
    lock = state.lock(key, lockSeconds=1).json
    time.sleep(2.0)
    late = state.set(key, status="Processed", lockToken=lock["lockToken"])
    assert late.status == 409 and "expired" in late.json["detail"]
    assert state.get(key).json["status"] == "Processing"


def test_fenced_release_after_takeover_writes_nothing(state, key):
    old = state.lock(key, lockSeconds=1).json
    time.sleep(2.0)
    state.lock(key)
    before = state.history(key).json["items"]
    late = state.release(key, error="x", lockToken=old["lockToken"])
    assert late.status == 409
    assert state.history(key).json["items"] == before


def test_a_token_of_another_record_is_refused(state):
    a, b = new_key(), new_key()
    lock_a = state.lock(a).json
    state.lock(b)
    result = state.set(b, status="Processed", lockToken=lock_a["lockToken"])
    assert result.status == 409 and result.json["field"] == "lockToken"
    forged = state.set(a, status="Processed", lockToken="v1.bm90LWEtdG9rZW4")
    assert forged.status == 409 and forged.json["field"] == "lockToken"


def test_extend_keeps_the_lock_and_the_old_token_is_replaced(state, key):
    lock = state.lock(key, lockSeconds=60).json
    extended = state.extend(key, lockToken=lock["lockToken"], lockSeconds=600)
    assert extended.status == 200
    assert extended.json["lockedUntil"] > lock["lockedUntil"]
    done = state.set(key, status="Skipped", lockToken=extended.json["lockToken"])
    assert done.json["status"] == "Skipped"
    assert state.exists(key).json["exists"] is True


def test_the_old_token_still_works_after_extend_because_the_lock_is_the_same(state, key):
    lock = state.lock(key, lockSeconds=60).json
    state.extend(key, lockToken=lock["lockToken"], lockSeconds=600)
    done = state.set(key, status="Processed", lockToken=lock["lockToken"])
    assert done.status == 200


def test_upsert_supersedes_the_previous_record(state, key):
    state.set(key, status="Processed", data={"v": 1})
    upserted = state.upsert(key, data={"v": 2})
    assert upserted.json["status"] == "Processed" and upserted.json["data"]["data"] == {"v": 2}
    history = state.history(key).json["items"]
    assert [(i["status"], i["originalStatus"]) for i in history] == [
        ("Processed", None),
        ("Superseded", "Processed"),
    ]
    assert history[1]["data"]["data"] == {"v": 1}
    assert history[1]["supersededAt"] is not None


def test_skipped_is_terminal_and_exists(state, key):
    state.set(key, status="Skipped", substatus="NotApplicable")
    assert state.exists(key).json == {"exists": True, "status": "Skipped"}
    assert state.lock(key).json["acquired"] is False
    assert state.get(key).json["substatus"] == "NotApplicable"


def test_failed_is_retryable(state, key):
    state.set(key, status="Failed", error="boom")
    assert state.exists(key).json["exists"] is False
    assert state.lock(key).json["acquired"] is True


def test_set_by_status_code_works_too(state, key):
    assert state.set(key, status=4).json["status"] == "Skipped"


def test_release_without_a_lock_is_a_conflict(state, key):
    result = state.release(key, error="nothing held")
    assert result.status == 409
    state.set(key, status="Processed")
    assert state.release(key, error="x").status == 409


def test_unfenced_release_of_a_held_lock_records_failed(state, key):
    state.lock(key)
    assert state.release(key, error="operator").json["status"] == "Failed"


def test_retention_expires_finished_records_so_they_may_be_processed_again(state, key):
    handler = {"key": "built-in", "options": {"retentionSeconds": 1}}
    state.set(key, status="Processed", handler=handler)
    assert state.exists(key).json["exists"] is True
    time.sleep(2.0)
    assert state.exists(key).json == {"exists": False, "status": "Expired"}
    assert state.get(key).json["status"] == "Expired"
    assert state.lock(key).json["acquired"] is True


def test_execution_scopes_key_by_execution(state):
    first = new_key(scopeId=7, entityExecutionId=100)
    second = dict(first, entityExecutionId=101)
    state.set(first, status="Processed")
    assert state.exists(first).json["exists"] is True
    assert state.exists(second).json["exists"] is False


def test_non_execution_scopes_record_the_execution_without_keying_by_it(state):
    first = new_key(scopeId=4, entityExecutionId=100, sourceAppId=9)
    state.set(first, status="Processed")
    second = dict(first, entityExecutionId=101)
    assert state.exists(second).json["exists"] is True
    record = state.get(first).json
    assert record["entityExecutionId"] == 100 and record["sourceAppId"] == 9


def test_scope_by_name(state):
    key = new_key()
    del key["scopeId"]
    key["scope"] = "Element"
    state.set(key, status="Processed")
    assert state.get(key).json["scopeId"] == 4 and state.get(key).json["scope"] == "Element"


def test_the_data_envelope_is_filled_in(state, key):
    record = state.set(
        key,
        status="Processed",
        data={"apiResponse": {"ok": True}},
        metadata={"nodeType": "InvoiceDispatchExecutor", "elementKey": "dispatch-invoice"},
    ).json
    envelope = record["data"]
    assert envelope["metadata"]["nodeType"] == "InvoiceDispatchExecutor"
    assert envelope["metadata"]["handlerKey"] == "built-in" and envelope["metadata"]["runAt"].endswith("Z")
    assert envelope["idempotencyInfo"] == {
        "itemKey": key["itemKey"],
        "itemEntityKey": "invoice",
        "subItemKey": "",
        "subItemEntityKey": "",
        "scope": "Element",
        "status": "Processed",
    }
    assert envelope["data"] == {"apiResponse": {"ok": True}}


def test_null_handler_writes_nothing(state, key):
    null = {"key": "null"}
    assert state.exists(key, handler=null).json == {"exists": False, "status": "None"}
    assert state.lock(key, handler=null).json["acquired"] is True
    assert state.set(key, status="Processed", handler=null).status == 204
    assert state.upsert(key, data={}, handler=null).status == 204
    assert state.get(key, handler=null).status == 404
    assert state.history(key, handler=null).json["items"] == []
    # and the built-in handler never saw any of it
    assert state.get(key).status == 404
    assert state.lock(key).json["acquired"] is True


def test_retrying_a_fenced_set_that_was_applied_returns_the_record(state, key):
    # given a holder whose set was applied but whose answer was lost
    token = state.lock(key).json["lockToken"]
    first = state.set(key, status="Processed", data={"n": 1}, lockToken=token)
    # when it retries the same call
    again = state.set(key, status="Processed", data={"n": 1}, lockToken=token)
    # then it gets the record back, and nothing was written twice
    assert again.status == 200 and again.json["version"] == first.json["version"]
    assert len(state.history(key).json["items"]) == 2
    # but the same token cannot record a different outcome afterwards
    other = state.release(key, error="changed my mind", lockToken=token)
    assert other.status == 409 and "already ended with Processed" in other.json["detail"]


def test_a_lock_retried_with_its_request_id_gets_the_same_lock_back(state, key):
    first = state.lock(key, requestId="attempt-1").json
    again = state.lock(key, requestId="attempt-1").json
    other = state.lock(key, requestId="attempt-2").json
    assert first["acquired"] and again["acquired"] and not other["acquired"]
    assert again["lockedUntil"] == first["lockedUntil"]
    # the re-issued token fences like the original
    assert state.set(key, status="Processed", lockToken=again["lockToken"]).status == 200
    assert len(state.history(key).json["items"]) == 2


def test_a_used_token_cannot_record_different_data(state, key):
    token = state.lock(key).json["lockToken"]
    state.upsert(key, data={"n": 1}, lockToken=token)
    different = state.upsert(key, data={"n": 2}, lockToken=token)
    assert different.status == 409
    assert state.get(key).json["data"]["data"] == {"n": 1}


def test_the_envelope_names_the_run_that_wrote_it_in_every_scope(state):
    # the seed's own example: Element scope (4), executionId 98231
    for scope in range(1, 8):
        key = new_key(scopeId=scope, entityExecutionId=98231)
        record = state.set(key, status="Processed", data={"ok": True}).json
        assert record["data"]["metadata"]["executionId"] == 98231, scope
        # a later run's write names that run (scopes 1-4 share the record across runs)
        later = dict(key, entityExecutionId=98232) if scope <= 4 else key
        upserted = state.upsert(later, data={"ok": 2}).json
        assert upserted["data"]["metadata"]["executionId"] == later["entityExecutionId"]
    # without an execution id the caller's metadata may still say which run it was
    record = state.set(new_key(), status="Processed", data={}, metadata={"executionId": 5}).json
    assert record["data"]["metadata"]["executionId"] == 5


def test_a_lock_replayed_by_request_id_says_so(state, key):
    first = state.lock(key, requestId="msg-1").json
    assert first["acquired"] is True and first["replayed"] is False
    # a caller with the same id (a lost answer's retry, or a duplicate sharing the id) is told
    again = state.lock(key, requestId="msg-1").json
    assert again["acquired"] is True and again["replayed"] is True
    refused = state.lock(key, requestId="msg-2").json
    assert refused["acquired"] is False and refused["replayed"] is False
    # once the lock ended, the same id takes a new lock (not a replay)
    state.set(key, status="Failed", error="x", lockToken=again["lockToken"])
    fresh = state.lock(key, requestId="msg-1").json
    assert fresh["acquired"] is True and fresh["replayed"] is False


def test_a_request_id_does_not_replay_an_expired_lock(state, key):
    state.lock(key, requestId="msg-1", lockSeconds=1)
    time.sleep(2.0)
    takeover = state.lock(key, requestId="msg-1").json
    assert takeover["acquired"] and takeover["takeover"] and not takeover["replayed"]
