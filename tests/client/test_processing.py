"""``with client.processing(key) as item:`` end to end over real HTTP against the development host.

The three exits (normal → Processed, exception → released as Failed and re-raised, skip/fail), the
refusals on entry, reads that follow pages, lost answers retried only where safe, and long work: the
lock extended in the background, and lost while the extension was held back and another caller took
the lock over.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from settle_client import (
    AlreadyProcessed,
    InvalidInput,
    Key,
    LockHeld,
    LockLost,
    PayloadTooLarge,
    Scope,
    SettleClient,
    Status,
    TransportFailure,
    Unauthorized,
)

from tests.client.conftest import FAST_RETRY, Gate, LoseAnswers, some, wait_until
from tests.support.children import HostProcess


def statuses(client: SettleClient, key: Any) -> list[tuple[str, str | None]]:
    return [(r.status, r.original_status) for r in client.history(key)]


# -- the three exits ----------------------------------------------------------------------------------
def test_a_block_that_ends_normally_records_processed_with_the_items_data(settle, key):
    with settle.processing(key, lock_seconds=60, metadata={"nodeType": "PostInvoice"}) as item:
        assert settle.get(key).status == "Processing"
        item.data = {"posted": True, "ledger": 7781}

    assert item.record is not None and item.record.status == "Processed"
    assert settle.exists(key) is True
    record = settle.get(key)
    assert record.status == "Processed" and record.data == {"posted": True, "ledger": 7781}
    assert record.metadata["nodeType"] == "PostInvoice"
    assert record.envelope["idempotencyInfo"]["itemKey"] == key["itemKey"]
    assert statuses(settle, key) == [("Processed", None), ("Superseded", "Processing")]


def test_an_exception_releases_the_lock_as_failed_with_its_text_and_propagates(settle, key):
    with pytest.raises(RuntimeError, match="ERP timeout"), settle.processing(key):
        raise RuntimeError("ERP timeout")

    record = settle.get(key)
    assert record.status == "Failed" and record.error == "RuntimeError: ERP timeout"
    assert settle.exists(key) is False
    # Failed is retryable: the next block gets the lock and records the outcome.
    with settle.processing(key) as item:
        item.data = {"posted": True}
    assert settle.get(key).status == "Processed"


def test_skip_and_fail_record_their_outcome_without_raising(settle, key):
    skipped = Key.of({**key, "itemKey": key["itemKey"] + "-s"})
    with settle.processing(skipped) as item:
        item.data = {"why": "credit note"}
        item.skip("credit notes are posted elsewhere")
    record = settle.get(skipped)
    assert (record.status, record.substatus, record.data) == (
        "Skipped",
        "credit notes are posted elsewhere",
        {"why": "credit note"},
    )
    assert settle.exists(skipped) is True

    with settle.processing(key) as item:
        item.fail("the customer is blocked")
    record = settle.get(key)
    assert (record.status, record.error) == ("Failed", "the customer is blocked")


def test_data_that_is_not_json_fails_inside_the_block_and_releases_the_lock(settle, key):
    with pytest.raises(TypeError, match="not JSON"), settle.processing(key) as item:
        item.data = {"when": datetime.now(UTC)}
    assert settle.get(key).status == "Failed"


def test_metadata_with_an_unknown_field_is_refused_before_the_lock(settle, key):
    with pytest.raises(InvalidInput) as bad:
        settle.processing(key, metadata={"nodeTyp": "PostInvoice"})
    assert bad.value.field == "metadata.nodeTyp"
    assert settle.get(key) is None


def test_an_outcome_settle_refuses_releases_the_lock_with_the_reason(settle, key):
    with pytest.raises(PayloadTooLarge) as refused, settle.processing(key) as item:
        item.data = {"blob": "x" * (600 * 1024)}  # beyond the 512 KiB Settle stores
    assert refused.value.status == 413
    record = settle.get(key)
    assert record.status == "Failed" and record.error.startswith("PayloadTooLarge: 413")


# -- refusals on entry -------------------------------------------------------------------------------
def test_a_processed_or_skipped_item_raises_already_processed(settle, key):
    with settle.processing(key):
        pass
    with pytest.raises(AlreadyProcessed) as refused, settle.processing(key):
        pytest.fail("the body of a processed item ran")
    assert refused.value.record_status == "Processed"
    assert "already Processed" in refused.value.reason


def test_an_item_held_by_another_caller_raises_lock_held(settle, key, host):
    with settle.processing(key, lock_seconds=120), SettleClient(host.base_url) as other:
        with pytest.raises(LockHeld) as refused, other.processing(key):
            pytest.fail("two holders")
        assert refused.value.record_status == "Processing"
        assert refused.value.locked_until is not None
    assert settle.get(key).status == "Processed"


# -- reads ------------------------------------------------------------------------------------------
def test_history_and_query_follow_continuation_tokens(settle, key):
    tenant = int(datetime.now(UTC).timestamp() * 1000) % 2_000_000_000
    keys = [{**key, "tenantId": tenant, "itemKey": f"{key['itemKey']}-{n}"} for n in range(3)]
    for k in keys:
        with settle.processing(k) as item:
            item.data = {"n": k["itemKey"]}
    settle.upsert(keys[0], {"n": "again"})  # a third version of the first key

    versions = list(settle.history(keys[0], page_size=1))
    assert [(r.status, r.version) for r in versions] == [
        ("Processed", 3),
        ("Superseded", 2),
        ("Superseded", 1),
    ]

    found = list(settle.query(tenant_id=tenant, status="Processed", page_size=1))
    assert sorted(r.item_key for r in found) == sorted(k["itemKey"] for k in keys)
    by_scope = list(settle.query(tenant, scope=Scope.ELEMENT, entity_id=100, status=Status.PROCESSED))
    assert len(by_scope) == 3
    assert list(settle.query(tenant, status="Failed")) == []
    later = datetime.now(UTC) + timedelta(hours=1)
    assert list(settle.query(tenant, updated_from=later)) == []


def test_get_of_an_unknown_key_is_none_and_exists_is_false(settle, key):
    assert settle.get(key) is None
    assert settle.exists(key) is False
    assert list(settle.history(key)) == []


# -- bad input ---------------------------------------------------------------------------------------
def test_a_key_missing_a_field_is_refused_before_sending(settle, key):
    del key["itemKey"]
    with pytest.raises(InvalidInput) as bad:
        settle.exists(key)
    assert bad.value.field == "key.itemKey" and bad.value.status is None


def test_the_servers_400_becomes_invalid_input_naming_the_field(settle, key):
    execution_scoped = {**key, "scopeId": 7}  # scopes 5-7 need entityExecutionId
    with pytest.raises(InvalidInput) as bad:
        settle.exists(execution_scoped)
    assert bad.value.status == 400 and bad.value.type == "urn:settle:problem:invalid-input"
    assert bad.value.field and bad.value.field.startswith("key")


def test_keys_by_scope_name_or_model_are_the_same_record(settle, key):
    by_name = {**{k: v for k, v in key.items() if k != "scopeId"}, "scope": "Element"}
    model = Key(tenant_id=1, scope_id=4, entity_id=100, item_entity_key="invoice", item_key=key["itemKey"])
    with settle.processing(by_name):
        pass
    assert settle.exists(model) and settle.exists(key)


def test_the_null_handler_runs_the_block_and_stores_nothing(host, key):
    with SettleClient(host.base_url, handler="null") as null, SettleClient(host.base_url) as built_in:
        with null.processing(key) as item:
            item.data = {"posted": True}
        assert item.record is None and item.lock_token is None
        assert null.exists(key) is False
        assert built_in.get(key) is None


# -- lost answers: retried only where that is safe -----------------------------------------------------
def test_a_lost_lock_answer_is_retried_with_the_same_request_id_and_gets_that_lock(host, key):
    lossy = LoseAnswers("/v1/state/lock")
    with (
        SettleClient(host.base_url, transport=lossy, retry=FAST_RETRY) as client,
        client.processing(key) as item,
    ):
        item.data = {"posted": True}
    assert len(lossy.sent) == 2
    ids = {json.loads(r.content)["requestId"] for r in lossy.sent}
    assert len(ids) == 1, "the retry must carry the first attempt's requestId"
    with SettleClient(host.base_url) as reader:
        assert statuses(reader, key) == [("Processed", None), ("Superseded", "Processing")]


def test_a_lost_answer_to_a_fenced_set_is_retried_and_answered_with_its_record(host, key):
    lossy = LoseAnswers("/v1/state/set")
    with SettleClient(host.base_url, transport=lossy, retry=FAST_RETRY) as client:
        with client.processing(key) as item:
            item.data = {"posted": True}
        assert item.record is not None and item.record.status == "Processed"
        assert len(lossy.sent) == 2
        assert [s for s, _ in statuses(client, key)] == ["Processed", "Superseded"]


def test_a_lost_answer_to_an_unfenced_write_is_not_retried(host, key):
    lossy = LoseAnswers("/v1/state/set")
    with SettleClient(host.base_url, transport=lossy, retry=FAST_RETRY) as client:
        with pytest.raises(TransportFailure) as lost:
            client.set(key, "Processed", data={"posted": True})
        assert lost.value.maybe_applied is True
        assert len(lossy.sent) == 1
        assert some(client.get(key)).status == "Processed"  # it was applied; the answer was lost


# -- auth ------------------------------------------------------------------------------------------
def test_the_function_key_is_sent_as_x_functions_key(start_host, key):
    keyed = start_host(env={"SETTLE_DEV_FUNCTION_KEY": "let-me-in"})
    with SettleClient(keyed.base_url) as anonymous, pytest.raises(Unauthorized) as refused:
        anonymous.exists(key)
    assert refused.value.status == 401
    assert "function key" in str(refused.value) and "function_key=" in str(refused.value)
    assert "bearer token" in str(refused.value)
    with SettleClient(keyed.base_url, function_key="let-me-in") as client:
        with client.processing(key):
            pass
        assert client.exists(key)


# -- long work -------------------------------------------------------------------------------------
def test_long_work_keeps_the_lock_by_extending_it_in_the_background(settle, key, host):
    with settle.processing(key, lock_seconds=4) as item, SettleClient(host.base_url) as other:
        first_until = item.locked_until
        assert first_until is not None
        # Work past the lock's first expiry (same machine, same clock as the server).
        wait_until(lambda: datetime.now(UTC) > first_until + timedelta(seconds=1), what="first expiry")
        assert item.locked_until > first_until and not item.lost
        with pytest.raises(LockHeld), other.processing(key):
            pytest.fail("the extended lock was taken")
        item.data = {"long": True}
    record = settle.get(key)
    assert record.status == "Processed" and record.data == {"long": True}
    # an extension rewrites the lock in place: one history row, the lock's start
    assert statuses(settle, key) == [("Processed", None), ("Superseded", "Processing")]


def test_a_lock_lost_during_long_work_raises_lock_lost_and_writes_nothing(host, key):
    gate = Gate("/v1/state/lock/extend")  # the holder's extensions are held back
    with SettleClient(host.base_url, transport=gate) as holder, SettleClient(host.base_url) as rival:
        with pytest.raises(LockLost), holder.processing(key, lock_seconds=2) as item:
            assert gate.waiting.wait(30), "no extension was attempted"
            # The lock expires; the rival takes it (a takeover, or after catch-up made it Failed).
            taken = wait_until(lambda: (lock := rival.lock(key)).acquired and lock, what="rival lock")
            rival.set(key, "Processed", data={"by": "rival"}, lock_token=taken.lock_token)
            gate.opened.set()
            wait_until(lambda: item.lost, what="the holder noticing the loss")
            with pytest.raises(LockLost):
                item.check()
            item.data = {"by": "holder"}

        assert not [p for p in gate.paths if p.endswith(("/set", "/release"))], "wrote with a lost lock"
        record = some(rival.get(key))
        assert record.status == "Processed" and record.data == {"by": "rival"}
        assert all(r.data != {"by": "holder"} for r in rival.history(key))


def test_the_handlers_lock_seconds_is_the_blocks_default_lock_length(host, key):
    """A client whose handler options say ``lockSeconds`` locks that long, unless the block says."""
    handler = {"key": "built-in", "options": {"lockSeconds": 600}}
    with SettleClient(host.base_url, handler=handler) as client:
        with client.processing(key) as item:
            assert some(item.locked_until) > datetime.now(UTC) + timedelta(seconds=300)
        other = {**key, "itemKey": key["itemKey"] + "-own"}
        with client.processing(other, lock_seconds=30) as item:
            assert some(item.locked_until) < datetime.now(UTC) + timedelta(seconds=300)


def test_leaving_after_the_lock_expired_unextended_raises_lock_lost(host, key):
    gate = Gate("/v1/state/lock/extend")
    with SettleClient(host.base_url, transport=gate) as holder, SettleClient(host.base_url) as rival:
        with pytest.raises(LockLost), holder.processing(key, lock_seconds=1) as item:
            assert gate.waiting.wait(30)
            taken = wait_until(lambda: (lock := rival.lock(key)).acquired and lock, what="rival lock")
            item.data = {"by": "holder"}
            # Leave while the extension is still held back: the fenced set itself is refused.
        gate.opened.set()
        assert some(rival.get(key)).status == "Processing"
        rival.release(key, "test over", lock_token=taken.lock_token)


def test_settle_client_accepts_only_http_urls():
    with pytest.raises(ValueError):
        SettleClient("localhost:7071")


def test_a_lock_held_by_another_process(host: HostProcess, key, tmp_path):
    """The rival is a separate OS process using the client (see racer.py)."""
    from tests.client.racer import run_racer

    with SettleClient(host.base_url) as client, client.processing(key):
        assert run_racer(host.base_url, key, tmp_path / "ran.txt") == "held"
    assert run_racer(host.base_url, key, tmp_path / "ran.txt") == "already"
    assert not (tmp_path / "ran.txt").exists()


def test_racing_processes_run_the_block_exactly_once(host: HostProcess, key, tmp_path):
    from tests.client.racer import outcome, start_racer

    ran, go = tmp_path / "ran.txt", tmp_path / "go"
    racers = [start_racer(host.base_url, key, ran, go) for _ in range(4)]
    go.touch()
    results = sorted(outcome(r) for r in racers)
    assert results.count("processed") == 1, results
    assert set(results) <= {"processed", "held", "already"}
    pids = ran.read_text().split()
    assert len(pids) == 1
    with SettleClient(host.base_url) as client:
        assert some(client.get(key)).data == {"pid": int(pids[0])}
