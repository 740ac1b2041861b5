"""The operator's rules, pure: what an action may do to an event in which state, what an action sends and
audits, what a settlement resolution records, which events a bulk action selects, when a listing is
counted, and when a poison message may be replayed or dismissed.

Nothing here reads or writes storage, reads the clock or sends: the services (:mod:`management.actions`,
:mod:`management.poison`, :mod:`management.reads`) read rows, ask these functions and act on the answer.
Each rule has an example test named after it in ``tests/operator/test_operator_rules.py``.

NimBus's rules (``reference/nimbus-contract.md`` §1.5, the WebApp's buttons) decide what each action
may act on; a refusal is a :class:`common.errors.Conflict` (409) naming the event's state.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from common.clock import iso
from common.errors import Conflict, InvalidInput, PayloadTooLarge
from common.principal import Actor
from handoff.messages.contract import Coordinates, EventPart, MessageContent, MessageType, ResolutionStatus
from handoff.messages.transport import MAX_SEND_BYTES
from handoff.projection.resolver import Outcome
from handoff.settlement.claims import request_digest
from handoff.storage.claim_state import ClaimState
from handoff.storage.json_text import bounded_json
from handoff.storage.records import ClaimRow, EventRow, HistoryRow, PoisonRow

# -- what an action may act on --------------------------------------------------------------------

RESUBMIT = "Resubmit"
RESUBMIT_WITH_CHANGES = "ResubmitWithChanges"
SKIP = "Skip"

RESUBMITTABLE = frozenset(
    {
        ResolutionStatus.Failed,
        ResolutionStatus.DeadLettered,
        ResolutionStatus.Unsupported,
        ResolutionStatus.Completed,
    }
)
SKIPPABLE = frozenset(
    {
        ResolutionStatus.Failed,
        ResolutionStatus.DeadLettered,
        ResolutionStatus.Unsupported,
        ResolutionStatus.Deferred,
    }
)
# Messages whose EventJson is the event to resubmit (NimBus ``GetLatestEventRequestMessage`` and the
# WebApp's sourcing: the original request, or a later resubmission / retry / continuation).
PAYLOAD_SOURCES = frozenset(
    {
        MessageType.EventRequest,
        MessageType.ResubmissionRequest,
        MessageType.RetryRequest,
        MessageType.ContinuationRequest,
    }
)

# What each action on an event sends, and the statuses that allow it.
ASKS = {
    RESUBMIT: (MessageType.ResubmissionRequest, RESUBMITTABLE),
    RESUBMIT_WITH_CHANGES: (MessageType.ResubmissionRequest, RESUBMITTABLE),
    SKIP: (MessageType.SkipRequest, SKIPPABLE),
}


def resubmit_action(event_json: str | None) -> str:
    """A resubmit with an edited payload is audited apart from a resubmit as is."""
    return RESUBMIT_WITH_CHANGES if event_json is not None else RESUBMIT


def settle_audit_type(kind: MessageType) -> str:
    """The audit of an operator's settlement of a parked hand-off: ``CompleteHandoff`` or ``FailHandoff``."""
    return "CompleteHandoff" if kind is MessageType.HandoffCompletedRequest else "FailHandoff"


def allows(row: EventRow, states: frozenset[ResolutionStatus]) -> bool:
    """NimBus's rule for resubmit / skip; a parked hand-off (Pending + Handoff) allows both (FR-042)."""
    return row.resolution_status in states or row.is_pending_handoff


def allowed_actions(row: EventRow) -> list[str]:
    """What the console offers for this row (by the event's state; an open claim is checked apart)."""
    actions: list[str] = []
    if row.is_pending_handoff:
        actions += ["complete", "fail"]
    if allows(row, RESUBMITTABLE):
        actions.append("resubmit")
    if allows(row, SKIPPABLE):
        actions.append("skip")
    return actions


def offered_actions(row: EventRow, claim: ClaimRow | None) -> list[str]:
    """What can succeed now: with a claim open on the row's current message every action would be 409, so
    only an unconfirmed claim's resolutions are offered (``mark-delivered``, ``release``)."""
    if claim is None or claim.state is ClaimState.superseded:
        return allowed_actions(row)
    if claim.state is ClaimState.unconfirmed:
        return ["mark-delivered", "release"]
    return []


def not_allowed(row: EventRow, action: str, allowed_states: frozenset[ResolutionStatus]) -> Conflict:
    """The refusal of an action the event's state does not allow: it names the state and what is needed."""
    names = ", ".join(sorted(s.name for s in allowed_states))
    shown = row.resolution_status.name + (f" + {row.pending_sub_status}" if row.pending_sub_status else "")
    return Conflict(
        f"{action} is not allowed for event {row.event_id!r}: it is {shown} ({action} needs {names}).",
        field="eventId",
    )


