"""HTTP models of the management API (camelCase JSON; NimBus names where NimBus has one)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import Field, StringConstraints

from common.models import ApiModel, RequestModel, from_fields
from handoff.limits import MAX_ID
from handoff.models import AuditEntry, EventView
from handoff.storage.overview import OPEN_COUNT_CAP
from handoff.storage.records import EventRow, ListingRow, PoisonRow
from state.schemas import Record, RecordPage

if TYPE_CHECKING:
    from handoff.settlement.settler import Settled

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]
Reason = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4000)]
NonBlank = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=32_000)]
EventJson = Annotated[str, StringConstraints(min_length=1, max_length=240_000)]


_OPEN_AT_LEAST = (
    f"True: counting `{{}}` stopped at {OPEN_COUNT_CAP:,} (the open statuses' rows are read up to that many "
    "each); at least that many."
)


def _open_at_least(count: str) -> Any:
    return Field(default=False, description=_OPEN_AT_LEAST.format(count))


class Counts(ApiModel):
    """Counts of an endpoint's events by status (``pending`` includes ``pendingHandoff``); an open status's
    count stops at its cap and then says ``…AtLeast: true`` (Completed and Skipped are exact)."""

    pending: int
    pending_handoff: int
    deferred: int
    failed: int
    dead_lettered: int
    unsupported: int
    completed: int
    skipped: int
    pending_at_least: bool = _open_at_least("pending")
    pending_handoff_at_least: bool = Field(
        default=False,
        description=f"True: counting `pending` stopped at {OPEN_COUNT_CAP:,}, and `pendingHandoff` counts "
        "the hand-offs among the Pending events read; at least that many.",
    )
    deferred_at_least: bool = _open_at_least("deferred")
    failed_at_least: bool = _open_at_least("failed")
    dead_lettered_at_least: bool = _open_at_least("deadLettered")
    unsupported_at_least: bool = _open_at_least("unsupported")


class EndpointSummary(ApiModel):
    endpoint_id: str
    counts: Counts
    oldest_pending_at: datetime | None = Field(
        description="When the oldest open Pending event became Pending."
    )
    oldest_failed_at: datetime | None = Field(
        description="When the oldest Failed / DeadLettered event failed."
    )
    poison: int = Field(description="Poison messages naming this endpoint that were not replayed.")
    unconfirmed: int = Field(
        default=0, description="Settlements Settle could neither confirm nor re-send safely (resolve them)."
    )
    overdue_handoffs: int = Field(default=0, description="Parked hand-offs past their ExpectedBy.")
    unconfirmed_at_least: bool = Field(
        default=False, description="True: counting `unconfirmed` stopped at 1,000; at least that many."
    )
    overdue_handoffs_at_least: bool = Field(
        default=False, description="True: counting `overdueHandoffs` stopped at 1,000; at least that many."
    )
    oldest_pending_at_least: bool = Field(
        default=False,
        description="True: `pendingAtLeast` (not every Pending event was read): `oldestPendingAt` is the "
        "oldest of those read (the most recently changed); the oldest Pending event is at least that old.",
    )
    oldest_failed_at_least: bool = Field(
        default=False,
        description="True: `failedAtLeast` or `deadLetteredAtLeast`: `oldestFailedAt` is the oldest of those "
        "read; the oldest Failed / DeadLettered event is at least that old.",
    )
    oldest_poison_day: str | None = Field(
        default=None, description="UTC day (YYYYMMDD) of the oldest of those: GET v1/poison?day= lists it."
    )


class EndpointsOverview(ApiModel):
    items: list[EndpointSummary]
    unattributed_poison: int = Field(description="Poison messages that name no endpoint, not replayed.")
    unattributed_oldest_poison_day: str | None = Field(
        default=None, description="UTC day (YYYYMMDD) of the oldest of those."
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="A partition near its budget (more shards needed), a shard setting the layout overrides.",
    )


class EventSummary(ApiModel):
    endpoint_id: str
    event_id: str
    event_type_id: str | None
    resolution_status: str
    pending_sub_status: str | None
    message_type: str
    last_message_id: str | None
    session_id: str | None
    updated_at: datetime
    enqueued_time_utc: datetime
    reason: str | None
    external_job_id: str | None

    @classmethod
    def of(cls, endpoint_id: str, row: ListingRow | EventRow, *, reason: str | None = None) -> Self:
        """An event's summary from its listing row or its event row (the columns they share); ``reason``
        overrides the row's when given (find names the error text of a row without a reason)."""
        return from_fields(
            cls,
            row,
            endpoint_id=endpoint_id,
            resolution_status=row.resolution_status.name,
            message_type=row.message_type.name,
            reason=reason if reason is not None else row.reason,
        )


