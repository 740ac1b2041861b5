"""Operator actions on an event: resubmit (as is, or with an edited payload), skip, and settling a parked
hand-off from the console. Each goes through the settlement outbox (:mod:`handoff.settlement.settler`): one
claim, one control message, one audit row, a retry answered from its claim, the reconciler behind it.

Wire shape (``reference/nimbus-contract.md`` §1.5, ``ManagerClient``): ``ResubmissionRequest`` carries
``EventContent{EventTypeId, EventJson}`` (the latest request message in the event's history that carries
EventJson, or the edited payload); ``SkipRequest`` an empty body and CorrelationId = the addressed
message. Both: To = the endpoint, From = Manager, SessionId from the row, ParentMessageId = the row's
last message (the failed response), a new MessageId. NimBus's rules decide what is allowed (409 else).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from common.clock import iso, utcnow
from common.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from common.principal import Actor, allowed, denial
from common.transactions import insert
from handoff.messages.contract import (
    Coordinates,
    EventPart,
    MessageContent,
    MessageType,
    ResolutionStatus,
    control_message,
)
from handoff.messages.transport import MAX_SEND_BYTES, encoded_size
from handoff.models import SettlementAccepted
from handoff.settlement.claims import ClaimOrder, request_digest
from handoff.settlement.settler import Settlement, SettlementService
from handoff.settlement.unconfirmed import ClaimResolver
from handoff.settlement.unconfirmed_rules import RESOLVE_AUDIT, ClaimResolution
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.json_text import bounded_json
from handoff.storage.records import AuditRow, ClaimRow, EventRow, HistoryRow
from handoff.storage.store import classify_event_rows
from management.audits import mirror

RESUBMIT = "Resubmit"
RESUBMIT_WITH_CHANGES = "ResubmitWithChanges"
SKIP = "Skip"

# NimBus's rules (the WebApp's buttons): what each action may act on.
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
_PAYLOAD_SOURCES = frozenset(
    {
        MessageType.EventRequest,
        MessageType.ResubmissionRequest,
        MessageType.RetryRequest,
        MessageType.ContinuationRequest,
    }
)

# What each action on an event sends, and the statuses that allow it.
_ASKS = {
    RESUBMIT: (MessageType.ResubmissionRequest, RESUBMITTABLE),
    RESUBMIT_WITH_CHANGES: (MessageType.ResubmissionRequest, RESUBMITTABLE),
    SKIP: (MessageType.SkipRequest, SKIPPABLE),
}


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


def payload_of(history: list[HistoryRow], row: EventRow) -> tuple[str | None, str | None]:
    """(EventTypeId, EventJson) to resubmit: the latest request message carrying EventJson, else the
    row's own message."""
    for entry in sorted(history, key=lambda h: h.sequence or 0, reverse=True):
        if entry.message_type in _PAYLOAD_SOURCES:
            part = _event_part(entry.message_content)
            if part is not None and part.EventJson:
                return part.EventTypeId or entry.event_type_id, part.EventJson
    part = _event_part(row.message_content)
    if part is not None and part.EventJson:
        return part.EventTypeId or row.event_type_id, part.EventJson
    return row.event_type_id, None


def _event_part(text: str | None) -> EventPart | None:
    if not text:
        return None
    try:
        content = MessageContent.model_validate_json(text)
    except ValueError:
        return None
    return content.EventContent


# How deep an edited eventJson may nest. Python 3.11's parser refused deeper documents (its recursion
# limit); 3.13's goes on, so the bound is explicit and the same on every interpreter and every instance.
MAX_EVENT_JSON_DEPTH = 900


