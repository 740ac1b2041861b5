"""Operator actions on an event: resubmit (as is, or with an edited payload), skip, and settling a parked
hand-off from the console. Each goes through the settlement outbox (:mod:`handoff.settlement.settler`): one
claim (which is also its audit, ADR-0022 change 3), one control message, a retry answered from its claim,
the reconciler behind it.

Wire shape (``reference/nimbus-contract.md`` §1.5, ``ManagerClient``): ``ResubmissionRequest`` carries
``EventContent{EventTypeId, EventJson}`` (the latest request message in the event's history that carries
EventJson, or the edited payload); ``SkipRequest`` an empty body and CorrelationId = the addressed
message. Both: To = the endpoint, From = Manager, SessionId from the row, ParentMessageId = the row's
last message (the failed response), a new MessageId. NimBus's rules decide what is allowed (409 else).

This module is the I/O: load the event, ask :mod:`management.rules`, claim and send through the settlement
service, read back the audit and copy it to ``hoaudit``. What is allowed, sent and audited is the rules'.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from common.clock import utcnow
from common.errors import NotFound
from common.principal import Actor, allowed, denial
from common.transactions import insert
from handoff.messages.contract import Coordinates, EventPart, MessageContent, MessageType, control_message
from handoff.messages.transport import encoded_size
from handoff.settlement.claims import ClaimOrder
from handoff.settlement.settler import Settled, Settlement, SettlementService
from handoff.settlement.unconfirmed import ClaimResolver
from handoff.settlement.unconfirmed_rules import RESOLVE_AUDIT, ClaimResolution
from handoff.storage import keys
from handoff.storage.records import AuditRow, EventRow, HistoryRow
from handoff.storage.store import classify_event_rows
from management import rules
from management.audits import mirror


@dataclass(frozen=True)
class ActionResult:
    """The accepted action and its audit (rendered from its claim, or the audit row an older claim names)."""

    accepted: Settled
    action: str
    audit: AuditRow | None


class OperatorActions:
    """The operator's actions on events, each through the settlement outbox. Every accepted (or retried)
    action's audit is copied to ``hoaudit`` (:func:`management.audits.mirror`) before it is answered, so
    the audit search finds it."""

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
        action = rules.resubmit_action(event_json)
        rules.check_edited_event_json(event_json)
        row, history, digest, answered = self._open(
            endpoint_id, event_id, actor, action, event_json, reason, message_id
        )
        if answered is not None:
            return self._mirrored(answered)
        event_type_id, original = rules.payload_of(history, row)
        payload = rules.resubmitted_payload(event_id, event_json, original)
        content = MessageContent(EventContent=EventPart(EventTypeId=event_type_id, EventJson=payload))
        return self._mirrored(
            self._send(
                MessageType.ResubmissionRequest, row, actor, action, content, digest, reason, payload=payload
            )
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
        action = rules.SKIP
        row, _, digest, answered = self._open(endpoint_id, event_id, actor, action, None, reason, message_id)
        if answered is not None:
            return self._mirrored(answered)
        return self._mirrored(
            self._send(MessageType.SkipRequest, row, actor, action, MessageContent(), digest, reason)
        )

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
        kind, allowed_states = rules.ASKS[action]
        row, history = self._load(endpoint_id, event_id)
        self._authorise(row, actor, action)
        digest = rules.action_digest(kind, row, actor, event_json, reason, message_id)
        answered = self._addressed(row, message_id, digest, action)
        if answered is None and not rules.allows(row, allowed_states):
            refusal = rules.not_allowed(row, action, allowed_states)
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
        audit_type = rules.settle_audit_type(kind)
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
            return self._mirrored(replay)
        return self._mirrored(self._answer(self.settlement.settle(settlement, current=row), audit_type))

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
        the resolution it repeats (None only for a claim the reconciler confirmed delivered). The copy is
        written after the resolution, as for the other actions: a retry (answered from the earlier
        resolution's audit) lands on the same row, or writes the copy a crash left missing."""

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
            data=rules.resolution_audit_data(resolution, message_id, claim, control_message_id, actor),
        )
        done = ClaimResolver(self.settlement).resolve(
            endpoint_id,
            row,
            message_id,
            resolution=resolution,
            control_message_id=control_message_id,
            audit=audit,
        )
        mirror(self.store, done.audit)
        return done

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
            data=rules.access_denied_data(actor),
        )
        pk = self.store.event_partition(row.endpoint_id, row.event_id)
        self.store.submit([insert(audit.to_entity(pk, keys.audit_row(row.event_id, now, uuid.uuid4().hex)))])
        mirror(self.store, audit)
        raise denial(actor)

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
        refusal = rules.stale_address(row, message_id, action)
        if refusal is not None:
            raise refusal
        return None

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
        coords = rules.control_coordinates(kind, row)
        addressed = coords.message_id
        message = control_message(kind, row.endpoint_id, coords, content, message_id=str(uuid.uuid4()))
        rules.check_send_size(kind, encoded_size(message))
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
        data = rules.action_audit_data(action, message.message_id, addressed, payload, reason, actor)
        return self._answer(self.settlement.submit(order, row, message, data), action)

    def _answer(self, accepted: Settled, action: str) -> ActionResult:
        """The action's answer with its audit: rendered from its claim (ADR-0022 change 3), or the audit row
        a claim written before that names."""
        claim = self.store.get_claim(accepted.endpoint_id, accepted.event_id, accepted.parked_message_id)
        audit = None
        if claim is not None:
            audit = claim.audit()
        if claim is not None and audit is None and claim.audit_key:
            _, _, audits = classify_event_rows(
                iter(self.store.point_rows(accepted.endpoint_id, accepted.event_id, [claim.audit_key]))
            )
            audit = audits[0] if audits else None
        return ActionResult(accepted=accepted, action=action, audit=audit)

    def _mirrored(self, result: ActionResult) -> ActionResult:
        """The action's audit copied to ``hoaudit`` (insert-only: a retry lands on the same row)."""
        mirror(self.store, result.audit)
        return result
