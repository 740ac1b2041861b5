"""More of the projection core's rules, one example each (``handoff.projection.rules``): the history row a
message leaves, the guard asked about the row as stored, the notes kept on a row, the time an event
entered its group, and the processing time reported after a hand-off."""

from __future__ import annotations

from datetime import timedelta

from handoff.messages.contract import HANDOFF_SUB_STATUS, MessageContent, MessageType, ResolutionStatus
from handoff.projection.rules import history_row, project
from handoff.storage import keys

from .projected import EVENT, T0, applied, message, stored


def test_the_history_row_keeps_the_message_as_received_with_its_place_and_time() -> None:
    m = message(
        MessageType.PendingHandoffResponse,
        "m-park",
        throttle_retry_count=2,
        input_notes=("ExpectedBy was not a date: kept without it.", "a second note"),
    )

    row = history_row(m, now=T0 + timedelta(seconds=3), sequence=4)

    assert (row.message_id, row.message_type, row.event_id) == (
        "m-park",
        MessageType.PendingHandoffResponse,
        EVENT,
    )
    assert row.message_content == m.body_text and row.pending_sub_status == HANDOFF_SUB_STATUS
    assert row.throttle_retry_count == 2 and row.sequence == 4
    assert row.recorded_at == T0 + timedelta(seconds=3)
    assert row.input_notes == "ExpectedBy was not a date: kept without it.\na second note"


def test_a_history_row_leaves_out_what_the_message_did_not_carry() -> None:
    m = message(MessageType.EventRequest, "m-request", body_text="", throttle_retry_count=0)

    row = history_row(m, now=T0, sequence=1)

    assert (row.message_content, row.pending_sub_status) == (None, None)
    assert (row.throttle_retry_count, row.input_notes) == (None, None)


def test_the_notes_a_message_came_with_are_kept_on_the_row_one_a_line() -> None:
    m = message(MessageType.PendingHandoffResponse, "m-park", input_notes=("first", "second"))

    assert applied(m).input_notes == "first\nsecond"
    assert applied(message(MessageType.EventRequest, "m-request")).input_notes is None


def test_a_skip_response_without_error_content_has_no_reason() -> None:
    skip = message(MessageType.SkipResponse, "m-skip", content=MessageContent(ErrorContent=None))

    assert applied(skip).reason is None


def test_a_dead_lettered_copy_of_a_request_is_written_over_a_settled_row() -> None:
    """Terminal over terminal is last-writer-wins: the guard holds back only non-terminal writes."""
    done = stored(applied(message(MessageType.ResolutionResponse, "m-done")))
    dead = message(MessageType.EventRequest, "m-request", at=5, dead_letter_error_description="expired")

    decision = project(dead, done, now=T0 + timedelta(seconds=6))

    assert decision.applied and decision.row is not None
    assert decision.row.resolution_status is ResolutionStatus.DeadLettered


def test_a_late_park_never_reopens_a_completed_row() -> None:
    done = stored(applied(message(MessageType.ResolutionResponse, "m-done")))

    decision = project(message(MessageType.PendingHandoffResponse, "m-park", at=5), done, now=T0)

    assert not decision.applied and decision.row is None


def test_a_copy_of_the_request_a_row_already_answers_is_refused() -> None:
    """A deferral answers the request it names as parent: a copy of that request arriving after it is
    stale, though a request may otherwise replace a deferred row."""
    request = stored(applied(message(MessageType.EventRequest, "m-request")))
    deferred = stored(
        applied(
            message(MessageType.DeferralResponse, "m-defer", at=2, parent_message_id="m-request"), request
        )
    )

    copy = project(message(MessageType.EventRequest, "m-request", at=1), deferred, now=T0)
    other = project(message(MessageType.EventRequest, "m-request-2", at=1), deferred, now=T0)

    assert not copy.applied and other.applied


def test_an_event_entering_another_group_takes_the_time_it_entered() -> None:
    pending = stored(applied(message(MessageType.EventRequest, "m-request")))
    later = T0 + timedelta(minutes=5)

    failed = applied(message(MessageType.ErrorResponse, "m-err", at=300), pending, now=later)

    assert failed.since_at == later and failed.since_key is None
    assert failed.listing_keys == [keys.bucket_row("Failed", later, EVENT)]


def test_a_response_at_the_instant_of_its_request_after_a_hand_off_took_no_time() -> None:
    request = stored(applied(message(MessageType.EventRequest, "m-request")))
    park = stored(applied(message(MessageType.PendingHandoffResponse, "m-park"), request), '"e2"')

    done = applied(message(MessageType.ResolutionResponse, "m-done"), park, now=T0)
    skewed = applied(message(MessageType.ResolutionResponse, "m-done"), park, now=T0 - timedelta(seconds=1))

    assert done.processing_time_ms == 0 and skewed.processing_time_ms == 0


def test_another_sessions_earlier_request_still_moves_the_request_time_back() -> None:
    """Refused (another session's message never replaces a park), but its bookkeeping is kept."""
    request = stored(applied(message(MessageType.EventRequest, "m-request", at=10)))
    park = stored(applied(message(MessageType.PendingHandoffResponse, "m-park", at=11), request), '"e2"')

    decision = project(
        message(MessageType.EventRequest, "m-other", at=4, session_id="s-2"),
        park,
        now=T0 + timedelta(seconds=12),
    )

    assert not decision.applied and decision.refusal is not None
    assert decision.request_enqueued_at == T0 + timedelta(seconds=4) and decision.handoff_seen
