"""What a record's head says and how its next version is built (``state.lifecycle``), one example per
public rule not covered by ``test_lifecycle_rules.py``: retention and the effective status, the columns a
head starts with, its lock and its index rows, what a lock replaces, and a write read back after a lost
answer."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from common.clock import epoch_ms, iso
from common.errors import Conflict, LockLost
from state.keys import LOCK_KIND, RETENTION_KIND, head_row_key, history_row_key_of, index_row_key
from state.lifecycle import (
    FINISHED,
    INDEX_COLUMNS,
    LOCK_EXPIRED,
    LOCK_TAKEN_OVER,
    NEVER,
    Head,
    LockOrder,
    LockPlan,
    WriteContext,
    WritePlan,
    as_written,
    check_holder,
    check_release,
    claims_of,
    closed_by,
    closes,
    concluded,
    conclusion_replayed,
    decide_lock,
    effective_status,
    extended,
    head_columns,
    history_row,
    is_version,
    lock_fields,
    may_lock,
    new_head,
    next_head,
    plan_write,
    previous_attempt,
    retain_until,
    retention_expired,
    row_of,
    same_request,
    settled,
    taken_over,
)
from state.model import RecordKey, Scope, Status
from state.rows import StateRow

KEY = RecordKey(1, Scope.ELEMENT, 42, "invoice", "INV-1")
PK = "1|4|42"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def locked(seconds: int = 60, *, request_id: str | None = None, current: Head | None = None) -> Head:
    plan = decide_lock(
        current,
        LockOrder(KEY, WriteContext(), seconds, request_id),
        partition=PK,
        now=T0 if current is None else at(seconds + 1),
        judged=T0 if current is None else at(seconds + 1),
    )
    assert plan.new is not None
    return Head(plan.new, 'W/"1"')


def finished(status: Status, *, retention: int | None = None, now: datetime = T0) -> Head:
    return Head(new_head(KEY, WriteContext(retention_seconds=retention), status, now, partition=PK), 'W/"2"')


# -- retention and the effective status ------------------------------------------------------------------


def test_retain_until_is_never_for_a_head_kept_for_ever() -> None:
    assert datetime(9999, 12, 31, tzinfo=UTC) == NEVER
    assert retain_until(finished(Status.PROCESSED).row) == NEVER
    assert retain_until(StateRow.from_entity({"PartitionKey": PK, "RowKey": "r"})) == NEVER
    assert retain_until(finished(Status.PROCESSED, retention=30).row) == at(30)


def test_retention_expired_only_for_a_finished_head_past_its_window() -> None:
    assert {Status.PROCESSED, Status.SKIPPED, Status.FAILED} == FINISHED
    for status in FINISHED:
        head = finished(status, retention=30)
        assert not retention_expired(head.row, at(29.999))
        assert retention_expired(head.row, at(30))
        assert head.retention_expired(at(31))
    assert not retention_expired(finished(Status.PROCESSED).row, at(10**9))
    processing = replace(locked().row, retain_until=T0)
    assert not retention_expired(processing, at(1))


def test_effective_status_is_expired_past_retention_else_the_status() -> None:
    head = finished(Status.SKIPPED, retention=30)

    assert effective_status(head.row, at(29)) is Status.SKIPPED
    assert effective_status(head.row, at(30)) is Status.EXPIRED
    assert effective_status(locked().row, at(10**6)) is Status.PROCESSING


# -- the columns of a head ---------------------------------------------------------------------------


def test_head_columns_are_its_keys_its_key_fields_status_and_handler() -> None:
    assert head_columns(KEY, PK, Status.PROCESSED, "built-in").to_entity() == {
        "PartitionKey": PK,
        "RowKey": head_row_key(KEY),
        "TenantId": 1,
        "ScopeId": 4,
        "EntityId": 42,
        "ItemEntityKey": "invoice",
        "Status": int(Status.PROCESSED),
        "HandlerKey": "built-in",
        "RetainUntil": NEVER,
    }


def test_new_head_carries_the_writers_options_and_a_finished_heads_retention() -> None:
    ctx = WriteContext(handler_key="h", source_app_id=9, entity_execution_id=5, retention_seconds=60)

    head = new_head(KEY, ctx, Status.PROCESSED, T0, partition=PK).to_entity()

    assert head["HandlerKey"] == "h" and head["SourceAppId"] == 9 and head["EntityExecutionId"] == 5
    assert int(head["RetentionSeconds"].value) == 60
    assert (head["Version"], head["CreatedAt"], head["UpdatedAt"], head["DataChunks"]) == (1, T0, T0, 0)
    assert head["RetainUntil"] == at(60)
    assert str(head["RetainIndexKey"]).startswith(index_row_key(RETENTION_KIND, epoch_ms(at(60)), ""))
    processing = new_head(KEY, ctx, Status.PROCESSING, T0, partition=PK).to_entity()
    assert processing["RetainUntil"] == NEVER and "RetainIndexKey" not in processing
    plain = new_head(KEY, WriteContext(), Status.PROCESSED, T0, partition=PK).to_entity()
    assert not {"SourceAppId", "EntityExecutionId", "RetentionSeconds"} & plain.keys()


def test_next_head_is_the_following_version_in_the_partition_it_was_created_in() -> None:
    first = finished(Status.FAILED)

    following = next_head(KEY, WriteContext(), first, Status.PROCESSING, at(5), partition="elsewhere")

    assert following.partition_key == PK and following.version == 2
    assert following.created_at == T0 and following.updated_at == at(5)
    fresh = next_head(KEY, WriteContext(), None, Status.PROCESSING, at(5), partition="elsewhere")
    assert fresh.partition_key == "elsewhere" and fresh.version == 1 and fresh.created_at == at(5)


def test_lock_fields_set_the_lock_and_the_index_row_catch_up_finds_it_by() -> None:
    row = StateRow(partition_key=PK, row_key=head_row_key(KEY))

    locked_row = lock_fields(row, "lock-1", T0, at(30.0004))

    assert locked_row.lock_id == "lock-1" and locked_row.locked_at == T0
    assert locked_row.locked_until == at(30)  # kept to the millisecond, as storage keeps it
    assert locked_row.lock_index_key == index_row_key(LOCK_KIND, epoch_ms(at(30)), "lock-1")
    assert row.lock_id is None  # the row it was given is left as it was


def test_index_columns_name_the_heads_own_index_rows() -> None:
    assert INDEX_COLUMNS == {"LockIndexKey": LOCK_KIND, "RetainIndexKey": RETENTION_KIND}
    head = locked()
    assert head.index_keys() == {"LockIndexKey": head.entity["LockIndexKey"]}
    superseded = history_row(head, finished(Status.PROCESSED).row).to_entity()
    assert not {"LockIndexKey", "RetainIndexKey"} & superseded.keys()


# -- what a lock replaces ----------------------------------------------------------------------------


def test_may_lock_judges_the_head_at_the_given_time() -> None:
    head = locked(60)

    assert not may_lock(head, at(59))
    assert may_lock(head, at(60))
    assert not may_lock(finished(Status.PROCESSED), at(10**6))
    assert may_lock(finished(Status.PROCESSED, retention=5), at(5))
    assert may_lock(finished(Status.FAILED), T0)


def test_a_lock_plan_takes_refuses_or_replays() -> None:
    assert LockPlan() == LockPlan(new=None, takeover=False, refused=None, replay=False)
    took = decide_lock(None, LockOrder(KEY, WriteContext(), 60), partition=PK, now=T0, judged=T0)
    assert took.new is not None and not took.takeover and took.refused is None and not took.replay
    held = Head(took.new, "e")
    again = decide_lock(held, LockOrder(KEY, WriteContext(), 60), partition=PK, now=at(1), judged=at(1))
    assert again.new is None and again.refused is not None and not again.refused.acquired
    assert again.refused.status is Status.PROCESSING and again.refused.locked_until == at(60)


def test_taken_over_says_whose_lock_expired_when() -> None:
    head = locked(60)
    new = locked(60).row

    took = taken_over(new, head)

    assert (took.substatus, took.note) == (
        LOCK_TAKEN_OVER,
        f"Took over lock {head.entity['LockId']} that expired at {iso(at(60))}.",
    )
    assert replace(took, substatus=new.substatus, note=new.note) == new  # nothing else changes
    unknown = Head.read({k: v for k, v in head.entity.items() if k != "LockedUntil"}, "e")
    assert (taken_over(new, unknown).note or "").endswith("that expired at an unknown time.")


def test_same_request_is_the_still_valid_lock_taken_with_that_request_id() -> None:
    head = locked(60, request_id="req-1")

    assert same_request(head, "req-1", at(59))
    assert not same_request(head, "req-1", at(60))
    assert not same_request(head, "req-2", at(1))
    assert not same_request(locked(60), "req-1", at(1))
    done = Head.read({**head.entity, "Status": int(Status.PROCESSED)}, "e")
    assert not same_request(done, "req-1", at(1))


def test_previous_attempt_of_a_lock_taken_over() -> None:
    previous = previous_attempt(locked().row)

    assert previous.status == Status.PROCESSING.label and previous.lock_expired
    assert previous.version == 1 and previous.error is None


def test_previous_attempt_of_a_lock_catch_up_concluded_expired() -> None:
    row = StateRow.from_entity({**finished(Status.FAILED).entity, "Substatus": LOCK_EXPIRED, "Error": "gone"})

    previous = previous_attempt(row)

    assert previous.status == Status.FAILED.label and previous.lock_expired and previous.error == "gone"


def test_previous_attempt_of_a_failure_or_an_outcome_is_not_an_expired_lock() -> None:
    failed = previous_attempt(
        StateRow.from_entity({**finished(Status.FAILED).entity, "Substatus": "Timeout"})
    )
    done = previous_attempt(
        StateRow.from_entity({**finished(Status.PROCESSED).entity, "Substatus": LOCK_EXPIRED})
    )

    assert failed.status == Status.FAILED.label and not failed.lock_expired and failed.error is None
    assert done.status == Status.PROCESSED.label and not done.lock_expired


def test_previous_attempt_of_a_history_row_is_its_recorded_status() -> None:
    head = finished(Status.FAILED)
    row = history_row(head, StateRow.from_entity({**finished(Status.PROCESSING).entity, "Version": 2}))

    previous = previous_attempt(row)

    assert row.to_entity()["Status"] == int(Status.SUPERSEDED) and previous.status == Status.FAILED.label
    assert previous.version == 1


# -- a write's rows and a lost answer ----------------------------------------------------------------


def test_closed_by_is_the_version_that_ended_the_tokens_lock() -> None:
    head = locked(60)
    claims = claims_of(KEY, head)
    done = closes(finished(Status.PROCESSED).row, claims, "d1")

    assert closed_by(Head(done, "e"), claims)
    assert not closed_by(head, claims)
    assert done.closed_lock_id == head.entity["LockId"] and done.closed_digest == "d1"


def test_as_written_rebuilds_the_version_that_ended_the_lock_from_its_history_row() -> None:
    head = locked(60)
    claims = claims_of(KEY, head)
    done = replace(closes(finished(Status.FAILED).row, claims, "d1"), version=2)
    row = history_row(
        Head(done, "e"), StateRow.from_entity({**done.to_entity(), "Version": 3, "UpdatedAt": at(9)})
    )

    rebuilt = as_written(row, claims, head_row_key(KEY))

    assert rebuilt is not None and rebuilt.status is Status.FAILED and rebuilt.version == 2
    assert rebuilt.entity["RowKey"] == head_row_key(KEY)
    assert not {"RecordedStatus", "SupersededAt", "SupersededByVersion"} & rebuilt.entity.keys()
    written = row.to_entity()
    assert written["RowKey"] == history_row_key_of(head_row_key(KEY), 2)
    another = StateRow.from_entity({**written, "ClosedLockId": "another"})
    assert as_written(another, claims, head_row_key(KEY)) is None
    unrecorded = StateRow.from_entity({k: v for k, v in written.items() if k != "RecordedStatus"})
    assert as_written(unrecorded, claims, "rk") is None


def test_a_write_plan_finds_the_index_row_or_marker_a_refusal_names() -> None:
    from common.transactions import Refusal

    current = locked(60)
    new = replace(finished(Status.PROCESSED, retention=30).row, partition_key=PK, version=2)
    marker = {"PartitionKey": PK, "RowKey": "~m"}
    deleting, inserting = [str(current.entity["LockIndexKey"])], [str(new.retain_index_key)]

    plan = plan_write(current, new, keep_history=True, deleting=deleting, inserts=inserting, markers=[marker])

    assert isinstance(plan, WritePlan) and not plan.single_insert
    assert [op[0] for op in plan.ops] == ["update", "create", "delete", "create", "update"]
    assert plan.gone_index_row(Refusal(index=2, status=404, code="ResourceNotFound")) == deleting[0]
    assert plan.gone_marker(Refusal(index=4, status=404, code="ResourceNotFound")) == marker
    assert plan.gone_index_row(Refusal(index=4, status=404, code="ResourceNotFound")) is None
    assert plan.gone_marker(Refusal(index=2, status=404, code="ResourceNotFound")) is None
    assert plan.gone_marker(Refusal(index=4, status=412, code="")) is None


@pytest.mark.parametrize(
    ("column", "another"),
    [
        ("Version", 2),
        ("Status", int(Status.PROCESSED)),
        ("LockId", "another"),
        ("LockedUntil", at(61)),
        ("ClosedLockId", "another"),
    ],
)
def test_is_version_compares_every_column_a_write_sets(column: str, another: object) -> None:
    written = {**locked(60).entity, "ClosedLockId": "x"}
    new = StateRow.from_entity(written)
    changed = StateRow.from_entity({**written, column: another})
    missing = StateRow.from_entity({k: v for k, v in written.items() if k != column})

    assert is_version(StateRow.from_entity(dict(written)), new)
    assert not is_version(changed, new)
    assert not is_version(missing, new)
    assert not is_version(new, missing)


def test_is_version_compares_times_to_the_millisecond_storage_keeps() -> None:
    new = locked(60).row
    assert new.updated_at is not None
    read = replace(new, updated_at=new.updated_at + timedelta(microseconds=400))

    assert is_version(read, new)
    assert not is_version(replace(new, updated_at=new.updated_at + timedelta(milliseconds=1)), new)


def test_settled_tells_a_lost_write_that_applied_from_one_that_did_not() -> None:
    current = locked(60)
    new = StateRow.from_entity({**current.entity, "Version": 2, "Status": int(Status.PROCESSED)})

    assert settled(Head(new, "e2"), current, new) == "applied"
    assert settled(current, current, new) == "not-applied"
    assert settled(None, None, new) == "not-applied"
    assert settled(None, current, new) == "changed"  # deleted meanwhile
    assert settled(Head.read(current.entity, "e-other"), current, new) == "changed"
    assert settled(current, None, new) == "changed"  # created by another writer


# -- what a refused writer reads, word for word -----------------------------------------------------------


def lost_by(head: Head | None, token_head: Head, now: datetime) -> LockLost:
    with pytest.raises(LockLost) as lost:
        check_holder(head, claims_of(KEY, token_head), now)
    assert lost.value.field == "lockToken"
    return lost.value


def test_check_holder_says_why_a_token_no_longer_holds_the_lock() -> None:
    mine = locked(60)
    taken = Head.read({**locked(60).entity}, "e2")  # another lock id

    assert str(lost_by(None, mine, T0)) == (
        "The lock is no longer held: the record does not exist. Nothing was written."
    )
    assert str(lost_by(taken, mine, T0)) == (
        "The lock is no longer held: another caller took the lock over after it expired. Nothing was written."
    )
    done = Head.read({**mine.entity, "Status": int(Status.PROCESSED)}, "e3")
    assert str(lost_by(done, mine, T0)) == (
        "The lock is no longer held: the record is now Processed. Nothing was written."
    )
    assert str(lost_by(mine, mine, at(60))) == (
        f"The lock expired at {iso(at(60))}; take the lock again. Nothing was written."
    )
    assert check_holder(mine, claims_of(KEY, mine), at(59)) is mine


def test_check_release_says_there_is_no_lock_to_release() -> None:
    for head, state in ((None, "no record"), (finished(Status.SKIPPED), "the record is Skipped")):
        with pytest.raises(Conflict) as refused:
            check_release(head)
        assert refused.value.field == "key"
        assert str(refused.value) == f"There is no lock to release: {state}."
    check_release(locked())


def test_conclusion_replayed_refuses_another_requests_conclusion_on_the_token() -> None:
    done = Head.read({**finished(Status.PROCESSED).entity, "ClosedDigest": "d1"}, "e")

    with pytest.raises(LockLost) as lost:
        conclusion_replayed(done, Status.PROCESSED, "d2")

    assert lost.value.field == "lockToken"
    assert str(lost.value) == "This lock already ended with Processed (another request). Nothing was written."


def test_catch_up_concludes_an_expired_lock_as_failed_keeping_identity_and_retention() -> None:
    head = Head(
        new_head(KEY, WriteContext(retention_seconds=30), Status.PROCESSING, T0, partition=PK), 'W/"1"'
    )

    new = concluded(head, Status.FAILED, substatus=LOCK_EXPIRED, error="gone", now=at(90)).to_entity()

    assert new["Status"] == int(Status.FAILED) and new["Version"] == 2
    assert (new["CreatedAt"], new["UpdatedAt"], new["Substatus"], new["Error"]) == (
        T0,
        at(90),
        LOCK_EXPIRED,
        "gone",
    )
    assert new["DataChunks"] == 0 and new["PartitionKey"] == PK and new["RowKey"] == head_row_key(KEY)
    assert new["RetainUntil"] == at(120)
    assert str(new["RetainIndexKey"]).startswith(index_row_key(RETENTION_KIND, epoch_ms(at(120)), ""))
    plain = concluded(locked(), Status.FAILED, substatus=LOCK_EXPIRED, error=None, now=at(90)).to_entity()
    assert plain["RetainUntil"] == NEVER and "RetainIndexKey" not in plain and "Error" not in plain
    assert plain["CreatedAt"] == T0


def test_catch_up_expires_a_finished_record_without_a_new_retention() -> None:
    head = finished(Status.PROCESSED, retention=30)

    new = concluded(head, Status.EXPIRED, substatus="RetentionExpired", error=None, now=at(31)).to_entity()

    assert new["Status"] == int(Status.EXPIRED) and new["RetainUntil"] == NEVER
    assert "RetainIndexKey" not in new and new["Substatus"] == "RetentionExpired"


def test_an_extension_stamps_the_time_it_was_extended() -> None:
    head = locked(60)

    new = extended(head, at(10), 60)

    assert new.updated_at == at(10) and new.locked_until == at(70)
    assert new.version == head.version and new.lock_id == head.entity["LockId"]


def test_each_retention_index_row_has_its_own_id() -> None:
    first, second = finished(Status.PROCESSED, retention=30), finished(Status.PROCESSED, retention=30)
    prefix = index_row_key(RETENTION_KIND, epoch_ms(at(30)), "")

    assert first.entity["RetainIndexKey"] != second.entity["RetainIndexKey"]
    assert len(str(first.entity["RetainIndexKey"])) == len(prefix) + 32


def test_a_token_carries_every_option_of_the_head_it_was_issued_for() -> None:
    ctx = WriteContext(handler_key="h", source_app_id=9, entity_execution_id=5, retention_seconds=60)
    first = Head(new_head(KEY, ctx, Status.FAILED, T0, partition=PK), 'W/"1"')
    plan = decide_lock(first, LockOrder(KEY, ctx, 30, "req-1"), partition=PK, now=at(1), judged=at(1))
    assert plan.new is not None
    head = Head.read({**plan.new.to_entity(), "Substatus": "s", "Note": "n"}, 'W/"2"')

    rebuilt = row_of(KEY, claims_of(KEY, head), PK).to_entity()

    assert rebuilt == head.entity
    for column in (
        "SourceAppId",
        "EntityExecutionId",
        "RetentionSeconds",
        "Substatus",
        "Note",
        "LockRequestId",
    ):
        assert column in rebuilt
