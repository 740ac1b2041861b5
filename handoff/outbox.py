"""The settlement outbox: what a claim holds, and what to do next with one. Pure: no I/O here.

A settlement claim is an outbox record. It is written (with its audit row) *before* the control message
is sent and holds the exact message, so that whatever happens to the send (refused, accepted, lost in
between, the process killed) Settle can finish the job later without guessing:

* ``sending``: written, the send not known to have succeeded (in progress, ambiguous, or never attempted);
* ``sent``: the broker acknowledged it;
* ``delivered``: the resolver projected it (its history row exists);
* ``unconfirmed``: not confirmed, and a re-send could reach the endpoint twice: operators must look;
* ``superseded``: the event moved on without it (an operator resubmitted or skipped it, a new park).

A claim whose message was (or may have been) sent is never taken over, and never deleted except after a
send that certainly reached nothing. A re-send is the identical message (same MessageId, body and
properties) and happens only when the endpoint topic's duplicate detection will drop it if the first copy
arrived: inside the detection window, measured from the claim.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage

# How long after the claim the reconciler first looks: a healthy send and its projection by the resolver
# take seconds; this leaves room for a slow resolver before anything is re-sent.
CONFIRM_AFTER = timedelta(minutes=2)
# A settling process sends only this soon after its claim. It bounds when the first copy can reach the
# broker, which the re-send rule below relies on (a process frozen longer gives the job to the reconciler).
SEND_DEADLINE = timedelta(seconds=60)
# Re-sends stop this long before the detection window (counted from the claim) ends. The deadline is
# checked immediately before each send, so the margin covers the send path's bounded worst case
# (``handoff.transport.SEND_WORST_CASE``, 25 s: link open budget + send timeout) plus clock error.
RESEND_MARGIN = timedelta(minutes=1)
# How often an unconfirmed claim is looked at again (it may still be confirmed by a late projection).
RECHECK_MIN = timedelta(minutes=5)
RECHECK_MAX = timedelta(hours=1)
# After a failed re-send or reconcile step.
RETRY_AFTER = timedelta(minutes=1)


class ClaimState(Enum):
    """Where one settlement's control message is (stored by name)."""

    sending = "sending"
    sent = "sent"
    delivered = "delivered"
    unconfirmed = "unconfirmed"
    superseded = "superseded"

    @property
    def open(self) -> bool:
        """Still followed by the reconciler."""
        return self in (ClaimState.sending, ClaimState.unconfirmed)


class Step(Enum):
    """What the reconciler does with one due claim."""

    DONE = "done"  # sent / delivered / superseded already: drop the reconcile row
    DELIVERED = "delivered"  # the resolver projected it
    SUPERSEDED = "superseded"  # the event moved on without it
    RESEND = "resend"  # identical copy, the broker will deduplicate it
    UNCONFIRMED = "unconfirmed"  # cannot confirm and cannot safely re-send
    WAIT = "wait"  # too early to judge


def can_resend(claimed_at: datetime, now: datetime, window: timedelta | None) -> bool:
    """A re-send is safe while every copy lands inside one duplicate-detection window.

    The first copy is sent within ``SEND_DEADLINE`` of the claim (or not at all), every re-send before
    ``claimed_at + window - RESEND_MARGIN``: all copies then arrive less than a window apart, so the topic
    keeps the first one that arrives and drops the others.
    """
    if window is None:
        return False
    return now - claimed_at < window - RESEND_MARGIN


def next_step(
    state: ClaimState,
    *,
    projected: bool,
    moved_on: bool,
    claimed_at: datetime,
    now: datetime,
    window: timedelta | None,
) -> Step:
    """The reconciler's decision for one claim (``projected``: its history row exists)."""
    if not state.open:
        return Step.DONE
    if projected:
        return Step.DELIVERED
    if moved_on:
        return Step.SUPERSEDED
    if now - claimed_at < CONFIRM_AFTER:
        return Step.WAIT
    if can_resend(claimed_at, now, window):
        return Step.RESEND
    return Step.UNCONFIRMED


def recheck_after(claimed_at: datetime, now: datetime) -> timedelta:
    """Back-off for an unconfirmed claim: half its age, between 5 minutes and an hour."""
    return min(max((now - claimed_at) / 2, RECHECK_MIN), RECHECK_MAX)


