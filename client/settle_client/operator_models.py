"""What the management API answers an operator: found events, an event with its allowed actions, the
202 of an action, a resolved settlement, poison messages, a record lookup, a bulk action.

Parsed like every answer (``extra="ignore"``, snake_case in Python, camelCase on the wire).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from settle_client.models import (
    AuditEntry,
    Event,
    Record,
    RecordPage,
    _ControlMessageAccepted,
    _EventSummary,
    _Wire,
)


class IdMatch(_Wire):
    """One id of a found hand-off that matched: its ``kind`` (``eventId``, ``sessionId``, ``messageId``,
    ``externalJobId``) and the whole ``value``."""

    kind: str
    value: str


class FoundEvent(_EventSummary):
    """One hand-off ``find`` matched; ``matched_by`` is the kind of id that matched (the first of
    ``matches``)."""

    enqueued_time_utc: datetime | None = None
    external_job_id: str | None = None
    matched_by: str | None = None
    matches: list[IdMatch] = Field(default_factory=list)


class FindAnswer(_Wire):
    items: list[FoundEvent]
    continuation_token: str | None = None


class Counts(_Wire):
    """Counts of an endpoint's events by status (``pending`` includes ``pending_handoff``)."""

    pending: int = 0
    pending_handoff: int = 0
    deferred: int = 0
    failed: int = 0
    dead_lettered: int = 0
    unsupported: int = 0
    completed: int = 0
    skipped: int = 0
    # counting an open status stopped at the server's cap (10,000): at least that many
    pending_at_least: bool = False
    pending_handoff_at_least: bool = False
    deferred_at_least: bool = False
    failed_at_least: bool = False
    dead_lettered_at_least: bool = False
    unsupported_at_least: bool = False


class EndpointSummary(_Wire):
    """One endpoint of the overview: its counts, oldest ages, poison and stuck settlements."""

    endpoint_id: str
    counts: Counts
    oldest_pending_at: datetime | None = None
    oldest_failed_at: datetime | None = None
    # not every Pending (Failed / DeadLettered) event was read: the oldest is at least as old as that
    oldest_pending_at_least: bool = False
    oldest_failed_at_least: bool = False
    poison: int = 0
    unconfirmed: int = 0
    overdue_handoffs: int = 0
    unconfirmed_at_least: bool = False  # counting stopped at ``unconfirmed`` (1,000): at least that many
    overdue_handoffs_at_least: bool = False
    oldest_poison_day: str | None = None


class EndpointsOverview(_Wire):
    items: list[EndpointSummary]
    unattributed_poison: int = 0
    unattributed_oldest_poison_day: str | None = None
    warnings: list[str] = Field(default_factory=list)


class EventSummary(_EventSummary):
    """One event of an endpoint's listing (newest change first)."""

    enqueued_time_utc: datetime | None = None
    external_job_id: str | None = None


class EventPage(_Wire):
    """A page of them; ``count``: how many are in the status asked for (only when it is the one filter;
    ``at_least``: counting stopped there)."""

    items: list[EventSummary]
    continuation_token: str | None = None
    count: int | None = None
    at_least: bool = False


class AuditSearchEntry(AuditEntry):
    endpoint_id: str
    event_id: str


class AuditSearchPage(_Wire):
    items: list[AuditSearchEntry]
    continuation_token: str | None = None


class OverdueHandoff(_Wire):
    event_id: str
    expected_by: datetime


class _IndexListing(_Wire):
    """A page of an endpoint's index rows; ``count`` counts them all (``at_least``: counting stopped
    there). Each listing names its items."""

    endpoint_id: str
    count: int
    at_least: bool = False
    items: list[Any]
    continuation_token: str | None = None


class OverdueHandoffs(_IndexListing):
    items: list[OverdueHandoff]


class StuckRecords(_Wire):
    """A page of them; ``count`` is this page's."""

    count: int
    items: list[Record]
    continuation_token: str | None = None


class SettlementView(_Wire):
    """The claim on the event's current message: a settlement or operator action in flight or done."""

    event_id: str
    addressed_message_id: str
    control_message_id: str
    message_type: str
    state: str
    settled_by: str | None = None
    claimed_at: datetime | None = None


class UnconfirmedSettlements(_IndexListing):
    items: list[SettlementView]


class OperatorEvent(Event):
    """An event as an operator sees it: ``actions`` that can succeed now, the ``event_json`` a plain
    resubmission sends, and the ``settlement`` claim that blocks other actions, if any."""

    actions: list[str] = Field(default_factory=list)
    event_json: str | None = None
    settlement: SettlementView | None = None


class _OperatorAct(_Wire):
    """What an operator's act on an event answers besides its outcome: the message it was addressed to,
    who acted, and the audit row it wrote."""

    addressed_message_id: str
    by: str
    audit: AuditEntry | None = None


class ActionAccepted(_OperatorAct, _ControlMessageAccepted):
    """202: the action's one control message is Settle's to deliver (``replayed``: a retry answered from
    the earlier action's claim)."""

    action: str


class SettlementResolved(_OperatorAct):
    endpoint_id: str
    event_id: str
    control_message_id: str | None = None
    state: str
    replayed: bool = False


class PoisonEntry(_Wire):
    """A resolver message stored in ``hopoison`` instead of projected, with its replay or dismissal."""

    day: str
    id: str
    reason: str
    endpoint_id: str | None = None
    message_id: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    delivery_count: int | None = None
    enqueued_time_utc: datetime | None = None
    recorded_at: datetime | None = None
    application_properties: Any = None
    message_content: str | None = None
    content_truncated: bool = False
    replayed_at: datetime | None = None
    replayed_by: str | None = None
    replay_outcome: str | None = None
    replay_detail: str | None = None
    replay_count: int = 0
    dismissed_at: datetime | None = None
    dismissed_by: str | None = None
    dismiss_reason: str | None = None


class PoisonPage(_Wire):
    day: str
    items: list[PoisonEntry]
    continuation_token: str | None = None


class ReplayAnswer(_Wire):
    outcome: str
    detail: str | None = None
    replayed: bool = True
    poison: PoisonEntry


class RecordLookup(_Wire):
    record: Record | None = None
    history: RecordPage


class BulkItem(_Wire):
    event_id: str
    status: int
    problem: str | None = None
    detail: str | None = None
    accepted: ActionAccepted | None = None


class BulkAnswer(_Wire):
    action: str
    accepted: int
    refused: int
    items: list[BulkItem]
