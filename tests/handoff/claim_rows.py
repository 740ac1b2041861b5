"""Rows and orders of one parked hand-off, for the tests of the claim and resolution rules."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from handoff.messages.contract import MessageType, ResolutionStatus
from handoff.messages.outbound import OutboxMessage
from handoff.settlement import claims
from handoff.settlement.claims import ClaimOrder
from handoff.settlement.timing import CONFIRM_AFTER
from handoff.storage import keys
from handoff.storage.records import ClaimRow, EventRow

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)
PK = keys.partition("Billing")  # the endpoint's one partition (S = 1)
EVENT, PARKED = "ev-1", "park-1"
QUEUE_KEY = keys.queue_row(T0, EVENT)
CLAIM_KEY = keys.claim_row(EVENT, PARKED)


def parked(*, etag: str | None = '"e1"', queue_key: str | None = QUEUE_KEY) -> EventRow:
    return EventRow(
        updated_at=T0,
        enqueued_time_utc=T0,
        event_id=EVENT,
        resolution_status=ResolutionStatus.Pending,
        endpoint_id="Billing",
        message_type=MessageType.PendingHandoffResponse,
        last_message_id=PARKED,
        pending_sub_status="Handoff",
        queue_key=queue_key,
        etag=etag,
    )


def order(digest: str = "req-a", *, token: str | None = None, pins_event: bool = False) -> ClaimOrder:
    return ClaimOrder(
        kind=MessageType.HandoffCompletedRequest,
        endpoint_id="Billing",
        event_id=EVENT,
        addressed_message_id=PARKED,
        by="agent",
        audit_type="CompleteHandoff",
        digest=digest,
        marks_queue=not pins_event,
        lease_token=token,
        pins_event=pins_event,
    )


def message(message_id: str | None = None) -> OutboxMessage:
    ident = message_id or uuid.uuid4().hex
    return OutboxMessage(message_id=ident, body="{}", session_id=None, correlation_id=None, properties={})


def claim_row(**changes: object) -> ClaimRow:
    claim = claims.plan_claim(order(), parked(), message("ctl-1"), "{}", pk=PK, now=T0).claim
    return claim.model_copy(update={"etag": '"c1"', **changes})


def tracked_claim(**changes: object) -> ClaimRow:
    """A claim followed through a reconcile row of its own: an operator action's, or a settlement's written
    before ADR-0022 change 9 (or once the reconciler gave it a later look)."""
    reconcile_key = keys.reconcile_row(T0 + CONFIRM_AFTER, EVENT, PARKED)
    return claim_row(**{"reconcile_key": reconcile_key, **changes})
