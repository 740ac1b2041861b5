"""Settlement of a parked hand-off: check → claim (an outbox record) → send → mark. 202: Settle owns it.

The claim row, keyed (endpoint, event id, parked message id), holds the exact control message and its
audit (who, when, the audit's type and data: the event's audits render the entry from it, ADR-0022 change
3), and is written in one transaction with the queue's ``ClaimedUntil`` mark, which also says when the
reconciler first looks at it (``ReconcileAt``, ADR-0022 change 9), *before* the send
(``docs/adr/0012-settlement-outbox.md``):

* the send succeeds → the claim becomes ``sent`` → 202 ``confirmed: true``;
* the send certainly reached nothing (:class:`~handoff.messages.transport.SendRefused`) → claim (and so
  its audit) deleted and the mark cleared in one transaction → 503, and a retry starts clean;
* anything else (a timeout, a link lost during the send, the process killed) → the claim stays
  ``sending`` → 202 ``confirmed: false``; the reconciler confirms it from the resolver's history, re-sends
  the identical message while duplicate detection covers it, or shows it as unconfirmed.

A claim whose message was (or may have been) sent is never taken over: another settlement of the same
hand-off is a 409 ``settlement-in-flight`` however old the claim is. The same settlement retried (same
kind, request and caller) is answered from its claim with the same ``controlMessageId``. Two settlements
of one hand-off can never both be sent, on any number of instances: the claim is insert-only.

The rules (when a claim is taken, replayed, moved, released) are :mod:`handoff.settlement.claims`; following
up a claim
(the reconciler, a retry, a refused send) is :mod:`handoff.settlement.follow_up`. This module reads, asks,
submits.
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

from pydantic import BaseModel, ConfigDict

from common import telemetry
from common import transactions as tx
from common.clock import utcnow
from common.errors import Conflict, NotFound, PayloadTooLarge, SettleError
from common.http import dependency_problem
from common.models import from_fields
from handoff.messages.contract import (
    Coordinates,
    MessageType,
    control_message,
    settlement_content,
)
from handoff.messages.outbound import OutboxMessage
from handoff.messages.transport import MAX_SEND_BYTES, SendRefused, Transport, encoded_size
from handoff.settlement import claims
from handoff.settlement.claims import ClaimOrder, ClaimRefused, SettlementInFlight, request_digest
from handoff.settlement.follow_up import ClaimFollowUp
from handoff.settlement.in_flight import await_sender, first_send_in_flight
from handoff.settlement.timing import CONFIRM_AFTER, SEND_DEADLINE, follow_up_note
from handoff.storage.claim_state import ClaimState
from handoff.storage.json_text import bounded_json
from handoff.storage.records import ClaimRow, EventRow
from handoff.storage.store import HandoffStore

log = logging.getLogger("settle.settlement")

_CLAIM_ATTEMPTS = 3


# Telemetry outcomes of refused settlements (others are named by their problem slug).
_REFUSALS: dict[type[SettleError], str] = {
    SettlementInFlight: "in-flight",
    Conflict: "refused",
    NotFound: "not-found",
    PayloadTooLarge: "too-large",
    SendRefused: "unavailable",
}


class Settled(BaseModel):
    """What a settlement came to (the blueprints shape it into the API's answer): the claim Settle owns, the
    transport that carries its one control message, and whether the broker acknowledged it."""

    model_config = ConfigDict(frozen=True)

    endpoint_id: str
    event_id: str
    message_type: str
    control_message_id: str
    parked_message_id: str
    settled_by: str
    transport: str
    confirmed: bool
    state: str  # the claim's state: sent, delivered, sending, unconfirmed
    replayed: bool
    claimed_at: datetime
    follow_up: str | None = None  # unconfirmed only: how Settle confirms or re-sends, where operators look


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
        # The follow-up asks this service's clock at each use, so a clock set on the service holds for both.
        self.follow_up = ClaimFollowUp(store_, transport, lambda: self.clock())

    # -- settle ---------------------------------------------------------------------------------------

    def settle(self, s: Settlement, *, current: EventRow | None = None) -> Settled:
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

    def _settle(self, s: Settlement, current: EventRow | None) -> Settled:
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

    def submit(self, order: ClaimOrder, row: EventRow, message: OutboxMessage, data: str) -> Settled:
        """Claim (the claim carries its audit, ``data`` the audit's ``Data``), send, answer: the outbox path
        of any control message. A claim already there for the same request answers its retry; another
        request's is a 409."""
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
        """Write the claim transaction (:func:`handoff.settlement.claims.plan_claim`); or return the claim
        already
        there for this request (a retry)."""
        plan = claims.plan_claim(
            s,
            row,
            message,
            data,
            pk=self.store.event_partition(s.endpoint_id, row.event_id),
            now=self.clock(),
        )
        claim, parked = plan.claim, s.addressed_message_id
        for _ in range(_CLAIM_ATTEMPTS):
            ops = plan.ops
            if plan.fence is not None:
                held = self._held_queue_row(s, row)
                if isinstance(held, ClaimRow):
                    return claim, held  # our own settlement, retried after the lease ended with it
                ops = plan.fenced(held)
            try:
                answers = self.store.submit(ops)
            except Exception as exc:
                refused = tx.refusal(exc)
                if refused is None:
                    # The answer may have been lost after the transaction applied: read back before deciding.
                    ours = self._read_back(s.endpoint_id, row.event_id, parked, exc)
                    if ours.control_message_id != message.message_id:
                        return claim, claims.replay(ours, s.digest)
                    claim.etag = ours.etag
                    return claim, None
                verdict = claims.claim_refused(plan, refused)
                if verdict is ClaimRefused.TAKEN:
                    existing = self.store.get_claim(s.endpoint_id, row.event_id, parked)
                    if existing is None:
                        continue  # released between our write and our read: try again
                    return claim, claims.replay(existing, s.digest)
                if verdict is ClaimRefused.LEASE_MOVED:
                    continue  # a renewal, a new lease: read the queue row again
                if verdict is ClaimRefused.EVENT_MOVED:
                    raise Conflict(
                        f"Event {row.event_id!r} changed while the {s.audit_type} was being claimed "
                        "(a newer message was projected); look at it again.",
                        field="eventId",
                    ) from exc
                if verdict is ClaimRefused.NOT_PARKED:
                    raise self._not_parked_any_more(row) from exc
                raise
            claim.etag = answers[0].get("etag") if answers else None
            return claim, None
        raise SettlementInFlight(
            f"A settlement of event {row.event_id!r} kept changing; retry.", field="coordinates.messageId"
        )

    def _held_queue_row(self, s: ClaimOrder, row: EventRow) -> str | ClaimRow:
        """The ETag of the queue row while it holds ``s.lease_token``; else the claim of the same request
        (a retry), else 409 lease-lost: another agent holds the hand-off now."""
        assert row.queue_key is not None
        queued = self.store.get_queue_row(s.endpoint_id, row.event_id, row.queue_key)
        if queued is None:
            raise self._not_parked_any_more(row)
        if claims.holds_lease(queued, s.lease_token) and queued.etag:
            return queued.etag
        existing = self.store.get_claim(s.endpoint_id, row.event_id, s.addressed_message_id)
        return claims.retried_or_lost(s, existing)

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

    def answer_addressed(
        self, endpoint_id: str, event_id: str, addressed_message_id: str, digest: str
    ) -> Settled | None:
        """The answer to a retry of the request ``digest`` addressed to that message, from its claim (one
        point read); None when the message has no claim; 409 in-flight when another request holds it."""
        claim = self.store.get_claim(endpoint_id, event_id, addressed_message_id)
        if claim is None:
            return None
        return self._answer(endpoint_id, claims.replay(claim, digest), replayed=True)

    def replay_or_refuse(self, endpoint_id: str, event_id: str, digest: str, refusal: Conflict) -> Settled:
        """The row is not (or no longer) in a state the request needs: answer a retry of a request made
        before (the event's claims are one short range read), else raise ``refusal``."""
        claim = claims.replayable(self.store.claims(endpoint_id, event_id), digest)
        if claim is None:
            raise refusal
        return self._answer(endpoint_id, claim, replayed=True)

    # -- send and follow-up -------------------------------------------------------------------------

    def _send_claimed(self, endpoint_id: str, row: EventRow, claim: ClaimRow) -> Settled:
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
            if self.follow_up.release(endpoint_id, row, claim):
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
            # Count the attempt (best effort); the claim stays ``sending`` and due for the reconciler (through
            # its queue mark, or its reconcile row: neither moves).
            due = None if claims.followed_on_queue(claim) else claim.claimed_at + CONFIRM_AFTER
            claim = self.follow_up.transition(endpoint_id, claim, claim.state, due=due, attempt=True)
            return self._answer(endpoint_id, claim, replayed=False)
        log.info(
            "%s sent for %s/%s by %s", claim.message_type.name, endpoint_id, row.event_id, claim.settled_by
        )
        sent = self.follow_up.transition(endpoint_id, claim, ClaimState.sent, sent=True, attempt=True)
        return self._answer(endpoint_id, sent, replayed=False, confirmed=True)

    def _answer(
        self, endpoint_id: str, claim: ClaimRow, *, replayed: bool, confirmed: bool | None = None
    ) -> Settled:
        if replayed and first_send_in_flight(claim, self.clock()):
            claim = await_sender(self.store, endpoint_id, claim, clock=self.clock)  # one answer state
        if replayed and claim.state.open:
            claim = self.follow_up.advance(endpoint_id, claim, bookkeeping=False)
        if confirmed is None:
            confirmed = claim.state in (ClaimState.sent, ClaimState.delivered)
        if replayed and claim.state is ClaimState.superseded:
            raise Conflict(
                f"Event {claim.event_id!r} moved on without this settlement (it was superseded).",
                field="coordinates.eventId",
            )
        transport = self.transport()
        return from_fields(
            Settled,
            claim,
            endpoint_id=endpoint_id,
            message_type=claim.message_type.name,
            transport=transport.name,
            confirmed=confirmed,
            state=claim.state.name,
            replayed=replayed,
            follow_up=follow_up_note(
                claim.state,
                confirmed=confirmed,
                claimed_at=claim.claimed_at,
                window=transport.duplicate_window,
                endpoint_id=endpoint_id,
            ),
        )


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
