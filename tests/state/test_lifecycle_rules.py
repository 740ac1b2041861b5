"""The head's lifecycle rules (state/lifecycle.py), one by one, without storage: given a head and a time,
what a lock, a release, a fenced write, catch-up and one write's rows come to."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common.errors import Conflict, LockLost, PayloadTooLarge
from common.transactions import Refusal
from state.keys import head_row_key, history_row_key_of
from state.lifecycle import (
    LOCK_TAKEN_OVER,
    Head,
    LockOrder,
    WriteContext,
    check_holder,
    check_release,
    check_size,
    claims_of,
    concluded,
    conclusion_replayed,
    decide_lock,
    extended,
    index_changes,
    lock_entry,
    new_head,
    plan_write,
    recorded,
    row_of,
    settled,
)
from state.model import RecordKey, Scope, Status
from state.rows import StateRow

KEY = RecordKey(1, Scope.ELEMENT, 42, "invoice", "INV-1")
PK = "1|4|42"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LOCK = LockOrder(KEY, WriteContext(), 60)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def locked(until_s: float = 60, *, request_id: str | None = None) -> Head:
    plan = decide_lock(
        None, LockOrder(KEY, WriteContext(), int(until_s), request_id), partition=PK, now=T0, judged=T0
    )
    assert plan.new is not None
    return Head(plan.new, 'W/"1"')


def finished(status: Status, *, retention: int | None = None) -> Head:
    entity = new_head(KEY, WriteContext(retention_seconds=retention), status, T0, partition=PK)
    return Head(entity, 'W/"2"')


# -- lock ----------------------------------------------------------------------------------------------
def test_a_first_lock_writes_version_1_processing_with_its_lock_and_index_row():
    plan = decide_lock(None, LockOrder(KEY, WriteContext(), 30, "req-1"), partition=PK, now=T0, judged=T0)
    assert plan.new is not None and not plan.takeover
    new = plan.new.to_entity()
    assert (new["Version"], new["Status"], new["PartitionKey"]) == (1, int(Status.PROCESSING), PK)
    assert new["LockedUntil"] == at(30) and new["LockRequestId"] == "req-1"
    assert new["LockIndexKey"].endswith(new["LockId"])


def test_a_valid_lock_refuses_another_caller_and_says_until_when():
    plan = decide_lock(locked(60), LOCK, partition=PK, now=at(10), judged=at(10))
    assert plan.new is None and plan.refused is not None
    assert plan.refused.acquired is False and plan.refused.status is Status.PROCESSING
    assert plan.refused.locked_until == at(60) and "holds the lock" in (plan.refused.reason or "")


def test_the_same_request_asked_again_while_its_lock_holds_is_replayed():
    current = locked(60, request_id="req-1")
    again = LockOrder(KEY, WriteContext(), 60, "req-1")
    assert decide_lock(current, again, partition=PK, now=at(5), judged=at(5)).replay
    other = LockOrder(KEY, WriteContext(), 60, "req-2")
    assert decide_lock(current, other, partition=PK, now=at(5), judged=at(5)).refused is not None


def test_an_expired_lock_is_taken_over_as_the_next_version_and_says_whose_it_was():
    current = locked(60)
    plan = decide_lock(current, LOCK, partition=PK, now=at(61), judged=at(61))
    assert plan.takeover and plan.new is not None
    new = plan.new.to_entity()
    assert new["Version"] == 2 and new["Substatus"] == LOCK_TAKEN_OVER
    assert current.entity["LockId"] in new["Note"] and new["LockId"] != current.entity["LockId"]


def test_an_expiry_is_judged_by_the_earliest_clock_reading_so_an_uncertain_clock_waits():
    # now says the lock expired, the earliest the storage clock may read says it may not have: refused
    plan = decide_lock(locked(60), LOCK, partition=PK, now=at(60.4), judged=at(59.9))
    assert plan.refused is not None


def test_a_record_keeps_the_partition_it_was_created_in():
    current = Head.read({**locked(1).entity, "PartitionKey": "old-partition"}, "e")
    plan = decide_lock(current, LOCK, partition=PK, now=at(2), judged=at(2))
    assert plan.new is not None and plan.new.partition_key == "old-partition"


@pytest.mark.parametrize("status", [Status.PROCESSED, Status.SKIPPED])
def test_a_finished_record_refuses_a_lock_until_its_retention_ends(status: Status):
    current = finished(status, retention=30)
    refused = decide_lock(current, LOCK, partition=PK, now=at(10), judged=at(10)).refused
    assert refused is not None and refused.status is status and refused.locked_until is None
    after = decide_lock(current, LOCK, partition=PK, now=at(31), judged=at(31))
    assert after.new is not None and not after.takeover and after.new.version == 2


def test_a_failed_record_is_locked_again_without_a_takeover():
    plan = decide_lock(finished(Status.FAILED), LOCK, partition=PK, now=at(1), judged=at(1))
    assert plan.new is not None and not plan.takeover and plan.new.substatus is None


# -- release and fencing -------------------------------------------------------------------------------
def test_a_release_without_a_token_needs_a_processing_head():
    with pytest.raises(Conflict, match="no record"):
        check_release(None)
    with pytest.raises(Conflict, match="Processed"):
        check_release(finished(Status.PROCESSED))
    check_release(locked())


def test_a_token_writes_only_while_its_own_lock_holds_the_head():
    head = locked(60)
    claims = claims_of(KEY, head)
    assert check_holder(head, claims, at(59)) is head
    with pytest.raises(LockLost, match="expired"):
        check_holder(head, claims, at(60))
    taken = decide_lock(head, LOCK, partition=PK, now=at(61), judged=at(61)).new
    assert taken is not None
    with pytest.raises(LockLost, match="took the lock over"):
        check_holder(Head(taken, "e2"), claims, at(61))
    with pytest.raises(LockLost, match="Processed"):
        check_holder(finished(Status.PROCESSED), claims, at(1))
    with pytest.raises(LockLost, match="does not exist"):
        check_holder(None, claims, at(1))


def test_a_token_rebuilds_the_head_it_was_issued_for_column_for_column():
    head = locked(60, request_id="r")
    assert row_of(KEY, claims_of(KEY, head), PK).to_entity() == head.entity


def test_a_conclusion_asked_again_is_answered_and_another_requests_is_lock_lost():
    done = Head.read({**finished(Status.PROCESSED).entity, "ClosedDigest": "d1"}, "e")
    assert conclusion_replayed(done, Status.PROCESSED, "d1")
    with pytest.raises(LockLost, match="already ended with Processed"):
        conclusion_replayed(done, Status.PROCESSED, "d2")
    with pytest.raises(LockLost):
        conclusion_replayed(done, Status.FAILED, "d1")


# -- next versions -------------------------------------------------------------------------------------
def test_an_outcome_is_the_next_version_with_its_data_substatus_error_and_retention():
    new = recorded(
        KEY,
        WriteContext(retention_seconds=600),
        locked(),
        at(5),
        partition=PK,
        status=Status.FAILED,
        envelope_props={"D0": "x", "DataChunks": 1},
        substatus="Gave up",
        error="boom",
    ).to_entity()
    assert (new["Version"], new["Status"], new["CreatedAt"], new["UpdatedAt"]) == (2, 3, T0, at(5))
    assert (new["D0"], new["Substatus"], new["Error"]) == ("x", "Gave up", "boom")
    assert new["RetainUntil"] == at(605) and "RetainIndexKey" in new and "LockId" not in new


def test_an_extension_keeps_the_version_and_lock_and_moves_its_expiry_and_index_row():
    head = locked(60)
    new = extended(head, at(30), 120).to_entity()
    assert (new["Version"], new["LockId"], new["LockedAt"]) == (1, head.entity["LockId"], T0)
    assert new["LockedUntil"] == at(150) and new["LockIndexKey"] != head.entity["LockIndexKey"]


def test_catch_up_fails_an_expired_lock_and_expires_a_finished_record_keeping_its_data():
    failed = concluded(
        locked(1), Status.FAILED, substatus="LockExpired", error="expired", now=at(2)
    ).to_entity()
    assert (failed["Status"], failed["Version"], failed["DataChunks"]) == (3, 2, 0)
    assert "LockId" not in failed and failed["Error"] == "expired"
    data = Head.read({**finished(Status.PROCESSED).entity, "Data0": "kept", "DataChunks": 1}, "e")
    gone = concluded(data, Status.EXPIRED, substatus="RetentionExpired", error=None, now=at(9)).to_entity()
    assert (gone["Status"], gone["Data0"], gone["DataChunks"]) == (int(Status.EXPIRED), "kept", 1)


def test_a_head_over_the_row_limit_is_refused_naming_the_data():
    with pytest.raises(PayloadTooLarge) as refused:
        check_size(StateRow.from_entity({**locked().entity, "D0": "x" * 1_100_000}))
    assert refused.value.field == "data"


# -- one write -----------------------------------------------------------------------------------------
def _kinds(ops: list[Any]) -> list[str]:
    return [op[0] for op in ops]


def test_a_first_version_is_one_insert():
    new = locked().row
    plan = plan_write(None, new, keep_history=True, deleting=[], inserts=[], markers=[])
    assert plan.single_insert and plan.ops == [("create", new.to_entity())]


def test_a_replacement_moves_head_history_and_index_rows_together_in_one_transaction():
    current = locked(60)
    new = recorded(
        KEY, WriteContext(), current, at(5), partition=PK, status=Status.PROCESSED,
        envelope_props=None, substatus=None, error=None,
    )  # fmt: skip
    # an outcome deletes no lock row and names no lock (ADR-0021: a lock has no row, its entry is in
    # its minute's marker and is skipped by catch-up once the head is no longer Processing under it)
    assert index_changes(current, new) == ([], []) and lock_entry(current, new) is None
    marker = {"PartitionKey": PK, "RowKey": "m"}
    deletes = ["~r0"]  # a retention row the head named
    plan = plan_write(current, new, keep_history=True, deleting=deletes, inserts=["~r1"], markers=[marker])
    assert _kinds(plan.ops) == ["update", "create", "delete", "create", "update"]
    assert plan.ops[0][2]["etag"] == current.etag  # If-Match the head as read
    history = plan.ops[1][1]
    assert history["RowKey"] == history_row_key_of(head_row_key(KEY), 1)
    assert (history["Status"], history["RecordedStatus"], history["SupersededByVersion"]) == (5, 2, 2)
    assert "LockIndexKey" not in history
    assert plan.ops[3][1] == {"PartitionKey": PK, "RowKey": "~r1", "StateRK": head_row_key(KEY)}
    # a refusal of an index operation names what to do again; of the head, nothing
    assert plan.gone_index_row(Refusal(index=2, status=404, code="ResourceNotFound")) == deletes[0]
    assert plan.gone_marker(Refusal(index=4, status=404, code="ResourceNotFound")) == marker
    assert plan.gone_marker(Refusal(index=0, status=412, code="UpdateConditionNotSatisfied")) is None
    assert plan.gone_index_row(Refusal(index=0, status=404, code="ResourceNotFound")) is None


def test_an_extension_rewrites_in_place_without_a_history_row():
    current = locked(60)
    new = extended(current, at(1), 60)
    # the lock moves: no row, an entry for the new minute's marker (the old one is skipped)
    assert index_changes(current, new) == ([], [])
    entry = lock_entry(current, new)
    assert entry is not None and new.locked_until is not None
    assert (entry.lock_id, entry.head_row_key) == (current.row.lock_id, head_row_key(KEY))
    assert entry.expiry_ms == int(new.locked_until.timestamp() * 1000)
    marker = {"PartitionKey": PK, "RowKey": "m", entry.column: entry.value}
    plan = plan_write(current, new, keep_history=False, deleting=[], inserts=[], markers=[marker])
    assert _kinds(plan.ops) == ["update", "update"]
    # a write that keeps the lock (the same index key) adds no entry
    assert lock_entry(Head(new, "e"), new) is None


def test_a_lost_answer_is_settled_by_the_head_read_back():
    current = locked(60)
    new = extended(current, at(1), 60)
    assert settled(Head(new, "e2"), current, new) == "applied"
    assert settled(current, current, new) == "not-applied"  # same ETag: nothing was written
    assert settled(None, None, locked().row) == "not-applied"
    other = extended(current, at(2), 90)
    assert settled(Head(other, "e3"), current, new) == "changed"


def test_a_head_of_exactly_the_row_limit_is_written_and_one_character_more_is_refused_naming_the_limit():
    from common.limits import MAX_ENTITY_BYTES, entity_size

    def padded(n: int) -> StateRow:
        return StateRow.from_entity({**locked().entity, "D0": "x" * n})

    n = 1000 + (MAX_ENTITY_BYTES - entity_size(padded(1000).to_entity())) // 2
    assert entity_size(padded(n).to_entity()) == MAX_ENTITY_BYTES
    check_size(padded(n))

    with pytest.raises(PayloadTooLarge) as refused:
        check_size(padded(n + 1))
    assert str(refused.value) == (
        f"The record would take {MAX_ENTITY_BYTES + 2} bytes in Table Storage; the limit is "
        f"{MAX_ENTITY_BYTES} bytes per row. Send less data."
    )
    assert refused.value.extra == {"limitBytes": MAX_ENTITY_BYTES}


def test_index_changes_leave_the_index_rows_a_write_keeps():
    kept = finished(Status.PROCESSED, retention=3600)
    rewritten = StateRow.from_entity({**kept.entity, "Note": "the same head, another note"})
    assert kept.index_keys()  # it owns a retention index row

    assert index_changes(kept, rewritten) == ([], [])


def test_a_lock_that_is_no_takeover_says_so():
    plan = decide_lock(None, LOCK, partition=PK, now=T0, judged=T0)
    free = decide_lock(finished(Status.FAILED), LOCK, partition=PK, now=at(1), judged=at(1))

    assert plan.takeover is False and free.takeover is False