def stale_address(row: EventRow, message_id: str, action: str) -> Conflict | None:
    """An action addressed to a message that is not the event's current one (and was never acted on) is
    refused, naming the current one; None: the message is the current one."""
    if message_id == row.last_message_id:
        return None
    return Conflict(
        f"messageId {message_id!r} is not the current message of event {row.event_id!r} "
        f"(that is {row.last_message_id!r}) and no {action} of it was made: look at the event again.",
        field="messageId",
    )


# -- the payload a resubmit sends ------------------------------------------------------------------


def payload_of(history: list[HistoryRow], row: EventRow) -> tuple[str | None, str | None]:
    """(EventTypeId, EventJson) to resubmit: the latest request message carrying EventJson, else the
    row's own message."""
    for entry in sorted(history, key=lambda h: h.sequence or 0, reverse=True):
        if entry.message_type in PAYLOAD_SOURCES:
            part = event_part(entry.message_content)
            if part is not None and part.EventJson:
                return part.EventTypeId or entry.event_type_id, part.EventJson
    part = event_part(row.message_content)
    if part is not None and part.EventJson:
        return part.EventTypeId or row.event_type_id, part.EventJson
    return row.event_type_id, None


def event_part(text: str | None) -> EventPart | None:
    """The ``EventContent`` of a stored message body; None when it has none or is not a message."""
    if not text:
        return None
    try:
        content = MessageContent.model_validate_json(text)
    except ValueError:
        return None
    return content.EventContent


def resubmitted_payload(event_id: str, edited: str | None, original: str | None) -> str:
    """The EventJson a resubmit sends: the edited one, else the one in the event's history; an event with
    neither is refused (resubmit it with changes)."""
    payload = edited if edited is not None else original
    if payload is None:
        raise Conflict(
            f"Event {event_id!r} has no EventJson in its history to resubmit; resubmit it with changes.",
            field="eventJson",
        )
    return payload


# How deep an edited eventJson may nest. Python 3.11's parser refused deeper documents (its recursion
# limit); 3.13's goes on, so the bound is explicit and the same on every interpreter and every instance.
MAX_EVENT_JSON_DEPTH = 900


def nesting(value: object) -> int:
    """How many arrays/objects deep ``value`` nests (without recursion)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_edited_event_json(event_json: str | None) -> None:
    """An edited eventJson is a JSON document (as text) nesting at most :data:`MAX_EVENT_JSON_DEPTH`
    levels; else 400 naming ``eventJson``."""
    if event_json is None:
        return
    try:
        parsed = json.loads(event_json)
    except (ValueError, RecursionError) as exc:  # nested too deep to read is not JSON Settle takes
        raise InvalidInput("eventJson must be a JSON document (as text).", field="eventJson") from exc
    if nesting(parsed) > MAX_EVENT_JSON_DEPTH:
        raise InvalidInput(
            f"eventJson nests deeper than {MAX_EVENT_JSON_DEPTH} levels; Settle does not send it.",
            field="eventJson",
        )


# -- what an action sends and audits ---------------------------------------------------------------


def action_digest(
    kind: MessageType,
    row: EventRow,
    actor: Actor,
    event_json: str | None,
    reason: str | None,
    message_id: str | None = None,
) -> str:
    """The identity of an operator's resubmit / skip: the same request (a retry) has the same digest."""
    return request_digest(
        kind=kind.name,
        endpoint_id=row.endpoint_id,
        event_id=row.event_id,
        addressed_message_id=message_id or row.last_message_id or "",
        settled_by=actor.by,
        principal_id=actor.principal_id,
        result_json=event_json,
        error_text=reason,
        error_type=None,
    )


def control_coordinates(kind: MessageType, row: EventRow) -> Coordinates:
    """Where a resubmit / skip is sent: the row's last message addressed, its session and type; NimBus's
    SkipRequest correlates with the message it skips, a resubmission keeps the row's correlation. An
    event with no last message cannot be addressed (409)."""
    addressed = row.last_message_id
    if not addressed:
        raise Conflict(f"Event {row.event_id!r} has no last message to address.", field="eventId")
    return Coordinates(
        event_id=row.event_id,
        message_id=addressed,
        session_id=row.session_id,
        event_type_id=row.event_type_id,
        correlation_id=addressed if kind is MessageType.SkipRequest else row.correlation_id,
        originating_message_id=row.originating_message_id,
    )


def check_send_size(kind: MessageType, size: int) -> None:
    """A control message larger than Service Bus Standard takes is refused (413) before anything is
    claimed."""
    if size > MAX_SEND_BYTES:
        raise PayloadTooLarge(
            f"The {kind.name} would be {size:,} bytes as sent; Service Bus Standard accepts 262,144.",
            field="eventJson",
        )


def action_audit_data(
    action: str,
    control_message_id: str,
    addressed: str,
    payload: str | None,
    reason: str | None,
    actor: Actor,
) -> str:
    """The audit data of a resubmit / skip: what was sent, to which message, why and by whom; the edited
    payload only for a resubmit with changes."""
    return bounded_json(
        {
            "controlMessageId": control_message_id,
            "addressedMessageId": addressed,
            "eventJson": payload if action == RESUBMIT_WITH_CHANGES else None,
            "reason": reason,
            "principalName": actor.principal_name,
            "principalId": actor.principal_id,
        }
    )