def _nesting(value: object) -> int:
    """How many arrays/objects deep ``value`` nests (without recursion)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


@dataclass(frozen=True)
class ActionResult:
    """The accepted action and the audit row it wrote."""

    accepted: SettlementAccepted
    action: str
    audit: AuditRow | None


class OperatorActions:
    def __init__(self, settlement: SettlementService, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.settlement = settlement
        self.store = settlement.store
        self.clock = clock

    # -- resubmit / skip ----------------------------------------------------------------------------

    def resubmit(
        self,
        endpoint_id: str,
        event_id: str,
        actor: Actor,
        *,
        event_json: str | None,
        reason: str | None,
        message_id: str | None = None,
    ) -> ActionResult:
        action = RESUBMIT_WITH_CHANGES if event_json is not None else RESUBMIT
        if event_json is not None:
            try:
                parsed = json.loads(event_json)
            except (ValueError, RecursionError) as exc:  # nested too deep to read is not JSON Settle takes
                raise InvalidInput("eventJson must be a JSON document (as text).", field="eventJson") from exc
            if _nesting(parsed) > MAX_EVENT_JSON_DEPTH:
                raise InvalidInput(
                    f"eventJson nests deeper than {MAX_EVENT_JSON_DEPTH} levels; Settle does not send it.",
                    field="eventJson",
                )
        row, history, digest, answered = self._open(
            endpoint_id, event_id, actor, action, event_json, reason, message_id
        )
        if answered is not None:
            return answered
        event_type_id, original = payload_of(history, row)
        payload = event_json if event_json is not None else original
        if payload is None:
            raise Conflict(
                f"Event {event_id!r} has no EventJson in its history to resubmit; resubmit it with changes.",
                field="eventJson",
            )
        content = MessageContent(EventContent=EventPart(EventTypeId=event_type_id, EventJson=payload))
        return self._send(
            MessageType.ResubmissionRequest, row, actor, action, content, digest, reason, payload=payload
        )

    def skip(
        self,
        endpoint_id: str,
        event_id: str,
        actor: Actor,
        *,
        reason: str | None,
        message_id: str | None = None,
    ) -> ActionResult:
        row, _, digest, answered = self._open(endpoint_id, event_id, actor, SKIP, None, reason, message_id)
        if answered is not None:
            return answered
        return self._send(MessageType.SkipRequest, row, actor, SKIP, MessageContent(), digest, reason)

    def _open(
        self,
        endpoint_id: str,
        event_id: str,
        actor: Actor,
        action: str,
        event_json: str | None,
        reason: str | None,
        message_id: str | None,
    ) -> tuple[EventRow, list[HistoryRow], str, ActionResult | None]:
        """What resubmit and skip do first: load and authorise, then answer a retry from its claim, or
        refuse an event whose status does not allow the action (the last item; None: go on and send)."""
        kind, allowed_states = _ASKS[action]
        row, history = self._load(endpoint_id, event_id)
        self._authorise(row, actor, action)
        digest = self._digest(kind, row, actor, event_json, reason, message_id)
        answered = self._addressed(row, message_id, digest, action)
        if answered is None and not allows(row, allowed_states):
            refusal = self._refusal(row, action, allowed_states)
            answered = self._answer(
                self.settlement.replay_or_refuse(endpoint_id, event_id, digest, refusal), action
            )
        return row, history, digest, answered

    # -- settle a parked hand-off (the console's complete / fail) -----------------------------------

    def settle(
        self,
        endpoint_id: str,
        event_id: str,
        actor: Actor,
        *,
        kind: MessageType,
        result: object = None,
        error_text: str | None = None,
        error_type: str | None = None,
        message_id: str | None = None,
    ) -> ActionResult:
        """Complete or fail the parked hand-off of an event: NimBus's WebApp settle, audited as the
        operator (``CompleteHandoff`` / ``FailHandoff``). ``message_id``: the parked message addressed."""
        row, _ = self._load(endpoint_id, event_id)
        audit_type = "CompleteHandoff" if kind is MessageType.HandoffCompletedRequest else "FailHandoff"
        self._authorise(row, actor, audit_type)
        settlement = Settlement(
            kind=kind,
            endpoint_id=endpoint_id,
            coordinates=Coordinates(
                event_id=row.event_id, message_id=message_id or row.last_message_id or ""
            ),
            settled_by=actor.by,
            result=result,
            error_text=error_text,
            error_type=error_type,
            principal_name=actor.principal_name,
            principal_id=actor.principal_id,
        )
        replay = self._addressed(row, message_id, settlement.digest(), audit_type)
        if replay is not None:
            return replay
        return self._answer(self.settlement.settle(settlement, current=row), audit_type)

    # -- the way out of an unconfirmed settlement -----------------------------------------------------

    def resolve_settlement(
        self,
        endpoint_id: str,
        event_id: str,
        actor: Actor,
        *,
        message_id: str,
        resolution: str,
        reason: str,
        control_message_id: str | None = None,
    ) -> ClaimResolution:
        """Mark an unconfirmed settlement delivered, or release it; audited ``ResolveSettlement``.

        Answers the resolution with its audit: the one written, or for a repeat (``replayed``) the audit of
        the resolution it repeats (None only for a claim the reconciler confirmed delivered)."""

        row = self.store.get_event(endpoint_id, event_id)
        if row is None:
            raise NotFound(f"Event {event_id!r} is unknown on endpoint {endpoint_id!r}.")
        self._authorise(row, actor, RESOLVE_AUDIT)
        claim = self.store.get_claim(endpoint_id, event_id, message_id)
        now = self.clock()
        audit = AuditRow.of(
            row,
            now,
            actor,
            RESOLVE_AUDIT,
            comment=reason,
            data=bounded_json(
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
            ),
        )
        return ClaimResolver(self.settlement).resolve(
            endpoint_id,
            row,
            message_id,
            resolution=resolution,
            control_message_id=control_message_id,
            audit=audit,
        )

    # -- shared -------------------------------------------------------------------------------------

    def _load(self, endpoint_id: str, event_id: str) -> tuple[EventRow, list[HistoryRow]]:
        row, history, _ = classify_event_rows(self.store.event_rows(endpoint_id, event_id))
        if row is None:
            raise NotFound(f"Event {event_id!r} is unknown on endpoint {endpoint_id!r}.")
        return row, history

    def _authorise(self, row: EventRow, actor: Actor, action: str) -> None:
        """A principal without the operator role: an ``AccessDenied`` audit row (and its ``hoaudit`` copy,
        so the audit search finds who was refused), then 403; nothing sent."""
        if allowed(actor):
            return
        now = self.clock()
        audit = AuditRow.of(
            row,
            now,
            actor,
            action,
            comment="Access denied",
            access_denied=True,
            data=bounded_json({"principalName": actor.principal_name, "principalId": actor.principal_id}),
        )
        pk = self.store.event_partition(row.endpoint_id, row.event_id)
        self.store.submit([insert(audit.to_entity(pk, keys.audit_row(row.event_id, now, uuid.uuid4().hex)))])
        mirror(self.store, audit)
        raise denial(actor)

    @staticmethod
    def _refusal(row: EventRow, action: str, allowed_states: frozenset[ResolutionStatus]) -> Conflict:
        names = ", ".join(sorted(s.name for s in allowed_states))
        shown = row.resolution_status.name + (
            f" + {row.pending_sub_status}" if row.pending_sub_status else ""
        )
        return Conflict(
            f"{action} is not allowed for event {row.event_id!r}: it is {shown} ({action} needs {names}).",
            field="eventId",
        )

    def _addressed(
        self, row: EventRow, message_id: str | None, digest: str, action: str
    ) -> ActionResult | None:
        """An action addressed to ``message_id``: its retry is answered from its claim (whatever the event
        did since); another action's claim on it is 409 in-flight; a message that is not the row's
        current one and was never acted on is 409 naming it. None: go on (it is the current message)."""
        if message_id is None:
            return None
        accepted = self.settlement.answer_addressed(row.endpoint_id, row.event_id, message_id, digest)
        if accepted is not None:
            return self._answer(accepted, action)
        if message_id != row.last_message_id:
            raise Conflict(
                f"messageId {message_id!r} is not the current message of event {row.event_id!r} "
                f"(that is {row.last_message_id!r}) and no {action} of it was made: look at the event again.",
                field="messageId",
            )
        return None

    @staticmethod
    def _digest(
        kind: MessageType,
        row: EventRow,
        actor: Actor,
        event_json: str | None,
        reason: str | None,
        message_id: str | None = None,
    ) -> str:
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

    def _send(
        self,
        kind: MessageType,
        row: EventRow,
        actor: Actor,
        action: str,
        content: MessageContent,
        digest: str,
        reason: str | None,
        *,
        payload: str | None = None,
    ) -> ActionResult:
        addressed = row.last_message_id
        if not addressed:
            raise Conflict(f"Event {row.event_id!r} has no last message to address.", field="eventId")
        coords = Coordinates(
            event_id=row.event_id,
            message_id=addressed,
            session_id=row.session_id,
            event_type_id=row.event_type_id,
            # NimBus: a SkipRequest correlates with the message it skips, a resubmission keeps the row's.
            correlation_id=addressed if kind is MessageType.SkipRequest else row.correlation_id,
            originating_message_id=row.originating_message_id,
        )
        message = control_message(kind, row.endpoint_id, coords, content, message_id=str(uuid.uuid4()))
        size = encoded_size(message)
        if size > MAX_SEND_BYTES:
            raise PayloadTooLarge(
                f"The {kind.name} would be {size:,} bytes as sent; Service Bus Standard accepts 262,144.",
                field="eventJson",
            )
        order = ClaimOrder(
            kind=kind,
            endpoint_id=row.endpoint_id,
            event_id=row.event_id,
            addressed_message_id=addressed,
            by=actor.by,
            audit_type=action,
            digest=digest,
            audit_comment=reason,
            principal_name=actor.principal_name,
            principal_id=actor.principal_id,
            pins_event=True,
            # A parked hand-off resubmitted / skipped (FR-042): its queue row is marked as a settlement's.
            marks_queue=row.is_pending_handoff,
        )
        data = bounded_json(
            {
                "controlMessageId": message.message_id,
                "addressedMessageId": addressed,
                "eventJson": payload if action == RESUBMIT_WITH_CHANGES else None,
                "reason": reason,
                "principalName": actor.principal_name,
                "principalId": actor.principal_id,
            }
        )
        return self._answer(self.settlement.submit(order, row, message, data), action)

    def _answer(self, accepted: SettlementAccepted, action: str) -> ActionResult:
        claim = self.store.get_claim(accepted.endpoint_id, accepted.event_id, accepted.parked_message_id)
        audit = None
        if claim is not None:
            _, _, audits = classify_event_rows(
                iter(self.store.point_rows(accepted.endpoint_id, accepted.event_id, [claim.audit_key]))
            )
            audit = audits[0] if audits else None
        return ActionResult(accepted=accepted, action=action, audit=audit)
