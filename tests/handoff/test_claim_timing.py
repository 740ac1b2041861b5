"""A claim's timing rules (``handoff.settlement.timing``) and the request digest, without storage: when a
re-send is safe, what the reconciler does, the audit JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from handoff.messages.contract import Coordinates, MessageType, control_message, settlement_content
from handoff.messages.outbound import OutboxMessage
from handoff.settlement.claims import request_digest
from handoff.settlement.timing import (
    CONFIRM_AFTER,
    RESEND_MARGIN,
    Step,
    can_resend,
    follow_up_note,
    next_step,
    recheck_after,
)
from handoff.storage.claim_state import ClaimState
from handoff.storage.json_text import bounded_json

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=10)


def test_a_resend_is_safe_only_inside_the_duplicate_detection_window():
    assert can_resend(T0, T0 + timedelta(minutes=3), WINDOW)
    assert can_resend(T0, T0 + WINDOW - RESEND_MARGIN - timedelta(seconds=1), WINDOW)
    assert not can_resend(T0, T0 + WINDOW - RESEND_MARGIN, WINDOW)
    assert not can_resend(T0, T0 + timedelta(minutes=3), None)  # no duplicate detection: never


@pytest.mark.parametrize(
    ("state", "projected", "moved_on", "age", "window", "step"),
    [
        (ClaimState.sent, False, False, 30, WINDOW, Step.DONE),
        (ClaimState.delivered, False, False, 30, WINDOW, Step.DONE),
        (ClaimState.superseded, False, True, 30, WINDOW, Step.DONE),
        (ClaimState.sending, True, True, 3, WINDOW, Step.DELIVERED),
        (ClaimState.unconfirmed, True, True, 90, None, Step.DELIVERED),
        (ClaimState.sending, False, True, 3, WINDOW, Step.SUPERSEDED),
        (ClaimState.sending, False, False, 1, WINDOW, Step.WAIT),
        (ClaimState.sending, False, False, 3, WINDOW, Step.RESEND),
        (ClaimState.sending, False, False, 3, None, Step.UNCONFIRMED),
        (ClaimState.sending, False, False, 9.5, WINDOW, Step.UNCONFIRMED),
        (ClaimState.unconfirmed, False, False, 60, WINDOW, Step.UNCONFIRMED),
    ],
)
def test_the_reconciler_s_decision(state, projected, moved_on, age, window, step):
    now = T0 + timedelta(minutes=age)
    got = next_step(state, projected=projected, moved_on=moved_on, claimed_at=T0, now=now, window=window)
    assert got is step


def test_the_follow_up_note_names_what_settle_does_and_where_operators_look():
    def note(state: ClaimState, window: timedelta | None, *, confirmed: bool = False) -> str | None:
        return follow_up_note(state, confirmed=confirmed, claimed_at=T0, window=window, endpoint_id="Billing")

    assert note(ClaimState.sent, WINDOW, confirmed=True) is None
    resend = note(ClaimState.sending, WINDOW)
    assert resend is not None and "until 2026-11-30T09:09:00Z" in resend
    residual = note(ClaimState.sending, None)
    assert residual is not None and "never re-sends" in residual
    shown = note(ClaimState.unconfirmed, WINDOW)
    assert shown is not None and "operator must check" in shown
    for text in (resend, residual, shown):
        assert "GET /api/v1/handoffs/Billing/unconfirmed" in text


def test_an_unconfirmed_claim_is_looked_at_less_and_less_often():
    assert recheck_after(T0, T0 + CONFIRM_AFTER) == timedelta(minutes=5)
    assert recheck_after(T0, T0 + timedelta(minutes=40)) == timedelta(minutes=20)
    assert recheck_after(T0, T0 + timedelta(days=3)) == timedelta(hours=1)


def _digest(**overrides: object) -> str:
    fields: dict[str, object] = {
        "kind": "HandoffCompletedRequest",
        "endpoint_id": "Billing",
        "event_id": "evt-1",
        "addressed_message_id": "park-1",
        "settled_by": "erp-checker",
        "principal_id": None,
        "result_json": '{"rows":3}',
        "error_text": None,
        "error_type": None,
    }
    fields.update(overrides)
    return request_digest(**fields)  # type: ignore[arg-type]


def test_the_request_digest_names_one_settlement_request():
    assert _digest() == _digest()
    for change in (
        {"kind": "HandoffFailedRequest"},
        {"result_json": '{"rows":4}'},
        {"settled_by": "another-agent"},
        {"principal_id": "someone"},
        {"addressed_message_id": "park-2"},
        {"event_id": "evt-2"},
    ):
        assert _digest(**change) != _digest(), change


def test_the_outbox_message_round_trips_to_the_same_wire_message():
    coords = Coordinates(
        event_id="evt-1", session_id="s-1", message_id="park-1", correlation_id="c-1", event_type_id="T"
    )
    content = settlement_content(MessageType.HandoffCompletedRequest, coords, result_json='{"é":"\\u0001"}')
    original = control_message(MessageType.HandoffCompletedRequest, "Billing", coords, content)
    stored = OutboxMessage.from_stored(original.envelope_json(), original.body)
    assert stored == original
    a, b = original.to_service_bus(), stored.to_service_bus()
    assert b"".join(a.body) == b"".join(b.body)
    assert a.application_properties == b.application_properties
    assert (a.application_properties or {})["RetryCount"] == 0  # an int stays an int
    assert (a.message_id, a.session_id, a.correlation_id) == (b.message_id, b.session_id, b.correlation_id)


def test_each_control_message_gets_its_own_message_id():
    coords = Coordinates(event_id="evt-1", message_id="park-1")
    content = settlement_content(MessageType.HandoffFailedRequest, coords, error_text="no")
    ids = {
        control_message(MessageType.HandoffFailedRequest, "Billing", coords, content).message_id
        for _ in range(5)
    }
    assert len(ids) == 5


@pytest.mark.parametrize("text", ["x" * 10_000, '"\\' * 5_000, "\u0001" * 3_000, "😀" * 5_000])
def test_bounded_json_cuts_fields_never_the_json(text):
    out = bounded_json({"controlMessageId": "id-1", "result": text, "errorText": None})
    assert len(out) <= 4000
    data = json.loads(out)
    assert data["controlMessageId"] == "id-1" and data["truncated"] == ["result"]
    assert text.startswith(data["result"]) and data["result"]


def test_bounded_json_leaves_small_data_alone():
    assert json.loads(bounded_json({"a": "b", "n": None})) == {"a": "b", "n": None}