class EventPage(ApiModel):
    items: list[EventSummary]
    continuation_token: str | None
    count: int | None = Field(
        default=None,
        description="How many of the endpoint's events are in `status`: the overview's count (an open "
        f"status: its events' listing rows counted, keys only, up to {OPEN_COUNT_CAP:,}; Completed or "
        "Skipped: the counts snapshot and the deltas written since). Only when `status` is the only filter "
        "(a type or time filter narrows the listing, not the count), and on the first page.",
    )
    at_least: bool = Field(
        default=False,
        description=f"True: counting `count` stopped at {OPEN_COUNT_CAP:,} (an open status); at least that "
        "many.",
    )


class SettlementView(ApiModel):
    """The claim on the event's current message: a settlement or operator action in flight or done."""

    event_id: str
    addressed_message_id: str
    control_message_id: str
    message_type: str
    state: str = Field(description="sending, sent, delivered, unconfirmed, superseded.")
    settled_by: str
    claimed_at: datetime


class OperatorEventView(EventView):
    """The event with what an operator may do with it and the payload a resubmission would send."""

    actions: list[str] = Field(
        description="Only what can succeed now: complete, fail (a parked hand-off), resubmit, skip; or, for "
        "an unconfirmed settlement, mark-delivered and release."
    )
    event_json: str | None = Field(description="The EventJson a plain resubmission sends.")
    settlement: SettlementView | None = Field(
        default=None, description="The claim on the current message, if any (what blocks other actions)."
    )


AddressedMessage = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_ID)]
_ADDRESSED = (
    "The message this action addresses (the failed / parked message the operator saw; NimBus's WebApp route "
    "carries it): a retry of the same action on it is answered from its claim, whatever the event did "
    "since; another message than the event's current one that was never acted on is 409. Without it, the "
    "event's current message."
)


class ResubmitRequest(RequestModel):
    message_id: AddressedMessage | None = Field(default=None, description=_ADDRESSED)
    event_json: EventJson | None = Field(
        default=None, description="Resubmit with changes: the edited EventJson (JSON as text)."
    )
    reason: Reason | None = None
    by: Name | None = Field(default=None, description="Who, when no principal is signed in (local runs).")


class SkipRequest(RequestModel):
    message_id: AddressedMessage | None = Field(default=None, description=_ADDRESSED)
    reason: Reason | None = None
    by: Name | None = None


class CompleteRequest(RequestModel):
    message_id: AddressedMessage | None = Field(default=None, description=_ADDRESSED)
    result: Any = Field(default=None, description="Any JSON; a string is sent verbatim as EventJson.")
    by: Name | None = None


class FailRequest(RequestModel):
    message_id: AddressedMessage | None = Field(default=None, description=_ADDRESSED)
    error_text: NonBlank
    error_type: Name | None = None
    by: Name | None = None


class ResolveSettlementRequest(RequestModel):
    """An operator's way out of an unconfirmed settlement (audited ``ResolveSettlement``)."""

    message_id: AddressedMessage = Field(description="The message the settlement addressed (its claim).")
    control_message_id: AddressedMessage | None = Field(
        default=None,
        description="The control message the operator checked (refused if the claim holds another).",
    )
    resolution: Literal["delivered", "released"] = Field(
        description="delivered: the endpoint got it (checked); released: it did not, settle it again."
    )
    reason: Reason
    by: Name | None = None


class SettlementResolved(ApiModel):
    endpoint_id: str
    event_id: str
    addressed_message_id: str
    control_message_id: str | None
    state: str = Field(description="delivered or released.")
    replayed: bool = Field(description="True when this resolution was already done (a retry).")
    by: str
    audit: AuditEntry | None


_COUNT = "How many there are in all, counted on their index rows (keys only), up to 1,000."
_AT_LEAST = "True: counting stopped at 1,000; at least `count` match."
_MORE = "More follow: send it back for the next page (none: this page is the last)."


class IndexListing(ApiModel):
    """A page of an endpoint's index rows and the count of them all; each listing names its items."""

    endpoint_id: str
    count: int = Field(description=_COUNT)
    at_least: bool = Field(default=False, description=_AT_LEAST)
    items: list[Any]
    continuation_token: str | None = Field(default=None, description=_MORE)


class UnconfirmedSettlements(IndexListing):
    items: list[SettlementView]


class OverdueHandoff(ApiModel):
    event_id: str
    expected_by: datetime


class OverdueHandoffs(IndexListing):
    items: list[OverdueHandoff]


