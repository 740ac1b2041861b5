"""The projection of a resolver message (``handoff.projection.rules``) without storage: the transaction it
writes, what a refusal of it means, and the stale-write guard over any order of late copies."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from common.transactions import Refusal
from handoff.messages.contract import InboundMessage, MessageContent, MessageType, ResolutionStatus
from handoff.projection.rules import (
    ProjectionRefused,
    plan_projection,
    project,
    projection_refused,
)
from handoff.storage import keys
from handoff.storage.records import EventRow
from tests.support.examples import examples

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)
PK = "billing"
EVENT = "ev-1"
SETTLED = frozenset({ResolutionStatus.Completed, ResolutionStatus.Skipped})
# Late copies: what fan-out lag or a rescheduled redelivery brings after the outcome.
LATE = frozenset({MessageType.EventRequest, MessageType.DeferralResponse, MessageType.PendingHandoffResponse})


def inbound(kind: MessageType, message_id: str, *, parent: str | None = None, at: int = 0) -> InboundMessage:
    return InboundMessage(
        message_id=message_id,
        message_type=kind,
        event_id=EVENT,
        session_id="s-1",
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
        dead_letter_error_description=None,
        queue_time_ms=None,
        processing_time_ms=None,
        handoff_reason=None,
        external_job_id=None,
        expected_by=None,
        content=MessageContent(),
        body_text=json.dumps({"EventContent": None, "ErrorContent": None}),
    )


def stored(row: EventRow | None, etag: str) -> EventRow | None:
    return None if row is None else row.model_copy(update={"etag": etag})


def test_the_first_message_inserts_its_history_first_then_the_event_row_and_its_index_rows() -> None:
    m = inbound(MessageType.PendingHandoffResponse, "m-park", parent="m-request")
    decision = project(m, None, now=T0)

    ops = plan_projection(PK, m, None, decision, now=T0)

    assert decision.applied and decision.row is not None
    assert ops[0][0] == "create" and ops[0][1]["RowKey"] == keys.history_row(EVENT, "m-park")
    assert ops[1][0] == "create" and ops[1][1]["RowKey"] == keys.event_row(EVENT)
    written = {str(op[1]["RowKey"]) for op in ops}
    assert decision.row.queue_key in written  # parked: the agents' queue row comes with it
    assert all(op[0] == "create" for op in ops)  # nothing there yet: insert-only


def test_a_later_message_replaces_the_event_row_as_read_and_moves_its_index_rows() -> None:
    parked = project(inbound(MessageType.PendingHandoffResponse, "m-park"), None, now=T0).row
    current = stored(parked, '"e1"')
    assert current is not None and current.queue_key is not None
    m = inbound(MessageType.ResolutionResponse, "m-done", parent="m-request", at=5)
    decision = project(m, current, now=T0)

    ops = plan_projection(PK, m, current, decision, now=T0)

    assert ops[1][0] == "update" and ops[1][2]["etag"] == '"e1"'
    assert ("delete", current.queue_key) in [(op[0], op[1]["RowKey"]) for op in ops]


def test_a_stale_copy_is_kept_in_the_history_with_a_comment_and_only_bookkeeping_moves() -> None:
    done = stored(project(inbound(MessageType.ResolutionResponse, "m-done"), None, now=T0).row, '"e2"')
    late = inbound(MessageType.EventRequest, "m-request", at=-5)
    decision = project(late, done, now=T0)

    ops = plan_projection(PK, late, done, decision, now=T0)

    assert not decision.applied
    assert [op[0] for op in ops] == ["create", "create", "update"]
    assert ops[1][1]["AuditType"] == "Comment" and "Ignored stale EventRequest" in ops[1][1]["Data"]
    assert ops[2][2]["etag"] == '"e2"' and "ResolutionStatus" not in ops[2][1]


def test_a_retry_request_is_audited_in_the_same_transaction() -> None:
    current = stored(project(inbound(MessageType.ErrorResponse, "m-err"), None, now=T0).row, '"e3"')
    m = inbound(MessageType.RetryRequest, "m-retry", at=5)

    ops = plan_projection(PK, m, current, project(m, current, now=T0), now=T0)

    assert ops[-1][0] == "create" and ops[-1][1]["AuditType"] == "Retry"


def test_what_a_refused_projection_means() -> None:
    assert projection_refused(Refusal(index=0, status=409, code="")) is ProjectionRefused.DUPLICATE
    assert projection_refused(Refusal(index=1, status=412, code="")) is ProjectionRefused.RACED
    assert projection_refused(Refusal(index=3, status=409, code="")) is ProjectionRefused.RACED
    gone = Refusal(index=2, status=404, code="ResourceNotFound")
    assert projection_refused(gone) is ProjectionRefused.RACED
    assert projection_refused(None) is ProjectionRefused.OTHER


KINDS = st.sampled_from(
    [
        MessageType.EventRequest,
        MessageType.DeferralResponse,
        MessageType.PendingHandoffResponse,
        MessageType.ResolutionResponse,
        MessageType.SkipResponse,
        MessageType.ErrorResponse,
        MessageType.UnsupportedResponse,
    ]
)
# A message: its type, which of a few ids it carries (so copies and answers repeat), what it answers.
MESSAGE = st.tuples(KINDS, st.integers(0, 4), st.none() | st.integers(0, 4), st.integers(-30, 30))
MESSAGES = st.lists(MESSAGE, min_size=1, max_size=25)


@settings(max_examples=examples(300), deadline=None)
@given(MESSAGES)
def test_a_late_copy_never_turns_a_settled_row_back_to_pending(
    messages: list[tuple[MessageType, int, int | None, int]],
) -> None:
    current: EventRow | None = None
    for n, (kind, ident, parent, at) in enumerate(messages):
        m = inbound(kind, f"m-{ident}", parent=None if parent is None else f"m-{parent}", at=at)
        decision = project(m, current, now=T0 + timedelta(seconds=n))
        plan_projection(PK, m, current, decision, now=T0)  # every decision can be written
        before = current
        if decision.applied:
            current = stored(decision.row, f'"e{n}"')
        assert current is not None
        if before is None:
            continue
        if before.resolution_status in SETTLED and kind in LATE:
            assert not decision.applied, f"{kind.name} re-opened a {before.resolution_status.name} row"
            assert current.resolution_status is before.resolution_status
        if before.parent_message_id == m.message_id and kind in LATE:
            assert not decision.applied, f"{kind.name} {m.message_id} came after the response that answers it"
        if before.resolution_status is not ResolutionStatus.Pending and kind is MessageType.EventRequest:
            assert not decision.applied or before.resolution_status is ResolutionStatus.Deferred