def follow_up_note(
    state: ClaimState, *, confirmed: bool, claimed_at: datetime, window: timedelta | None, endpoint_id: str
) -> str | None:
    """What an unconfirmed 202 leaves to Settle, and where operators see it if that fails (None: confirmed).

    Part of the answer so that a caller knows the residual without reading the docs: without duplicate
    detection an ambiguous send is never re-sent (a second copy could reach the endpoint).
    """
    if confirmed:
        return None
    listed = f"GET /api/v1/handoffs/{endpoint_id}/unconfirmed"
    if state is ClaimState.unconfirmed:
        return (
            "Settle could neither confirm this message nor re-send it safely; it is listed at "
            f"{listed}: an operator must check whether it reached the endpoint."
        )
    if window is None:
        return (
            "Not confirmed, and the endpoint topics have no duplicate detection "
            "(HANDOFF_DUPLICATE_DETECTION=false), so Settle never re-sends it (a second copy could reach "
            "the endpoint): it is confirmed when the resolver projects it; otherwise it is listed at "
            f"{listed} for an operator to check the endpoint."
        )
    until = (claimed_at + window - RESEND_MARGIN).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        "Not confirmed yet: Settle confirms it from the resolver's history or re-sends the identical message "
        f"(same MessageId: duplicate detection drops a second copy) until {until}; if it is still "
        f"unconfirmed then, it is listed at {listed} for an operator to check the endpoint."
    )


def request_digest(
    *,
    kind: str,
    endpoint_id: str,
    event_id: str,
    addressed_message_id: str,
    settled_by: str,
    principal_id: str | None,
    result_json: str | None,
    error_text: str | None,
    error_type: str | None,
) -> str:
    """Identity of one settlement request: a retry of it has the same digest, another request does not.

    Who asked is part of it: a second agent completing the same hand-off is another settlement (and is
    refused), the same caller retrying is the same one (and gets the same answer).
    """
    parts = [
        kind,
        endpoint_id,
        event_id,
        addressed_message_id,
        settled_by,
        principal_id,
        result_json,
        error_text,
        error_type,
    ]
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class OutboxMessage:
    """The exact control message, storable and re-sendable byte for byte."""

    message_id: str
    body: str
    session_id: str | None
    correlation_id: str | None
    properties: dict[str, Any]

    def to_service_bus(self) -> ServiceBusMessage:
        """A new SDK message (each send gets its own object: the SDK may annotate the one it sends)."""
        from azure.servicebus import ServiceBusMessage

        return ServiceBusMessage(
            self.body,
            message_id=self.message_id,
            session_id=self.session_id,
            correlation_id=self.correlation_id,
            application_properties=cast(Any, dict(self.properties)),
        )

    def properties_json(self) -> str:
        return json.dumps(self.properties, ensure_ascii=False, separators=(",", ":"))

    def envelope_json(self) -> str:
        """Everything but the body (kept in its own column, unescaped)."""
        return json.dumps(
            {
                "messageId": self.message_id,
                "sessionId": self.session_id,
                "correlationId": self.correlation_id,
                "properties": self.properties,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_stored(cls, envelope: str, body: str) -> OutboxMessage:
        data = json.loads(envelope)
        return cls(
            message_id=str(data["messageId"]),
            body=body,
            session_id=data.get("sessionId"),
            correlation_id=data.get("correlationId"),
            properties=dict(data.get("properties") or {}),
        )


AUDIT_DATA_LIMIT = 4000  # characters of JSON, as NimBus's WebApp writer caps ``Data``


def text_at(document: str | None, *path: str) -> str | None:
    """The string at ``path`` in the JSON ``document`` (an audit's ``Data``, a stored body); None when the
    document is absent or not JSON, a step is missing or not an object, or the value is not a string."""
    if not document:
        return None
    try:
        value: Any = json.loads(document)
    except ValueError:
        return None
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    return value if isinstance(value, str) else None


def bounded_json(fields: dict[str, Any], *, limit: int = AUDIT_DATA_LIMIT) -> str:
    """``fields`` as JSON text of at most ``limit`` characters: long strings are cut, never the JSON.

    The names of the fields that were cut are listed under ``truncated``.
    """
    data = dict(fields)
    cut: list[str] = []

    def text() -> str:
        shown = {**data, "truncated": cut} if cut else data
        return json.dumps(shown, ensure_ascii=False, separators=(",", ":"))

    out = text()
    while len(out) > limit:
        longest = max(
            (k for k, v in data.items() if isinstance(v, str) and v),
            key=lambda k: len(json.dumps(data[k], ensure_ascii=False)),
            default=None,
        )
        if longest is None:
            break  # only short scalars left (cannot happen with our fields)
        value = str(data[longest])
        excess = len(out) - limit
        # Remove about as many characters as the excess costs in JSON (escapes cost up to six each);
        # the loop takes care of an uneven spread.
        per_char = (len(json.dumps(value, ensure_ascii=False)) - 2) / len(value)
        remove = max(1, math.ceil(excess / per_char))
        data[longest] = value[: max(0, len(value) - remove)]
        if longest not in cut:
            cut.append(longest)
        out = text()
    return out
