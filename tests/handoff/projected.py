"""One event's resolver messages and the rows ``handoff.projection.rules.project`` makes of them: the builders
the projection core's example tests share."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from handoff.messages.contract import InboundMessage, MessageContent, MessageType
from handoff.projection.rules import project
from handoff.storage.records import EventRow

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)
PK = "billing"
EVENT = "ev-1"


def message(kind: MessageType, message_id: str, *, at: int = 0, **fields: Any) -> InboundMessage:
    values: dict[str, Any] = {
        "message_id": message_id,
        "message_type": kind,
        "event_id": EVENT,
        "session_id": "s-1",
        "correlation_id": "corr-1",
        "to": "Billing",
        "from_": "Billing",
        "originating_from": None,
        "originating_message_id": "m-request",
        "parent_message_id": None,
        "event_type_id": "Billing.InvoiceCreated",
        "enqueued_time_utc": T0 + timedelta(seconds=at),
        "delivery_count": 1,
        "throttle_retry_count": 0,
        "retry_count": None,
        "retry_limit": None,
        "dead_letter_reason": None,
        "dead_letter_error_description": None,
        "queue_time_ms": None,
        "processing_time_ms": 40,
        "handoff_reason": None,
        "external_job_id": None,
        "expected_by": None,
        "content": MessageContent(),
        "body_text": json.dumps({"EventContent": None, "ErrorContent": None}),
    }
    values.update(fields)
    return InboundMessage(**values)


def applied(m: InboundMessage, current: EventRow | None = None, *, now: datetime = T0) -> EventRow:
    decision = project(m, current, now=now)
    assert decision.applied and decision.row is not None
    return decision.row


def stored(row: EventRow, etag: str = '"e1"') -> EventRow:
    return row.model_copy(update={"etag": etag})