class ReplayRequest(RequestModel):
    by: Name | None = None
    message_content: EventJson | None = Field(
        default=None, description="Edit-and-replay: the body to replay instead of the stored one (text)."
    )
    application_properties: dict[str, Any] | None = Field(
        default=None, description="Edit-and-replay: the application properties to replay with (whole)."
    )


class DismissRequest(RequestModel):
    reason: Reason = Field(description="Why no fix will ever project it (kept on the row and in the audit).")
    by: Name | None = None


class ActionAccepted(ApiModel):
    """202: the control message is Settle's to deliver, exactly once (the settlement outbox)."""

    action: str
    endpoint_id: str
    event_id: str
    message_type: str
    control_message_id: str
    addressed_message_id: str
    by: str
    transport: str
    confirmed: bool
    state: str
    replayed: bool
    claimed_at: datetime
    audit: AuditEntry | None

    @classmethod
    def of(cls, action: str, accepted: Settled, audit: AuditEntry | None) -> ActionAccepted:
        return from_fields(
            cls,
            accepted,
            action=action,
            addressed_message_id=accepted.parked_message_id,
            by=accepted.settled_by,
            audit=audit,
        )


class PoisonEntry(ApiModel):
    day: str
    id: str
    reason: str
    endpoint_id: str | None
    message_id: str | None
    session_id: str | None
    correlation_id: str | None
    delivery_count: int | None
    enqueued_time_utc: datetime
    recorded_at: datetime
    application_properties: Any
    message_content: str | None
    message_content_base64: str | None
    content_truncated: bool
    replayed_at: datetime | None
    replayed_by: str | None
    replay_outcome: str | None
    replay_detail: str | None
    replay_count: int
    dismissed_at: datetime | None = None
    dismissed_by: str | None = None
    dismiss_reason: str | None = None

    @classmethod
    def of(cls, day: str, row: PoisonRow) -> PoisonEntry:

        try:
            props: Any = json.loads(row.application_properties)
        except ValueError:
            props = row.application_properties
        return from_fields(
            cls,
            row,
            day=day,
            id=row.row_key or "",
            application_properties=props,
            replay_detail=row.replay_detail or None,
        )


class PoisonPage(ApiModel):
    day: str
    items: list[PoisonEntry]
    continuation_token: str | None


class ReplayAnswer(ApiModel):
    outcome: str = Field(description="applied, refused, duplicate (projected before) or poisoned (again).")
    detail: str | None = Field(description="Why it was poisoned again.")
    replayed: bool = Field(description="False: another replay recorded first; this is its outcome.")
    poison: PoisonEntry


class RecordLookup(ApiModel):
    record: Record | None
    history: RecordPage


class StuckRecords(ApiModel):
    count: int = Field(description="Records on this page (a count of them all would read every head).")
    items: list[Record]
    continuation_token: str | None = Field(default=None, description=_MORE)


class BulkRequest(RequestModel):
    action: Literal["resubmit", "skip"]
    event_ids: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID)]] = Field(
        min_length=1,
        max_length=50,
        description="At most 50 per call; the console sends a selection in chunks.",
    )
    message_ids: (
        dict[Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID)], AddressedMessage] | None
    ) = Field(
        default=None,
        max_length=50,
        description="Per event id, the message the operator saw (its last message): the event's action "
        "addresses it as a single action's `messageId` does, so a repeated bulk call is answered from each "
        "event's claim whatever the event did since. An event without an entry addresses its current "
        "message.",
    )
    reason: Reason | None = None
    by: Name | None = None


class BulkItemAnswer(ApiModel):
    event_id: str
    status: int = Field(description="202 accepted (or answered from its claim), else the problem's status.")
    problem: str | None = Field(default=None, description="The problem's slug when refused or failed.")
    detail: str | None = None
    accepted: ActionAccepted | None = None


class BulkAnswer(ApiModel):
    action: str
    accepted: int
    refused: int
    items: list[BulkItemAnswer]


class AuditSearchEntry(AuditEntry):
    endpoint_id: str
    event_id: str


class AuditSearchPage(ApiModel):
    items: list[AuditSearchEntry]
    continuation_token: str | None


class IdMatch(ApiModel):
    """What an id found: its kind and the id as the hand-off carries it (the search ignores case)."""

    kind: Literal["eventId", "sessionId", "messageId", "externalJobId"]
    value: str


class FoundEvent(EventSummary):
    matched_by: str | None = Field(
        default=None, description="The kind of id that matched (the first of ``matches``); none in listings."
    )
    matches: list[IdMatch] = Field(
        default_factory=list, description="Every id of this hand-off that matched."
    )


class FindAnswer(ApiModel):
    items: list[FoundEvent]
    continuation_token: str | None = Field(
        default=None, description="More match: send it back for the next page (none: this page is the last)."
    )
