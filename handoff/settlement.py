"""Settlement of a parked hand-off: check → claim (an outbox record) → send → mark. 202: Settle owns it.

The claim row, keyed (endpoint, event id, parked message id), holds the exact control message and is
written in one transaction with the audit row, the reconcile index row and the queue's ``ClaimedUntil``
mark, *before* the send (``docs/adr/0012-settlement-outbox.md``):

* the send succeeds → the claim becomes ``sent`` → 202 ``confirmed: true``;
* the send certainly reached nothing (:class:`~handoff.transport.SendRefused`) → claim, audit, reconcile
  row and mark are deleted in one transaction → 503, and a retry starts clean;
* anything else (a timeout, a link lost during the send, the process killed) → the claim stays
  ``sending`` → 202 ``confirmed: false``; the reconciler confirms it from the resolver's history, re-sends
  the identical message while duplicate detection covers it, or shows it as unconfirmed.

A claim whose message was (or may have been) sent is never taken over: another settlement of the same
hand-off is a 409 ``settlement-in-flight`` however old the claim is. The same settlement retried (same
kind, request and caller) is answered from its claim with the same ``controlMessageId``. Two settlements
of one hand-off can never both be sent, on any number of instances: the claim is insert-only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from common import telemetry
from common.clock import utcnow
from common.errors import Conflict, NotFound, PayloadTooLarge, SettleError
from common.http import dependency_problem
from handoff import keys, store
from handoff.contract import (
    Coordinates,
    MessageType,
    control_message,
    settlement_content,
)
from handoff.in_flight import await_sender, first_send_in_flight
from handoff.models import SettlementAccepted
from handoff.outbox import (
    CONFIRM_AFTER,
    RETRY_AFTER,
    SEND_DEADLINE,
    ClaimState,
    OutboxMessage,
    Step,
    bounded_json,
    can_resend,
    follow_up_note,
    next_step,
    recheck_after,
    request_digest,
)
from handoff.records import AuditRow, ClaimRow, EventRow, ReconcileRow, UnconfirmedRow
from handoff.store import HandoffStore, Operation
from handoff.transport import MAX_SEND_BYTES, SendRefused, Transport, encoded_size

log = logging.getLogger("settle.settlement")

UNCLAIMED = "0"
# ``ClaimedUntil`` of a hand-off whose settlement is in flight: claims do not expire, so neither does
# the mark; it is cleared when a refused send releases the claim, or the row leaves the queue.
CLAIMED = "9999-12-31T23:59:59.999Z"
_CLAIM_ATTEMPTS = 3


class SettlementInFlight(Conflict):
    """Another settlement of this hand-off holds the claim (409, whatever its age)."""

    slug = "settlement-in-flight"
    title = "Another settlement of this hand-off is in flight"


# Telemetry outcomes of refused settlements (others are named by their problem slug).
_REFUSALS: dict[type[SettleError], str] = {
    SettlementInFlight: "in-flight",
    Conflict: "refused",
    NotFound: "not-found",
    PayloadTooLarge: "too-large",
    SendRefused: "unavailable",
}


@dataclass(frozen=True)
class Settlement:
    """One settle request, transport-neutral."""

    kind: MessageType  # HandoffCompletedRequest or HandoffFailedRequest
    endpoint_id: str
    coordinates: Coordinates
    settled_by: str
    result: Any = None
    error_text: str | None = None
    error_type: str | None = None
    # Who sent the request: the ``x-agent-id`` header, and the principal App Service authenticated.
    agent_id: str | None = None
    principal_name: str | None = None
    principal_id: str | None = None
    # From a leased receive: the settlement is refused (409 lease-lost) if another agent holds it now.
    lease_token: str | None = None

    @property
    def audit_type(self) -> str:
        return "CompleteHandoff" if self.kind is MessageType.HandoffCompletedRequest else "FailHandoff"

    @property
    def payload_field(self) -> str:
        return "result" if self.kind is MessageType.HandoffCompletedRequest else "errorText"

    def digest(self) -> str:
        return request_digest(
            kind=self.kind.name,
            endpoint_id=self.endpoint_id,
            event_id=self.coordinates.event_id,
            addressed_message_id=self.coordinates.message_id,
            settled_by=self.settled_by,
            principal_id=self.principal_id,
            result_json=result_json(self.result),
            error_text=self.error_text,
            error_type=self.error_type,
        )


def result_json(result: Any) -> str | None:
    """NimBus ``CompleteAsync``: a string passes verbatim, other values become JSON, null is no payload."""
    if result is None:
        return None
    if isinstance(result, str):
        return result
    return json.dumps(result, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class ClaimOrder:
    """What one outbox claim records, whoever asks: a settlement, or an operator's resubmit / skip.

    ``addressed_message_id`` keys the claim (the parked message of a hand-off, the row's last message
    for an operator action), so two different control messages for the same state of an event can never
    both be claimed; ``digest`` identifies the request, so its retry is answered from the claim.
    """

    kind: MessageType
    endpoint_id: str
    event_id: str
    addressed_message_id: str
    by: str
    audit_type: str
    digest: str
    audit_comment: str | None = None
    agent_id: str | None = None
    principal_name: str | None = None
    principal_id: str | None = None
    # A hand-off settlement also marks the agent queue row (``ClaimedUntil``).
    marks_queue: bool = False
    # Leased receive: the claim is fenced by the lease (If-Match the queue row holding this token).
    lease_token: str | None = None
    # An operator action also pins the event row as it was checked (``If-Match`` its ETag, in the claim's
    # transaction): a projection between the check and the claim fails the claim instead of letting a
    # control message go out for a state the operator never saw.
    pins_event: bool = False


SETTLEMENT_KINDS = frozenset({MessageType.HandoffCompletedRequest, MessageType.HandoffFailedRequest})


class SettlementService:
    """Settles parked hand-offs (and sends operator control messages) through the outbox, and follows up
    claims whose send was not confirmed."""

    def __init__(
        self,
        store_: HandoffStore,
        transport: Callable[[], Transport],
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store_
        # Looked up at each use: ``service.use_transport`` changes it for everyone at once.
        self.transport = transport
        self.clock = clock

    # -- settle ---------------------------------------------------------------------------------------

    def settle(self, s: Settlement, *, current: EventRow | None = None) -> SettlementAccepted:
        """Send exactly one control message for a Pending + Handoff row (see the module docstring).

        Its span is ``settle.handoff.complete`` / ``settle.handoff.fail``; the control message carries that
        span's ``traceparent`` (and ``Diagnostic-Id``), stored with the claim, so a re-send carries it too.
        """
        kind = "complete" if s.kind is MessageType.HandoffCompletedRequest else "fail"
        attributes = {
            "nimbus.endpoint": s.endpoint_id,
            "nimbus.event_id": s.coordinates.event_id,
            "nimbus.parked_message_id": s.coordinates.message_id,
            "settle.settled_by": s.settled_by,
        }
        with telemetry.span(f"settle.handoff.{kind}", attributes) as span:
            try:
                accepted = self._settle(s, current)
            except SettleError as exc:
                outcome = _REFUSALS.get(type(exc), exc.slug)
                if exc.status >= 500:
                    span.failed(exc, slug=outcome)
                else:
                    span.set_outcome(outcome)
                telemetry.add("settle.handoff.settlements", kind=kind, outcome=outcome)
                raise
            except Exception as exc:
                mapped = dependency_problem(exc)  # what the HTTP answer will be (a 503 mostly)
                outcome = mapped.slug if mapped is not None else "error"
                span.failed(exc, slug=outcome)
                telemetry.add("settle.handoff.settlements", kind=kind, outcome=outcome)
                raise
            outcome = "replayed" if accepted.replayed else "sent" if accepted.confirmed else "unconfirmed"
            span.set_outcome(outcome)
            span.update(
                {
                    "nimbus.control_message_id": accepted.control_message_id,
                    "settle.claim_state": accepted.state,
                }
            )
            telemetry.add("settle.handoff.settlements", kind=kind, outcome=outcome)
            return accepted

    def _settle(self, s: Settlement, current: EventRow | None) -> SettlementAccepted:
        payload = result_json(s.result)
        if payload is not None and len(payload.encode("utf-8")) > MAX_SEND_BYTES:
            raise self._too_large(s, len(payload.encode("utf-8")))
        row = current or self.store.get_event(s.endpoint_id, s.coordinates.event_id)
        if row is None:
            raise NotFound(f"Event {s.coordinates.event_id!r} is unknown on endpoint {s.endpoint_id!r}.")
        digest = s.digest()
        if not row.is_pending_handoff:
            return self.replay_or_refuse(s.endpoint_id, s.coordinates.event_id, digest, self._not_parked(row))
        try:
            parked = self._check(row, s.coordinates)
        except Conflict as mismatch:
            # Parked again since (a new hand-off): a retry of a settlement of the earlier one is answered.
            return self.replay_or_refuse(s.endpoint_id, s.coordinates.event_id, digest, mismatch)
        coords = self._complete_coordinates(s.coordinates, row)
        content = settlement_content(
            s.kind, coords, result_json=payload, error_text=s.error_text, error_type=s.error_type
        )
        message = control_message(s.kind, s.endpoint_id, coords, content, message_id=str(uuid.uuid4()))
        traced = telemetry.trace_properties()
        if traced:
            # Part of the stored outbox message: a re-send by the reconciler carries the same context.
            message = dataclasses.replace(message, properties={**message.properties, **traced})
        telemetry.annotate(
            {"nimbus.session_id": coords.session_id, "settle.status_before": "Pending+Handoff"}
        )
        size = encoded_size(message)
        if size > MAX_SEND_BYTES:
            raise self._too_large(s, size)
        order = ClaimOrder(
            kind=s.kind,
            endpoint_id=s.endpoint_id,
            event_id=row.event_id,
            addressed_message_id=parked,
            by=s.settled_by,
            audit_type=s.audit_type,
            digest=digest,
            agent_id=s.agent_id,
            principal_name=s.principal_name,
            principal_id=s.principal_id,
            marks_queue=True,
            lease_token=s.lease_token,
        )
        return self.submit(order, row, message, audit_data(s, message.message_id, parked))

    def submit(
        self, order: ClaimOrder, row: EventRow, message: OutboxMessage, data: str
    ) -> SettlementAccepted:
        """Claim (with the audit row, ``data`` its ``Data``), send, answer: the outbox path of any control
        message. A claim already there for the same request answers its retry; another request's is a 409."""
        claim, existing = self._claim(order, row, message, data)
        if existing is not None:
            return self._answer(order.endpoint_id, existing, replayed=True)
        return self._send_claimed(order.endpoint_id, row, claim)

    @staticmethod
    def _too_large(s: Settlement, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"{s.payload_field} makes the control message {size:,} bytes as sent; Service Bus Standard "
            f"accepts 262,144 bytes (256 KB) per message including its properties "
            f"(Settle keeps {262_144 - MAX_SEND_BYTES:,} for the broker's own).",
            field=s.payload_field,
        )

    @staticmethod
    def _not_parked(row: EventRow) -> Conflict:
        return Conflict(
            f"Event {row.event_id!r} is not a pending hand-off "
            f"(it is {row.resolution_status.name}"
            + (f" + {row.pending_sub_status}" if row.pending_sub_status else "")
            + f", last written by {row.message_type.name}).",
            field="coordinates.eventId",
        )

    @staticmethod
    def _check(row: EventRow, coords: Coordinates) -> str:
        """The parked message id, if these coordinates address this row's hand-off (409 on a mismatch)."""
        if coords.session_id is not None and coords.session_id != (row.session_id or ""):
            raise Conflict(
                "coordinates.sessionId does not match the parked event.", field="coordinates.sessionId"
            )
        # The agent path passes the row's lastMessageId (the PendingHandoffResponse); an adapter may pass
        # the request it parked (the response's ParentMessageId). Either addresses this hand-off.
        if coords.message_id not in (row.last_message_id, row.parent_message_id):
            raise Conflict(
                "coordinates.messageId does not address the parked message (a newer park replaced it?).",
                field="coordinates.messageId",
            )
        assert row.last_message_id is not None
        return row.last_message_id

    @staticmethod
    def _complete_coordinates(coords: Coordinates, row: EventRow) -> Coordinates:
        """Coordinates the caller left out come from the row (NimBus's WebApp settles by event/message)."""
        return coords.model_copy(
            update={
                "session_id": coords.session_id if coords.session_id is not None else row.session_id,
                "event_type_id": coords.event_type_id or row.event_type_id,
                "correlation_id": coords.correlation_id or row.correlation_id,
                "originating_message_id": coords.originating_message_id or row.originating_message_id,
            }
        )

    # -- the claim transaction --------------------------------------------------------------------

    def _claim(
        self, s: ClaimOrder, row: EventRow, message: OutboxMessage, data: str
    ) -> tuple[ClaimRow, ClaimRow | None]:
        """Write claim + audit + reconcile row (+ queue mark); or return the claim already there."""
        from azure.data.tables import TableTransactionError

        parked, digest = s.addressed_message_id, s.digest
        pk = self.store.event_partition(s.endpoint_id, row.event_id)
        claim_key = keys.claim_row(row.event_id, parked)
        now = self.clock()
        audit_key = keys.audit_row(row.event_id, now, uuid.uuid4().hex)
        reconcile_key = keys.reconcile_row(now + CONFIRM_AFTER, row.event_id, parked)
        claim = ClaimRow(
            event_id=row.event_id,
            parked_message_id=parked,
            state=ClaimState.sending,
            claimed_at=now,
            updated_at=now,
            control_message_id=message.message_id,
            message_type=s.kind,
            request_digest=digest,
            settled_by=s.by,
            agent_id=s.agent_id,
            principal_name=s.principal_name,
            principal_id=s.principal_id,
            attempts=0,
            audit_key=audit_key,
            reconcile_key=reconcile_key,
            control_envelope=message.envelope_json(),
            control_body=message.body,
        )
        audit = AuditRow(
            auditor_name=s.by,
            audit_timestamp=now,
            audit_type=s.audit_type,
            comment=s.audit_comment,
            data=data,
            event_id=row.event_id,
            endpoint_id=s.endpoint_id,
            event_type_id=row.event_type_id,
            principal_name=s.principal_name,
            principal_id=s.principal_id,
        )
        due = ReconcileRow(event_id=row.event_id, parked_message_id=parked, due_at=now + CONFIRM_AFTER)
        ops: list[Operation] = [
            store.insert(claim.to_entity(pk, claim_key)),
            store.insert(audit.to_entity(pk, audit_key)),
            store.insert(due.to_entity(pk, reconcile_key)),
        ]
        fenced = len(ops) if s.marks_queue and row.queue_key and s.lease_token else None
        if s.marks_queue and row.queue_key:
            # If-Match *: the index row must still exist, i.e. the hand-off was not projected away.
            # With a lease token, If-Match the queue row as read holding that token (set per attempt).
            ops.append(store.merge({"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": CLAIMED}))
        pin = len(ops)
        if s.pins_event:
            if row.etag is None:
                raise ValueError("an operator action needs the event row's ETag")
            event_key = keys.event_row(row.event_id)
            ops.append(
                store.merge({"PartitionKey": pk, "RowKey": event_key, "OperatorClaimAt": now}, row.etag)
            )
        for _ in range(_CLAIM_ATTEMPTS):
            if fenced is not None:
                held = self._held_queue_row(s, row, parked)
                if isinstance(held, ClaimRow):
                    return claim, held  # our own settlement, retried after the lease ended with it
                ops[fenced] = store.merge(
                    {"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": CLAIMED}, held
                )
            try:
                etags = self.store.submit(ops)
            except TableTransactionError as exc:
                if exc.index == 0 and exc.status_code == 409:
                    existing = self.store.get_claim(s.endpoint_id, row.event_id, parked)
                    if existing is None:
                        continue  # released between our write and our read: try again
                    return claim, self._same_or_refuse(existing, digest)
                if fenced is not None and exc.index == fenced and exc.status_code == 412:
                    continue  # the queue row changed (a renewal, a new lease): read it again
                if s.pins_event and exc.index == pin:
                    raise Conflict(
                        f"Event {row.event_id!r} changed while the {s.audit_type} was being claimed "
                        "(a newer message was projected); look at it again.",
                        field="eventId",
                    ) from exc
                if exc.status_code == 404:
                    raise self._not_parked_any_more(row) from exc
                raise
            except Exception as exc:
                # The answer may have been lost after the transaction applied: read back before deciding.
                ours = self._read_back(s.endpoint_id, row.event_id, parked, exc)
                if ours.control_message_id != message.message_id:
                    return claim, self._same_or_refuse(ours, digest)
                claim.etag = ours.etag
                return claim, None
            claim.etag = etags[0].get("etag") if etags else None
            return claim, None
        raise SettlementInFlight(
            f"A settlement of event {row.event_id!r} kept changing; retry.", field="coordinates.messageId"
        )

    def _held_queue_row(self, s: ClaimOrder, row: EventRow, parked: str) -> str | ClaimRow:
        """The ETag of the queue row while it holds ``s.lease_token``; else the claim of the same request
        (a retry), else 409 lease-lost: another agent holds the hand-off now."""
        from handoff.receive import LeaseLost

        assert row.queue_key is not None
        queued = self.store.get_queue_row(s.endpoint_id, row.event_id, row.queue_key)
        if queued is None:
            raise self._not_parked_any_more(row)
        if queued.lease_token == s.lease_token and queued.etag:
            return queued.etag
        existing = self.store.get_claim(s.endpoint_id, row.event_id, parked)
        if existing is not None and existing.request_digest == s.digest:
            return existing
        raise LeaseLost(
            f"The lease on event {row.event_id!r} was lost (it expired and another agent holds it now, or it "
            "was released); this settlement was not sent.",
            field="leaseToken",
        )

    @staticmethod
    def _not_parked_any_more(row: EventRow) -> Conflict:
        return Conflict(
            f"Event {row.event_id!r} is no longer a pending hand-off.", field="coordinates.eventId"
        )

    def _read_back(self, endpoint_id: str, event_id: str, parked: str, cause: Exception) -> ClaimRow:
        """The claim after a claim transaction whose outcome is unknown; re-raises ``cause`` if none."""
        try:
            found = self.store.get_claim(endpoint_id, event_id, parked)
        except Exception:
            log.warning(
                "claim of %s/%s: outcome unknown and unreadable", endpoint_id, event_id, exc_info=True
            )
            raise cause from None
        if found is None:
            raise cause
        return found

    @staticmethod
    def _same_or_refuse(existing: ClaimRow, digest: str) -> ClaimRow:
        if existing.request_digest == digest:
            return existing
        raise SettlementInFlight(
            f"A settlement of event {existing.event_id!r} ({existing.message_type.name} by "
            f"{existing.settled_by!r}, {existing.state.name}) is already in flight.",
            field="coordinates.messageId",
        )

    def answer_addressed(
        self, endpoint_id: str, event_id: str, addressed_message_id: str, digest: str
    ) -> SettlementAccepted | None:
        """The answer to a retry of the request ``digest`` addressed to that message, from its claim (one
        point read); None when the message has no claim; 409 in-flight when another request holds it."""
        claim = self.store.get_claim(endpoint_id, event_id, addressed_message_id)
        if claim is None:
            return None
        return self._answer(endpoint_id, self._same_or_refuse(claim, digest), replayed=True)

    def replay_or_refuse(
        self, endpoint_id: str, event_id: str, digest: str, refusal: Conflict
    ) -> SettlementAccepted:
        """The row is not (or no longer) in a state the request needs: answer a retry of a request made
        before (the event's claims are one short range read), else raise ``refusal``."""
        for claim in self.store.claims(endpoint_id, event_id):
            if claim.request_digest == digest and claim.state is not ClaimState.superseded:
                return self._answer(endpoint_id, claim, replayed=True)
        raise refusal

    # -- send and follow-up -------------------------------------------------------------------------

    def _send_claimed(self, endpoint_id: str, row: EventRow, claim: ClaimRow) -> SettlementAccepted:
        if self.clock() - claim.claimed_at > SEND_DEADLINE:
            # Too late to be sure the first copy lands inside the re-send window: leave it to the reconciler.
            log.warning(
                "claim of %s/%s is older than the send deadline; not sent here", endpoint_id, row.event_id
            )
            return self._answer(endpoint_id, claim, replayed=False)
        transport = self.transport()
        try:
            transport.send(endpoint_id, claim.outbox_message().to_service_bus())
        except SendRefused:
            if self._release(endpoint_id, row, claim):
                raise
            return self._answer(endpoint_id, claim, replayed=False)
        except Exception:
            log.warning(
                "%s for %s/%s may not have reached the broker; the reconciler follows it up",
                claim.message_type.name,
                endpoint_id,
                row.event_id,
                exc_info=True,
            )
            # Count the attempt (best effort); the claim stays ``sending`` and due for the reconciler.
            claim = self._transition(
                endpoint_id, claim, claim.state, due=claim.claimed_at + CONFIRM_AFTER, attempt=True
            )
            return self._answer(endpoint_id, claim, replayed=False)
        log.info(
            "%s sent for %s/%s by %s", claim.message_type.name, endpoint_id, row.event_id, claim.settled_by
        )
        sent = self._transition(endpoint_id, claim, ClaimState.sent, sent=True, attempt=True)
        return self._answer(endpoint_id, sent, replayed=False, confirmed=True)

    def _answer(
        self, endpoint_id: str, claim: ClaimRow, *, replayed: bool, confirmed: bool | None = None
    ) -> SettlementAccepted:
        if replayed and first_send_in_flight(claim, self.clock()):
            claim = await_sender(self.store, endpoint_id, claim, clock=self.clock)  # one answer state
        if replayed and claim.state.open:
            claim = self.follow_up(endpoint_id, claim, bookkeeping=False)
        if confirmed is None:
            confirmed = claim.state in (ClaimState.sent, ClaimState.delivered)
        if replayed and claim.state is ClaimState.superseded:
            raise Conflict(
                f"Event {claim.event_id!r} moved on without this settlement (it was superseded).",
                field="coordinates.eventId",
            )
        transport = self.transport()
        return SettlementAccepted(
            endpoint_id=endpoint_id,
            event_id=claim.event_id,
            message_type=claim.message_type.name,
            control_message_id=claim.control_message_id,
            parked_message_id=claim.parked_message_id,
            settled_by=claim.settled_by,
            transport=transport.name,
            confirmed=confirmed,
            state=claim.state.name,
            replayed=replayed,
            claimed_at=claim.claimed_at,
            follow_up=follow_up_note(
                claim.state,
                confirmed=confirmed,
                claimed_at=claim.claimed_at,
                window=transport.duplicate_window,
                endpoint_id=endpoint_id,
            ),
        )

    def follow_up(self, endpoint_id: str, claim: ClaimRow, *, bookkeeping: bool = True) -> ClaimRow:
        """Confirm an open claim, re-send it when that is safe, or (``bookkeeping``) say it cannot.

        The reconciler calls this for every due claim; a retried settlement calls it without the
        bookkeeping (it only answers, the reconciler decides when a claim is unconfirmed).
        """
        now = self.clock()
        # The row first, then the history: the resolver writes a message's history row and the event row
        # in one transaction, so a row that moved on *before* the history read cannot hide our own
        # projection (read the other way round, a projection in between looks like "moved on").
        row = self.store.get_event(endpoint_id, claim.event_id)
        projected = self.store.has_history(endpoint_id, claim.event_id, claim.control_message_id)
        moved_on = False
        if not projected:
            # A hand-off moved on when it is no longer parked by that message; an operator action's
            # event moved on when a newer message than the one it addressed was projected.
            moved_on = row is None or row.last_message_id != claim.parked_message_id
            if row is not None and not moved_on and claim.message_type in SETTLEMENT_KINDS:
                moved_on = not row.is_pending_handoff
        window = self.transport().duplicate_window
        step = next_step(
            claim.state,
            projected=projected,
            moved_on=moved_on,
            claimed_at=claim.claimed_at,
            now=now,
            window=window,
        )
        if not bookkeeping and step in (Step.WAIT, Step.UNCONFIRMED):
            # A retry re-sends at once when that is safe, else only answers.
            step = Step.RESEND if can_resend(claim.claimed_at, now, window) else Step.WAIT
        if step is Step.DELIVERED:
            return self._transition(endpoint_id, claim, ClaimState.delivered)
        if step is Step.SUPERSEDED:
            log.warning(
                "event %s/%s moved on before %s %s was confirmed; the claim is superseded",
                endpoint_id,
                claim.event_id,
                claim.message_type.name,
                claim.control_message_id,
            )
            return self._transition(endpoint_id, claim, ClaimState.superseded)
        if step is Step.RESEND:
            return self._resend(endpoint_id, claim, bookkeeping=bookkeeping)
        if step is Step.UNCONFIRMED and bookkeeping:
            if claim.state is not ClaimState.unconfirmed:
                log.error(
                    "UNCONFIRMED settlement: %s %s of event %s/%s (by %s) could not be confirmed and "
                    "cannot be re-sent safely (duplicate detection %s); operators must check the endpoint",
                    claim.message_type.name,
                    claim.control_message_id,
                    endpoint_id,
                    claim.event_id,
                    claim.settled_by,
                    "off" if window is None else f"window {window} passed",
                )
            return self._transition(
                endpoint_id, claim, ClaimState.unconfirmed, due=now + recheck_after(claim.claimed_at, now)
            )
        if step is Step.WAIT and bookkeeping:
            return self._transition(endpoint_id, claim, claim.state, due=claim.claimed_at + CONFIRM_AFTER)
        if step is Step.WAIT:
            # A retry about to answer 202 pins the claim (If-Match its ETag), so that a first sender whose
            # send is being refused right now cannot release it under that answer.
            return self._pinned(endpoint_id, claim, count=False)[0]
        return claim

    def reschedule(self, endpoint_id: str, claim: ClaimRow, due: datetime) -> ClaimRow:
        """Look at an open claim again at ``due`` (its reconcile row moves)."""
        return self._transition(endpoint_id, claim, claim.state, due=due)

    def _resend(self, endpoint_id: str, claim: ClaimRow, *, bookkeeping: bool) -> ClaimRow:
        """The identical message again (same MessageId, body, properties): the topic drops a second copy.

        The attempt is recorded on the claim first (``If-Match`` its ETag) and only then sent: a sender
        whose own send was refused releases the claim ``If-Match`` the ETag it wrote, so the release and
        this re-send exclude each other. Without that, a claim released just after a concurrent re-send
        reached the broker would free the hand-off for a second, different message.
        """
        taken, won = self._pinned(endpoint_id, claim, count=True)
        if not won:  # changed by someone else meanwhile: they own this attempt (a retry awaits its outcome)
            if bookkeeping:
                return taken
            return await_sender(self.store, endpoint_id, taken, clock=self.clock, until_sent=True)
        now, window = self.clock(), self.transport().duplicate_window
        if not can_resend(claim.claimed_at, now, window):
            # The pin write took long enough (storage retries, a paused process) to cross the deadline:
            # checked again right before the send, whose own worst case the margin covers.
            log.warning(
                "re-send of %s for %s/%s: the re-send deadline passed during the pin write; not sent",
                claim.control_message_id,
                endpoint_id,
                claim.event_id,
            )
            if not bookkeeping:
                return taken
            return self._transition(
                endpoint_id, taken, ClaimState.unconfirmed, due=now + recheck_after(claim.claimed_at, now)
            )
        message = taken.outbox_message()
        with telemetry.span(
            "settle.handoff.resend",
            {
                "nimbus.endpoint": endpoint_id,
                "nimbus.event_id": claim.event_id,
                "nimbus.control_message_id": claim.control_message_id,
                "settle.attempts": taken.attempts,
            },
            links=[message.properties],  # the settlement that claimed it (its context travels unchanged)
        ) as span:
            return self._resend_claimed(endpoint_id, claim, taken, message, span, bookkeeping=bookkeeping)

    def _resend_claimed(
        self,
        endpoint_id: str,
        claim: ClaimRow,
        taken: ClaimRow,
        message: OutboxMessage,
        span: telemetry.SpanHandle,
        *,
        bookkeeping: bool,
    ) -> ClaimRow:
        try:
            self.transport().send(endpoint_id, message.to_service_bus())
        except Exception:
            log.warning(
                "re-send of %s for %s/%s failed",
                claim.control_message_id,
                endpoint_id,
                claim.event_id,
                exc_info=True,
            )
            span.set_outcome("failed")
            if not bookkeeping:
                return taken
            return self._transition(endpoint_id, taken, taken.state, due=self.clock() + RETRY_AFTER)
        log.info("re-sent %s for %s/%s", claim.control_message_id, endpoint_id, claim.event_id)
        span.set_outcome("sent")
        return self._transition(endpoint_id, taken, ClaimState.sent, sent=True)

    def _pinned(self, endpoint_id: str, claim: ClaimRow, *, count: bool) -> tuple[ClaimRow, bool]:
        """The claim after a conditional write (``If-Match`` its ETag; ``count``: one more send attempt),
        and whether the write was ours.

        A refused first send releases its claim ``If-Match`` the ETag it wrote, so this write and that
        release exclude each other. Another change won the race: the claim as it is now, and False. The
        claim is gone (released): 503, the same settlement must start again.
        """
        now = self.clock()
        entity: dict[str, Any] = {
            "PartitionKey": self.store.event_partition(endpoint_id, claim.event_id),
            "RowKey": keys.claim_row(claim.event_id, claim.parked_message_id),
            "UpdatedAt": now,
        }
        if count:
            entity["Attempts"] = claim.attempts + 1
        try:
            [result] = self.store.submit([store.merge(entity, claim.etag or "*")])
        except Exception:
            current = self.store.get_claim(endpoint_id, claim.event_id, claim.parked_message_id)
            if current is None:
                raise SendRefused(
                    f"The settlement of event {claim.event_id!r} was released (its send was refused); retry."
                ) from None
            log.info("claim of %s/%s changed meanwhile", endpoint_id, claim.event_id)
            return current, False
        update: dict[str, Any] = {"etag": result.get("etag"), "updated_at": now}
        if count:
            update["attempts"] = claim.attempts + 1
        return claim.model_copy(update=update), True

    def _transition(
        self,
        endpoint_id: str,
        claim: ClaimRow,
        state: ClaimState,
        *,
        due: datetime | None = None,
        sent: bool = False,
        attempt: bool = False,
        again: int = 3,
    ) -> ClaimRow:
        """Move the claim (``If-Match`` its ETag) with its index rows in one transaction; best effort.

        ``due``: keep it open and look again then. A lost race (another instance moved it first) or a
        storage fault leaves it as it was: the reconciler looks again.
        """
        pk = self.store.event_partition(endpoint_id, claim.event_id)
        now = self.clock()
        new_reconcile = (
            keys.reconcile_row(due, claim.event_id, claim.parked_message_id) if due and state.open else None
        )
        unconfirmed_key = keys.unconfirmed_row(claim.event_id, claim.parked_message_id)
        changes: dict[str, Any] = {
            "State": state.name,
            "UpdatedAt": now,
            "ReconcileKey": new_reconcile or "",
            "UnconfirmedKey": unconfirmed_key if state is ClaimState.unconfirmed else "",
        }
        attempts = claim.attempts + (1 if attempt else 0)
        if attempt:
            changes["Attempts"] = attempts
        if sent:
            changes["LastSentAt"] = now
        ops: list[Operation] = [
            store.merge(
                {
                    "PartitionKey": pk,
                    "RowKey": keys.claim_row(claim.event_id, claim.parked_message_id),
                    **changes,
                },
                claim.etag or "*",
            )
        ]
        if claim.reconcile_key and claim.reconcile_key != new_reconcile:
            ops.append(store.delete(pk, claim.reconcile_key))
        if new_reconcile and new_reconcile != claim.reconcile_key:
            row = ReconcileRow(event_id=claim.event_id, parked_message_id=claim.parked_message_id, due_at=due)
            ops.append(store.insert(row.to_entity(pk, new_reconcile)))
        if state is ClaimState.unconfirmed and not claim.unconfirmed_key:
            shown = UnconfirmedRow(
                event_id=claim.event_id,
                parked_message_id=claim.parked_message_id,
                control_message_id=claim.control_message_id,
                message_type=claim.message_type,
                settled_by=claim.settled_by,
                claimed_at=claim.claimed_at,
                since=now,
            )
            ops.append(store.insert(shown.to_entity(pk, unconfirmed_key)))
        if claim.unconfirmed_key and state is not ClaimState.unconfirmed:
            ops.append(store.delete(pk, claim.unconfirmed_key))
        try:
            etags = self.store.submit(ops)
        except Exception:
            retried = self._progress_again(
                endpoint_id, claim, state, sent=sent, attempt=attempt, due=due, again=again
            )
            if retried is not None:
                return retried
            log.warning(
                "claim of %s/%s: could not record %s", endpoint_id, claim.event_id, state.name, exc_info=True
            )
            return claim.model_copy(update={"state": state if sent else claim.state})
        return claim.model_copy(
            update={
                "state": state,
                "etag": etags[0].get("etag") if etags else None,
                "attempts": attempts,
                "reconcile_key": new_reconcile,
                "unconfirmed_key": unconfirmed_key if state is ClaimState.unconfirmed else None,
                "last_sent_at": now if sent else claim.last_sent_at,
                "updated_at": now,
            }
        )

    def _progress_again(
        self,
        endpoint_id: str,
        claim: ClaimRow,
        state: ClaimState,
        *,
        sent: bool,
        attempt: bool,
        due: datetime | None,
        again: int,
    ) -> ClaimRow | None:
        """A transition that records progress (``sent``, ``delivered``) lost its ``If-Match`` to another
        writer of the claim (a retry's pin, a reconciler's attempt count): apply it again on the claim as
        it is now, while that is still behind it. Without this, a broker-acknowledged send would stay
        ``sending`` and could later be listed ``unconfirmed`` (a false alarm). None: nothing was redone."""
        behind = {
            ClaimState.sent: (ClaimState.sending, ClaimState.unconfirmed),
            ClaimState.delivered: (ClaimState.sending, ClaimState.unconfirmed, ClaimState.sent),
        }.get(state)
        if behind is None or again <= 0:
            return None
        try:
            current = self.store.get_claim(endpoint_id, claim.event_id, claim.parked_message_id)
        except Exception:
            return None
        if current is None or current.etag == claim.etag or current.state not in behind:
            return None
        log.info(
            "claim of %s/%s changed meanwhile; recording %s again", endpoint_id, claim.event_id, state.name
        )
        moved = self._transition(
            endpoint_id, current, state, due=due, sent=sent, attempt=attempt, again=again - 1
        )
        return moved if moved.etag != current.etag else None

    def _release(self, endpoint_id: str, row: EventRow, claim: ClaimRow) -> bool:
        """Undo a claim whose send certainly reached nothing; False when the claim may still stand."""
        from azure.data.tables import TableTransactionError

        pk = self.store.event_partition(endpoint_id, row.event_id)
        ops: list[Operation] = [
            store.delete(pk, keys.claim_row(row.event_id, claim.parked_message_id), claim.etag),
            store.delete(pk, claim.audit_key),
        ]
        if claim.reconcile_key:
            ops.append(store.delete(pk, claim.reconcile_key))
        if row.queue_key:
            ops.append(store.merge({"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": UNCLAIMED}))
        try:
            try:
                self.store.submit(ops)
            except TableTransactionError as exc:
                if row.queue_key and exc.index == len(ops) - 1 and exc.status_code == 404:
                    self.store.submit(ops[:-1])  # the index row is gone: release the claim alone
                else:
                    raise
        except Exception:
            log.warning("could not release the claim on %s/%s", endpoint_id, row.event_id, exc_info=True)
            try:
                still = self.store.get_claim(endpoint_id, row.event_id, claim.parked_message_id)
            except Exception:
                return True  # unknown: the caller's retry meets its own claim if it is still there
            return still is None
        return True


def audit_data(s: Settlement, control_message_id: str, parked: str) -> str:
    """The audit's ``Data``: valid JSON of at most 4,000 characters (long fields are cut, not the JSON)."""
    return bounded_json(
        {
            "controlMessageId": control_message_id,
            "parkedMessageId": parked,
            "result": result_json(s.result),
            "errorText": s.error_text,
            "errorType": s.error_type,
            "agentId": s.agent_id,
            "principalName": s.principal_name,
            "principalId": s.principal_id,
        }
    )
