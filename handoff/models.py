"""HTTP models of the hand-off API (camelCase JSON; NimBus field names where NimBus has one)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from common.models import ApiModel, RequestModel, from_fields
from handoff.limits import MAX_ENDPOINT_ID, MAX_ID
from handoff.messages.contract import Coordinates
from handoff.storage.json_text import text_at
from handoff.storage.records import AuditRow, EventRow, HistoryRow

Text = Annotated[str, StringConstraints(min_length=1, max_length=1000)]
# Identifiers, bounded as README "Limits" documents (handoff/limits.py says why these maxima).
EndpointId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ENDPOINT_ID)]
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID)]
NonBlank = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=32_000)]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]

# ``next`` long-polls at most MAX_WAIT_SECONDS (handoff/functions.py, where the API's limits are checked).


class HandoffCoordinates(RequestModel):
    """The six coordinates of a parked event (NimBus ``HandoffSettlement``)."""

    event_id: Identifier
    session_id: Identifier | None = Field(
        default=None, description="Optional: taken from the event row when left out; 409 if it differs."
    )
    message_id: Identifier = Field(
        description="The parked message: the row's lastMessageId (or the request it answers)."
    )
    event_type_id: Identifier | None = None
    correlation_id: Identifier | None = None
    originating_message_id: Identifier | None = None

    def to_contract(self) -> Coordinates:
        return Coordinates.model_validate(self.model_dump())


LeaseToken = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=128)]
_LEASE_TOKEN = (
    "From a leased receive: the settlement is fenced by the lease (409 lease-lost when another agent holds "
    "the hand-off now). Without it, today's rules."
)


class SettleRequest(RequestModel):
    """What every settlement of a parked hand-off names: the hand-off, who settles it, under which lease."""

    endpoint_id: EndpointId
    coordinates: HandoffCoordinates
    settled_by: Name | None = None
    lease_token: LeaseToken | None = Field(default=None, description=_LEASE_TOKEN)


class CompleteHandoffRequest(SettleRequest):
    """Complete a parked hand-off: exactly one ``HandoffCompletedRequest`` is sent."""

    result: Any = Field(default=None, description="Any JSON; a string is sent verbatim as EventJson.")


class FailHandoffRequest(SettleRequest):
    """Fail a parked hand-off: exactly one ``HandoffFailedRequest`` is sent."""

    error_text: NonBlank
    error_type: Text | None = None


class CoordinatesView(ApiModel):
    event_id: str
    session_id: str | None
    message_id: str | None
    event_type_id: str | None
    correlation_id: str | None
    originating_message_id: str | None

    @classmethod
    def of(cls, row: EventRow) -> CoordinatesView:
        return from_fields(cls, row, message_id=row.last_message_id)


class SettlementAccepted(ApiModel):
    """202: Settle owns this settlement now; exactly one control message will reach the endpoint."""

    endpoint_id: str
    event_id: str
    message_type: str
    control_message_id: str
    parked_message_id: str
    settled_by: str
    transport: str
    confirmed: bool = Field(
        description="The broker acknowledged the message (or the resolver already projected it). False: the "
        "send's outcome is not known yet; followUp says what Settle does about it."
    )
    state: str = Field(
        description="The claim: sent (the broker acknowledged it), delivered (projected, or marked so), "
        "sending (the send's outcome is not known yet), unconfirmed (an operator must resolve it). "
        "Identical requests sent at once get the same state once the outcome is known."
    )
    replayed: bool = Field(description="True when this answers a retry of a settlement made before.")
    claimed_at: datetime
    follow_up: str | None = Field(
        default=None,
        description="Unconfirmed only: how Settle confirms or re-sends the message, or (no duplicate "
        "detection on the endpoint topics) that it never re-sends it, and where operators then see it "
        "(GET /api/v1/handoffs/{endpointId}/unconfirmed).",
    )


class LeaseView(ApiModel):
    """A lease on a parked hand-off: settle with its token, renew it while the work runs, or release it."""

    token: str
    expires_at: datetime
    lease_seconds: int
    leased_by: str | None = None


class LeaseRequest(RequestModel):
    event_id: Identifier
    lease_token: LeaseToken
    lease_seconds: int | None = Field(
        default=None, description="Renew only: whole seconds, 10 to 3600 (default 300)."
    )


class LeaseReleased(ApiModel):
    event_id: str
    released: bool


class UnconfirmedClaim(ApiModel):
    """A settlement Settle could neither confirm nor safely re-send: an operator must check the endpoint."""

    event_id: str
    parked_message_id: str
    control_message_id: str
    message_type: str
    settled_by: str
    claimed_at: datetime
    since: datetime


class UnconfirmedList(ApiModel):
    endpoint_id: str
    count: int
    items: list[UnconfirmedClaim]


class PendingHandoffView(ApiModel):
    """A parked event, for an agent (``next``) or a job lookup."""

    endpoint_id: str
    event_type_id: str | None
    payload: str | None = Field(description="The parked event's EventJson (the original event body).")
    coordinates: CoordinatesView
    handoff_reason: str | None
    external_job_id: str | None
    expected_by: datetime | None
    parked_at: datetime
    content_truncated: bool = Field(description="The parked body was too large to store whole.")

    @classmethod
    def of(cls, row: EventRow) -> PendingHandoffView:
        return from_fields(
            cls,
            row,
            payload=event_json(row.message_content),
            coordinates=CoordinatesView.of(row),
            parked_at=row.enqueued_time_utc,
        )


def event_json(message_content: str | None) -> str | None:
    content = _json(message_content)
    if isinstance(content, dict) and isinstance(content.get("EventContent"), dict):
        value = content["EventContent"].get("EventJson")
        return value if isinstance(value, str) else None
    return None


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


class HistoryEntry(ApiModel):
    """One projected message (NimBus ``MessageEntity``)."""

    message_id: str
    message_type: str
    event_type_id: str | None
    from_: str | None = Field(alias="from")
    to: str | None
    session_id: str | None
    correlation_id: str | None
    parent_message_id: str | None
    originating_message_id: str | None
    enqueued_time_utc: datetime
    recorded_at: datetime | None
    sequence: int | None
    message_content: Any
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    queue_time_ms: int | None
    processing_time_ms: int | None
    pending_sub_status: str | None
    handoff_reason: str | None
    external_job_id: str | None
    expected_by: datetime | None
    content_truncated: bool = Field(
        description="The stored copy of a long text was cut to fit Table Storage."
    )
    input_notes: str | None = Field(
        default=None, description="What Settle changed to store this message's headers (one note a line)."
    )

    @classmethod
    def of(cls, row: HistoryRow) -> HistoryEntry:
        return from_fields(
            cls, row, message_type=row.message_type.name, message_content=_json(row.message_content)
        )


class AuditEntry(ApiModel):
    """One audit row (NimBus ``MessageAuditEntity``), with the authenticated principal when there was one."""

    auditor_name: str
    audit_timestamp: datetime
    audit_type: str
    comment: str | None
    data: str | None
    principal_name: str | None
    principal_id: str | None
    access_denied: bool = Field(default=False, description="Refused: the principal lacked the operator role.")

    @classmethod
    def of(cls, row: AuditRow) -> AuditEntry:
        return from_fields(cls, row)


class EventView(ApiModel):
    """The event row (NimBus ``UnresolvedEvent``) with its history and audits."""

    endpoint_id: str
    event_id: str
    session_id: str | None
    correlation_id: str | None
    resolution_status: str
    pending_sub_status: str | None
    message_type: str
    last_message_id: str | None
    parent_message_id: str | None
    originating_message_id: str | None
    originating_from: str | None
    event_type_id: str | None
    to: str | None
    from_: str | None = Field(alias="from")
    endpoint_role: str
    reason: str | None
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    handoff_reason: str | None
    external_job_id: str | None
    expected_by: datetime | None
    retry_count: int | None
    retry_limit: int | None
    queue_time_ms: int | None
    processing_time_ms: int | None
    enqueued_time_utc: datetime
    updated_at: datetime
    message_content: Any
    content_truncated: bool
    input_notes: str | None = Field(
        default=None, description="What Settle changed to store the last message's headers (one a line)."
    )
    history: list[HistoryEntry]
    audits: list[AuditEntry]

    @classmethod
    def of(cls, row: EventRow, history: list[HistoryRow], audits: list[AuditRow]) -> EventView:
        return from_fields(
            cls,
            row,
            resolution_status=row.resolution_status.name,
            message_type=row.message_type.name,
            # Why it failed: the NimBus reason, else the error text of the message that failed it (as find).
            reason=row.reason or text_at(row.message_content, "ErrorContent", "ErrorText"),
            message_content=_json(row.message_content),
            history=[HistoryEntry.of(h) for h in history],
            audits=[AuditEntry.of(a) for a in audits],
        )


class LeasedHandoffView(PendingHandoffView):
    """A parked hand-off leased to the caller (leased receive)."""

    lease: LeaseView
