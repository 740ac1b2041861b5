"""The projection's rules, one example each, through the public functions of the cores: the park of one
session, the stale-write guard, the status map, the operator's groups and count deltas."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from handoff.messages.contract import (
    HANDOFF_SUB_STATUS,
    InboundMessage,
    MessageContent,
    MessageType,
    ResolutionStatus,
)
from handoff.projection.guard import CONTROL_REQUESTS, TERMINAL, CurrentRow, allows, is_guarded
from handoff.projection.rules import (
    RESOLVER_AUDITOR,
    Projection,
    delta_entity,
    other_session_than_park,
    plan_projection,
    project,
    stale_comment,
)
from handoff.projection.status_map import (
    STATUS_MAP,
    overrides_processing_time,
    pending_sub_status,
    status_for,
)
from handoff.storage import counts, keys
from handoff.storage.records import EventRow

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)
PK = "billing"
EVENT = "ev-1"


def message(
    kind: MessageType,
    message_id: str,
    *,
    session: str | None = "s-1",
    parent: str | None = None,
    at: int = 0,
    dead_letter: str | None = None,
) -> InboundMessage:
    return InboundMessage(
        message_id=message_id,
        message_type=kind,
        event_id=EVENT,
        session_id=session,
        correlation_id=None,
        to="Billing",
        from_="Billing",
        originating_from=None,
        originating_message_id="m-request",
        parent_message_id=parent,
        event_type_id="Billing.InvoiceCreated",
        enqueued_time_utc=T0 + timedelta(seconds=at),
        delivery_count=1,
        throttle_retry_count=0,
        retry_count=None,
        retry_limit=None,
        dead_letter_reason=None,
        dead_letter_error_description=dead_letter,
        queue_time_ms=None,
        processing_time_ms=None,
        handoff_reason=None,
        external_job_id=None,
        expected_by=None,
        content=MessageContent(),
        body_text=json.dumps({"EventContent": None, "ErrorContent": None}),
    )


def written(m: InboundMessage, current: EventRow | None = None, *, etag: str = '"e1"') -> EventRow:
    """The row ``m`` projects over ``current``, as storage would hand it back."""
    decision = project(m, current, now=T0)
    assert decision.applied and decision.row is not None
    return decision.row.model_copy(update={"etag": etag})


def parked_in(session: str | None) -> EventRow:
    return written(message(MessageType.PendingHandoffResponse, "m-park", session=session, parent="m-request"))


# -- another session's message never replaces a park --------------------------------------------------


@pytest.mark.parametrize(
    "kind", [MessageType.PendingHandoffResponse, MessageType.ResolutionResponse, MessageType.ErrorResponse]
)
def test_another_sessions_message_never_replaces_a_park(kind: MessageType) -> None:
    park = parked_in("s-1")
    other = message(kind, "m-other", session="s-2", at=5)

    decision = project(other, park, now=T0)

    assert other_session_than_park(other, park)
    assert not decision.applied and decision.row is None
    assert decision.refusal is not None and "'s-1'" in decision.refusal and "'s-2'" in decision.refusal
    ops = plan_projection(PK, other, park, decision, now=T0)
    # the message is kept in the history; the Comment says why; the event row only moves its bookkeeping
    assert ops[0][1]["RowKey"] == keys.history_row(EVENT, "m-other")
    assert ops[1][1]["AuditType"] == "Comment" and ops[1][1]["Data"] == decision.refusal
    assert ops[2][0] == "update" and "ResolutionStatus" not in ops[2][1]


def test_the_parks_own_session_settles_it() -> None:
    park = parked_in("s-1")
    done = message(MessageType.ResolutionResponse, "m-done", session="s-1", at=5)

    assert not other_session_than_park(done, park)
    assert project(done, park, now=T0).applied


@pytest.mark.parametrize(("parked", "incoming"), [(None, "s-2"), ("s-1", None)])
def test_a_message_or_a_park_without_a_session_is_not_another_sessions(
    parked: str | None, incoming: str | None
) -> None:
    park = parked_in(parked)
    done = message(MessageType.ResolutionResponse, "m-done", session=incoming, at=5)

    assert not other_session_than_park(done, park)
    assert project(done, park, now=T0).applied


def test_another_sessions_message_replaces_a_row_that_is_not_a_park() -> None:
    failed = written(message(MessageType.ErrorResponse, "m-err", session="s-1"))
    retry = message(MessageType.ResolutionResponse, "m-done", session="s-2", at=5)

    assert not other_session_than_park(retry, failed)
    assert project(retry, failed, now=T0).applied


def test_a_plain_pending_row_of_another_session_is_not_a_park() -> None:
    pending = written(message(MessageType.EventRequest, "m-request", session="s-1"))
    assert pending.pending_sub_status is None

    assert not other_session_than_park(message(MessageType.ResolutionResponse, "m-x", session="s-2"), pending)


# -- the stale-write guard ---------------------------------------------------------------------------


def test_stale_comment_names_the_message_it_ignored() -> None:
    late = message(MessageType.EventRequest, "m-late")

    assert stale_comment(late) == (
        "Ignored stale EventRequest m-late: the audit row already holds a later outcome."
    )


def test_a_refused_stale_copy_is_audited_with_the_stale_comment() -> None:
    done = written(message(MessageType.ResolutionResponse, "m-done"))
    late = message(MessageType.EventRequest, "m-request", at=-5)

    decision = project(late, done, now=T0)
    ops = plan_projection(PK, late, done, decision, now=T0)

    assert not decision.applied and decision.refusal is None
    assert ops[1][1]["Data"] == stale_comment(late)


@pytest.mark.parametrize("status", [s for s in ResolutionStatus if s in TERMINAL])
def test_is_guarded_never_holds_back_a_terminal_outcome(status: ResolutionStatus) -> None:
    for kind in MessageType:
        assert not is_guarded(status, kind)


def test_is_guarded_covers_requests_parks_and_control_requests_only() -> None:
    pending = ResolutionStatus.Pending
    for kind in (MessageType.EventRequest, MessageType.DeferralResponse, MessageType.PendingHandoffResponse):
        assert is_guarded(pending, kind)
    for kind in CONTROL_REQUESTS:
        assert is_guarded(pending, kind)
    for kind in (MessageType.ResolutionResponse, MessageType.ErrorResponse, MessageType.SkipResponse):
        assert not is_guarded(pending, kind)
    assert is_guarded(ResolutionStatus.Deferred, MessageType.DeferralResponse)


def row(status: ResolutionStatus, kind: MessageType, *, parent: str | None = None) -> CurrentRow:
    return CurrentRow(
        resolution_status=status, message_type=kind, parent_message_id=parent, last_message_id="x"
    )


def test_the_guard_allows_any_write_over_no_row() -> None:
    assert allows(ResolutionStatus.Pending, MessageType.EventRequest, "m-1", None)


def test_the_guard_refuses_a_copy_of_the_message_the_row_already_answers() -> None:
    answered = row(ResolutionStatus.Pending, MessageType.PendingHandoffResponse, parent="m-request")

    assert not allows(ResolutionStatus.Pending, MessageType.EventRequest, "m-request", answered)
    assert not allows(ResolutionStatus.Pending, MessageType.PendingHandoffResponse, "m-request", answered)
    assert allows(ResolutionStatus.Pending, MessageType.PendingHandoffResponse, "m-other", answered)
    # a terminal answer is never guarded, even when it repeats the parent's id
    assert allows(ResolutionStatus.Completed, MessageType.ResolutionResponse, "m-request", answered)
    # a message without an id is not a copy of anything
    assert not allows(ResolutionStatus.Pending, MessageType.EventRequest, None, answered)


def test_a_request_only_replaces_an_open_row_of_the_request_stage() -> None:
    pending = ResolutionStatus.Pending
    assert allows(pending, MessageType.EventRequest, "m-2", row(pending, MessageType.EventRequest))
    assert allows(pending, MessageType.EventRequest, "m-2", row(pending, MessageType.Unknown))
    deferred = row(ResolutionStatus.Deferred, MessageType.DeferralResponse)
    assert allows(ResolutionStatus.Deferred, MessageType.DeferralResponse, "m-2", deferred)
    assert not allows(
        pending, MessageType.EventRequest, "m-2", row(pending, MessageType.PendingHandoffResponse)
    )
    for status in TERMINAL:
        assert not allows(pending, MessageType.EventRequest, "m-2", row(status, MessageType.EventRequest))


def test_a_park_replaces_anything_but_a_completed_or_skipped_row() -> None:
    park = MessageType.PendingHandoffResponse
    pending = ResolutionStatus.Pending
    for status in (ResolutionStatus.Completed, ResolutionStatus.Skipped):
        assert not allows(pending, park, "m-2", row(status, MessageType.ResolutionResponse))
    for status in (ResolutionStatus.Failed, ResolutionStatus.DeadLettered, ResolutionStatus.Unsupported):
        assert allows(pending, park, "m-2", row(status, MessageType.ErrorResponse))
    assert allows(pending, park, "m-2", row(pending, MessageType.EventRequest))


def test_a_control_request_applies_over_a_settled_row() -> None:
    done = row(ResolutionStatus.Completed, MessageType.ResolutionResponse)
    for kind in CONTROL_REQUESTS:
        assert allows(ResolutionStatus.Pending, kind, "m-2", done)


# -- the status map ----------------------------------------------------------------------------------


def test_status_for_follows_the_status_map() -> None:
    for kind, status in STATUS_MAP.items():
        assert status_for(kind, dead_letter_error_description=None) is status
    assert status_for(MessageType.HandoffCompletedRequest, dead_letter_error_description=None) is (
        ResolutionStatus.Pending
    )


def test_a_dead_letter_description_wins_over_the_type() -> None:
    got = status_for(MessageType.ResolutionResponse, dead_letter_error_description="")
    assert got is ResolutionStatus.DeadLettered


def test_a_type_without_a_projection_is_a_poison_message() -> None:
    from handoff.messages.contract import PoisonMessage

    unmapped = [kind for kind in MessageType if kind not in STATUS_MAP]
    assert unmapped
    with pytest.raises(PoisonMessage, match=unmapped[0].name):
        status_for(unmapped[0], dead_letter_error_description=None)


def test_pending_sub_status_is_handoff_for_a_park_only() -> None:
    for kind in MessageType:
        expected = HANDOFF_SUB_STATUS if kind is MessageType.PendingHandoffResponse else None
        assert pending_sub_status(kind) == expected


def test_only_terminal_responses_override_the_processing_time() -> None:
    overriding = {kind for kind in MessageType if overrides_processing_time(kind)}
    assert overriding == {MessageType.ResolutionResponse, MessageType.ErrorResponse}


def test_a_terminal_response_after_a_hand_off_reports_the_time_since_the_request() -> None:
    request = written(message(MessageType.EventRequest, "m-request", at=0))
    park = written(message(MessageType.PendingHandoffResponse, "m-park", parent="m-request", at=1), request)
    done = message(MessageType.ResolutionResponse, "m-done", at=90)

    decision = project(done, park, now=T0 + timedelta(seconds=90, milliseconds=250))

    assert decision.row is not None and decision.row.processing_time_ms == 90_250


# -- the operator's groups and counts ----------------------------------------------------------------


def test_group_of_puts_pending_in_one_group_and_failures_in_another() -> None:
    assert counts.group_of(ResolutionStatus.Pending) == counts.PENDING_GROUP
    assert counts.group_of(ResolutionStatus.Failed) == counts.FAILED_GROUP
    assert counts.group_of(ResolutionStatus.DeadLettered) == counts.FAILED_GROUP
    for status in (ResolutionStatus.Completed, ResolutionStatus.Skipped, ResolutionStatus.Deferred):
        assert counts.group_of(status) is None


def test_an_event_keeps_the_time_it_entered_its_group_while_it_stays_there() -> None:
    request = written(message(MessageType.EventRequest, "m-request"))
    later = T0 + timedelta(minutes=5)

    park = project(
        message(MessageType.PendingHandoffResponse, "m-park", parent="m-request"), request, now=later
    )
    done = project(message(MessageType.ResolutionResponse, "m-done"), request, now=later)

    assert park.row is not None and park.row.since_at == T0 and park.row.since_key is None
    assert done.row is not None and done.row.since_at is None and done.row.since_key is None


def test_delta_entity_is_one_insert_only_row_of_count_changes() -> None:
    entity = delta_entity(PK, T0, {"Pending": 1, "Failed": -1})

    assert entity["PartitionKey"] == PK
    assert entity["RowKey"].startswith(keys.delta_row(T0, ""))  # its minute's delta rows, oldest first
    assert entity[counts.column("Pending")] == 1 and entity[counts.column("Failed")] == -1
    assert len(entity) == 4
    assert delta_entity(PK, T0, {"Pending": 1})["RowKey"] != delta_entity(PK, T0, {"Pending": 1})["RowKey"]


def test_a_projection_that_moves_an_event_between_buckets_writes_its_count_delta() -> None:
    request = written(message(MessageType.EventRequest, "m-request"))
    done = message(MessageType.ResolutionResponse, "m-done", at=5)

    ops = plan_projection(PK, done, request, project(done, request, now=T0), now=T0)

    deltas = [op[1] for op in ops if any(str(k).startswith("N") for k in op[1])]
    assert len(deltas) == 1
    assert deltas[0][counts.column("Completed")] == 1
    assert counts.column("Pending") not in deltas[0]  # open statuses are counted from their listing rows


def test_only_the_tallied_buckets_go_into_a_delta() -> None:
    assert counts.tallied({"Pending": -1, "PendingHandoff": -1, "Completed": 1, "Poison": 1}) == {
        "Completed": 1,
        "Poison": 1,
    }
    assert counts.tallied({"Pending": 1, "Failed": -1}) == {}
    assert set(counts.OPEN) | set(counts.TALLIED) == set(counts.COUNTED)
    assert not set(counts.OPEN) & set(counts.TALLIED)


def test_a_listing_of_a_status_reads_its_range_and_all_events_read_every_status() -> None:
    assert counts.listed("Failed") == ("Failed",)
    assert counts.listed(counts.PENDING_HANDOFF) == ("Pending",)  # a filter on Pending's rows
    assert set(counts.listed(None)) == {s for s in counts.BUCKETS if s != counts.PENDING_HANDOFF}


def test_a_projection_says_applied_with_the_new_row_or_refused_without_one() -> None:
    applied = project(message(MessageType.EventRequest, "m-request"), None, now=T0)
    assert isinstance(applied, Projection)
    assert applied.applied and applied.row is not None and applied.refusal is None
    assert applied.status is ResolutionStatus.Pending and applied.request_enqueued_at == T0
    assert not applied.handoff_seen

    park = parked_in("s-1")
    refused = project(message(MessageType.ErrorResponse, "m-x", session="s-2"), park, now=T0)
    assert not refused.applied and refused.row is None and refused.handoff_seen


def test_the_resolver_is_the_auditor_of_a_refused_projections_comment() -> None:
    done = written(message(MessageType.ResolutionResponse, "m-done"))
    late = message(MessageType.EventRequest, "m-late", at=-5)

    ops = plan_projection(PK, late, done, project(late, done, now=T0), now=T0)

    assert RESOLVER_AUDITOR == "Resolver" and ops[1][1]["AuditorName"] == RESOLVER_AUDITOR


def test_read_columns_reads_every_tallied_bucket_and_skips_what_is_not_a_tally() -> None:
    assert counts.POISON in counts.COUNTED and set(counts.BUCKETS) < set(counts.COUNTED)
    entity = {
        counts.column("Completed"): 3,
        counts.column(counts.POISON): "2",
        counts.column("Skipped"): True,
        counts.column("Pending"): 7,  # an open bucket's column of a row before ADR-0022: not read
    }

    assert counts.read_columns(entity) == {"Completed": 3, counts.POISON: 2}