def access_denied_data(actor: Actor) -> str:
    """The audit data of an action refused for want of the operator role: who was refused."""
    return bounded_json({"principalName": actor.principal_name, "principalId": actor.principal_id})


def resolution_audit_data(
    resolution: str, message_id: str, claim: ClaimRow | None, control_message_id: str | None, actor: Actor
) -> str:
    """The audit data of a settlement resolution: the operator's verdict and the claim it resolves (the
    control message the claim holds, else the one the operator named)."""
    return bounded_json(
        {
            "resolution": resolution,
            "addressedMessageId": message_id,
            "controlMessageId": claim.control_message_id if claim else control_message_id,
            "messageType": claim.message_type.name if claim else None,
            "settledBy": claim.settled_by if claim else None,
            "claimedAt": iso(claim.claimed_at) if claim else None,
            "principalName": actor.principal_name,
            "principalId": actor.principal_id,
        }
    )


# -- bulk ------------------------------------------------------------------------------------------


def bulk_selection(event_ids: Iterable[str]) -> list[str]:
    """One action per event, however often it was selected, in the order first selected."""
    return list(dict.fromkeys(event_ids))


# -- listings --------------------------------------------------------------------------------------

# Index rows counted for an answer's ``count`` (keys only: one request per shard); beyond, "at least".
COUNT_CAP = 1000


def at_least(count: int) -> bool:
    """A count that reached :data:`COUNT_CAP` stopped there: there are at least that many."""
    return count >= COUNT_CAP


def counted_status(
    status: str | None,
    *,
    first_page: bool,
    event_type_ids: list[str],
    oldest: datetime | None,
    newest: datetime | None,
) -> str | None:
    """The status whose count an event listing carries: the overview's count is exact for the listing only
    while nothing else narrows it, and is read with the first page (the rest follow it); None: no count."""
    narrowed = bool(event_type_ids or oldest or newest)
    return status if first_page and not narrowed else None


# -- poison ----------------------------------------------------------------------------------------

# Replay outcomes that projected the message: a second replay could only be a duplicate.
PROJECTED = frozenset({Outcome.APPLIED.value, Outcome.REFUSED.value, Outcome.DUPLICATE.value})


class AlreadyReplayed(Conflict, slug="already-replayed", title="This poison message was replayed already"):
    pass


class AlreadyDismissed(Conflict, slug="already-dismissed", title="This poison message was dismissed"):
    pass


def check_day(day: str) -> str:
    """A poison day is a UTC date as YYYYMMDD (400 else)."""
    if len(day) != 8 or not (day.isascii() and day.isdigit()):
        raise InvalidInput("day must be a UTC date as YYYYMMDD.", field="day")
    try:
        datetime.strptime(day, "%Y%m%d")
    except ValueError as exc:
        raise InvalidInput("day must be a UTC date as YYYYMMDD.", field="day") from exc
    return day


def replay_kind(edited: bool) -> str:
    """The audit type of a replay: with the operator's edits or as stored."""
    return "ReplayPoisonWithChanges" if edited else "ReplayPoison"


def replay_refusal(row: PoisonRow, row_key: str) -> Conflict | None:
    """A dismissed poison message is not replayed; one whose replay projected is not replayed again (it
    could only be a duplicate). One poisoned again may be (after a fix). None: replay it."""
    if row.dismissed_at is not None:
        return AlreadyDismissed(
            f"Poison message {row_key!r} was dismissed at {when(row.dismissed_at)} "
            f"by {row.dismissed_by!r}: {row.dismiss_reason}",
            field="id",
        )
    if row.replay_outcome in PROJECTED:
        return AlreadyReplayed(
            f"Poison message {row_key!r} was replayed at {when(row.replayed_at)} by {row.replayed_by!r} "
            f"({row.replay_outcome}); a second replay could only be a duplicate.",
            field="id",
        )
    return None


def dismissal_refusal(row: PoisonRow, row_key: str) -> Conflict | None:
    """A poison message is dismissed once, and not after a replay projected it. None: dismiss it."""
    if row.dismissed_at is not None:
        return AlreadyDismissed(
            f"Poison message {row_key!r} was dismissed at {when(row.dismissed_at)} by {row.dismissed_by!r}.",
            field="id",
        )
    if row.replay_outcome in PROJECTED:
        return AlreadyReplayed(
            f"Poison message {row_key!r} was projected by a replay ({row.replay_outcome}); "
            "nothing to dismiss.",
            field="id",
        )
    return None


def when(at: datetime | None) -> str:
    """An instant in a message as the API writes instants (``2026-12-05T17:09:56.455Z``)."""
    return iso(at) if at is not None else "an unknown time"
