"""The rules of a settlement claim, pure: when a claim may be taken, replayed, moved or released, and the
table operations that do it. No I/O.

:class:`~handoff.settlement.settler.SettlementService` and its follow-up (:mod:`handoff.settlement.follow_up`)
read the rows, ask these functions, submit what they return, hand a refused write to
:func:`common.transactions.refusal` and ask again. Every rule is here once:

* taken: :func:`plan_claim` (insert-only, so of two settlements of one hand-off only one is ever written),
  fenced by a lease (:func:`holds_lease`) and refused as :func:`claim_refused` says;
* replayed: :func:`replay` (the same request is answered from its claim, another is a 409);
* moved: :func:`plan_transition` (``If-Match`` the claim, with its index rows), redone over a lost race
  only while the claim is behind it (:func:`redo`), else answered as storage holds it (:func:`unrecorded`);
* pinned: :func:`plan_pin` (a re-send and a retry's 202 exclude a release of the claim);
* released: :func:`plan_release`, only after a send that certainly reached nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from common import transactions as tx
from common.errors import Conflict
from common.transactions import Operation, Refusal
from handoff.messages.contract import MessageType
from handoff.messages.outbound import OutboxMessage
from handoff.receive.leases import CLAIMED, UNCLAIMED, LeaseLost
from handoff.settlement.timing import CONFIRM_AFTER
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.records import (
    ClaimRow,
    EventRow,
    QueueRow,
    ReconcileRow,
    UnconfirmedRow,
    columns_of,
)


class SettlementInFlight(
    Conflict, slug="settlement-in-flight", title="Another settlement of this hand-off is in flight"
):
    """Another settlement of this hand-off holds the claim (409, whatever its age)."""


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


# -- taken ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimPlan:
    """The claim transaction: the claim (its own audit, ADR-0022 change 3) inserted, and either the queue
    row marked with when the reconciler first looks (a hand-off's settlement, ADR-0022 change 9) or a
    reconcile row inserted; (operator actions) the event row pinned. ``fence``/``pin``: the position of the
    lease-fenced queue mark and of the event pin in ``ops`` (None: not part of it)."""

    claim: ClaimRow
    ops: list[Operation]
    fence: int | None
    pin: int | None

    def fenced(self, queue_etag: str) -> list[Operation]:
        """The operations with the queue mark ``If-Match`` the queue row as read holding the lease."""
        assert self.fence is not None
        mark = self.ops[self.fence][1]
        return [*self.ops[: self.fence], tx.merge(mark, queue_etag), *self.ops[self.fence + 1 :]]


def plan_claim(
    order: ClaimOrder, row: EventRow, message: OutboxMessage, data: str, *, pk: str, now: datetime
) -> ClaimPlan:
    """The claim of ``message`` for ``row`` (``data``: the audit's ``Data``), taken at ``now``.

    The claim is the audit: it carries the audit's type, comment and ``Data`` and the event's endpoint and
    type, and readers render the entry from it (:meth:`~handoff.storage.records.ClaimRow.audit`); no audit
    row is written beside it."""
    parked = order.addressed_message_id
    # A settlement of a queued hand-off is found by the reconciler through its queue mark (``ReconcileAt``,
    # ADR-0022 change 9); any other claim through a reconcile row of its own.
    on_queue = order.marks_queue and bool(row.queue_key)
    reconcile_key = "" if on_queue else keys.reconcile_row(now + CONFIRM_AFTER, row.event_id, parked)
    claim = ClaimRow(
        event_id=row.event_id,
        parked_message_id=parked,
        state=ClaimState.sending,
        claimed_at=now,
        updated_at=now,
        control_message_id=message.message_id,
        message_type=order.kind,
        request_digest=order.digest,
        settled_by=order.by,
        agent_id=order.agent_id,
        principal_name=order.principal_name,
        principal_id=order.principal_id,
        attempts=0,
        # Empty: the audit is rendered from the claim. Written (not left out) for a reader from before,
        # which needs the column on every claim.
        audit_key="",
        reconcile_key=reconcile_key,
        control_envelope=message.envelope_json(),
        control_body=message.body,
        audit_type=order.audit_type,
        audit_comment=order.audit_comment,
        audit_data=data,
        endpoint_id=row.endpoint_id,
        event_type_id=row.event_type_id,
    )
    ops: list[Operation] = [tx.insert(claim.to_entity(pk, keys.claim_row(row.event_id, parked)))]
    if reconcile_key:
        due = ReconcileRow(event_id=row.event_id, parked_message_id=parked, due_at=now + CONFIRM_AFTER)
        ops.append(tx.insert(due.to_entity(pk, reconcile_key)))
    fence: int | None = None
    if on_queue:
        assert row.queue_key is not None
        # If-Match *: the index row must still exist, i.e. the hand-off was not projected away.
        # With a lease token, If-Match the queue row as read holding that token (see ``fenced``).
        fence = len(ops) if order.lease_token else None
        mark = {"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": CLAIMED}
        ops.append(tx.merge({**mark, "ReconcileAt": now + CONFIRM_AFTER}))
    pin: int | None = None
    if order.pins_event:
        if row.etag is None:
            raise ValueError("an operator action needs the event row's ETag")
        pin = len(ops)
        entity = {"PartitionKey": pk, "RowKey": keys.event_row(row.event_id), "OperatorClaimAt": now}
        ops.append(tx.merge(entity, row.etag))
    return ClaimPlan(claim, ops, fence, pin)


class ClaimRefused(Enum):
    """What a refused claim transaction means."""

    TAKEN = "taken"  # the claim row exists: answer the same request from it, refuse another
    LEASE_MOVED = "lease-moved"  # the fenced queue row changed (a renewal, a new lease): read it again
    EVENT_MOVED = "event-moved"  # the pinned event row changed: the operator must look again (409)
    NOT_PARKED = "not-parked"  # a row the claim needs is gone: the hand-off was projected away (409)
    OTHER = "other"  # no rule covers it: raise


def claim_refused(plan: ClaimPlan, refused: Refusal) -> ClaimRefused:
    """Which rule a refusal of the claim transaction falls under."""
    if refused.at(0) and refused.status == 409:
        return ClaimRefused.TAKEN
    if refused.at(plan.fence) and refused.status == 412:
        return ClaimRefused.LEASE_MOVED
    if refused.at(plan.pin):
        return ClaimRefused.EVENT_MOVED
    if refused.status == 404:
        return ClaimRefused.NOT_PARKED
    return ClaimRefused.OTHER


def holds_lease(queued: QueueRow, token: str | None) -> bool:
    """The queue row as read is held by ``token`` (a claim fenced by it may be written If-Match it)."""
    return queued.lease_token == token and bool(queued.etag)


# ``ReconcileAt`` of a queue mark the reconciler has handled: after every time it compares with.
RECONCILED = datetime(9999, 12, 31, tzinfo=UTC)


def followed_on_queue(claim: ClaimRow) -> bool:
    """The claim is still due through its queue mark (``ReconcileAt``), not a reconcile row of its own: a
    hand-off's settlement still ``sending`` that no follow-up has given a later look yet."""
    return claim.state is ClaimState.sending and not claim.reconcile_key


def plan_queue_look(pk: str, queued: QueueRow, at: datetime) -> Operation:
    """Move the queue mark's ``ReconcileAt`` to ``at`` (``RECONCILED``: handled), ``If-Match`` the queue row
    as the reconciler read it: a claim released and taken again since has its own mark, never moved here."""
    assert queued.row_key is not None and queued.etag is not None
    return tx.merge({"PartitionKey": pk, "RowKey": queued.row_key, "ReconcileAt": at}, queued.etag)


def retried_or_lost(order: ClaimOrder, existing: ClaimRow | None) -> ClaimRow:
    """The lease no longer holds the hand-off: our own claim, if this is a retry of the request that wrote
    it after the lease ended with it; else 409 lease-lost (another agent holds it now)."""
    if existing is not None and existing.request_digest == order.digest:
        return existing
    raise LeaseLost(
        f"The lease on event {order.event_id!r} was lost (it expired and another agent holds it now, or it "
        "was released); this settlement was not sent.",
        field="leaseToken",
    )


# -- replayed ---------------------------------------------------------------------------------------


def replay(existing: ClaimRow, digest: str) -> ClaimRow:
    """A claim already there answers a retry of the request that wrote it; any other request is a 409,
    however old the claim is (its message was, or may have been, sent)."""
    if existing.request_digest == digest:
        return existing
    raise SettlementInFlight(
        f"A settlement of event {existing.event_id!r} ({existing.message_type.name} by "
        f"{existing.settled_by!r}, {existing.state.name}) is already in flight.",
        field="coordinates.messageId",
    )


def replayable(claims: list[ClaimRow], digest: str) -> ClaimRow | None:
    """Of an event's claims, the one that answers a retry of request ``digest`` (a superseded claim answers
    nothing: the event moved on without it)."""
    for claim in claims:
        if claim.request_digest == digest and claim.state is not ClaimState.superseded:
            return claim
    return None


# -- moved --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """A claim's move: ``ops`` (the claim ``If-Match`` its ETag, with its index rows) and the claim as it
    is once they are applied (its new ETag comes from the answer: :meth:`applied`)."""

    ops: list[Operation]
    moved: ClaimRow

    def applied(self, answers: list[dict[str, Any]]) -> ClaimRow:
        return self.moved.model_copy(update={"etag": answers[0].get("etag") if answers else None})


def plan_transition(
    pk: str,
    claim: ClaimRow,
    state: ClaimState,
    *,
    now: datetime,
    due: datetime | None = None,
    sent: bool = False,
    attempt: bool = False,
) -> Transition:
    """Move ``claim`` to ``state``; ``due``: keep it open and look again then (its reconcile row moves);
    ``sent``: the broker acknowledged a send now; ``attempt``: count one more send attempt. An unconfirmed
    claim is listed for operators (its unconfirmed row), any other is not."""
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
    claim_key = keys.claim_row(claim.event_id, claim.parked_message_id)
    ops: list[Operation] = [tx.merge({"PartitionKey": pk, "RowKey": claim_key, **changes}, claim.etag or "*")]
    if claim.reconcile_key and claim.reconcile_key != new_reconcile:
        ops.append(tx.delete(pk, claim.reconcile_key))
    if new_reconcile and new_reconcile != claim.reconcile_key:
        assert due is not None
        row = ReconcileRow(event_id=claim.event_id, parked_message_id=claim.parked_message_id, due_at=due)
        ops.append(tx.insert(row.to_entity(pk, new_reconcile)))
    if state is ClaimState.unconfirmed and not claim.unconfirmed_key:
        shown = columns_of(UnconfirmedRow, claim, since=now)
        ops.append(tx.insert(shown.to_entity(pk, unconfirmed_key)))
    if claim.unconfirmed_key and state is not ClaimState.unconfirmed:
        ops.append(tx.delete(pk, claim.unconfirmed_key))
    moved = claim.model_copy(
        update={
            "state": state,
            "etag": None,
            "attempts": attempts,
            "reconcile_key": new_reconcile,
            "unconfirmed_key": unconfirmed_key if state is ClaimState.unconfirmed else None,
            "last_sent_at": now if sent else claim.last_sent_at,
            "updated_at": now,
        }
    )
    return Transition(ops, moved)


# A move that records progress, and the states of a claim still behind it.
_BEHIND = {
    ClaimState.sent: (ClaimState.sending, ClaimState.unconfirmed),
    ClaimState.delivered: (ClaimState.sending, ClaimState.unconfirmed, ClaimState.sent),
}


def redo(claim: ClaimRow, current: ClaimRow | None, state: ClaimState) -> bool:
    """Apply a lost move to ``state`` again on the claim as it is now (``current``): only a move that records
    progress (``sent``, ``delivered``), when someone else wrote the claim since (another ETag) and it is
    still behind ``state`` (without that, a broker-acknowledged send would stay ``sending`` and could later
    be listed ``unconfirmed``: a false alarm)."""
    behind = _BEHIND.get(state)
    return (
        behind is not None and current is not None and current.etag != claim.etag and current.state in behind
    )


def unrecorded(claim: ClaimRow, current: ClaimRow | None, *, sent: bool) -> ClaimRow:
    """The claim as answered when its move could not be written (and was not redone), ``current`` being the
    claim read again afterwards (None: gone or unreadable).

    Another writer moved it since (another ETag): as storage holds it, whoever wrote that (an identical
    move that won the race, such as another replay's ``delivered``); a replay never answers the state it
    read before it lost. Nobody else wrote it (a storage fault): as it was. Either way a send the broker
    acknowledged is answered ``sent`` while the claim is still behind that (the reconciler confirms it)."""
    answered = current if current is not None and current.etag != claim.etag else claim
    if sent and answered.state in _BEHIND[ClaimState.sent]:
        return answered.model_copy(update={"state": ClaimState.sent})
    return answered


SETTLEMENT_KINDS = frozenset({MessageType.HandoffCompletedRequest, MessageType.HandoffFailedRequest})


def moved_on(claim: ClaimRow, row: EventRow | None) -> bool:
    """The event moved on without the claim's message (asked only while that message is not projected):
    a hand-off moved on when it is no longer parked by the message it settles; an operator action's event
    when a newer message than the one it addressed was projected."""
    if row is None or row.last_message_id != claim.parked_message_id:
        return True
    return claim.message_type in SETTLEMENT_KINDS and not row.is_pending_handoff


# -- pinned -------------------------------------------------------------------------------------------


def plan_pin(pk: str, claim: ClaimRow, *, now: datetime, count: bool) -> Operation:
    """Write the claim ``If-Match`` its ETag (``count``: one more send attempt). A refused first send
    releases its claim ``If-Match`` the ETag it wrote, so this write and that release exclude each other."""
    entity: dict[str, Any] = {
        "PartitionKey": pk,
        "RowKey": keys.claim_row(claim.event_id, claim.parked_message_id),
        "UpdatedAt": now,
    }
    if count:
        entity["Attempts"] = claim.attempts + 1
    return tx.merge(entity, claim.etag or "*")


def pinned(claim: ClaimRow, answer: dict[str, Any], *, now: datetime, count: bool) -> ClaimRow:
    """The claim after its pin was written (``answer``: the write's result)."""
    update: dict[str, Any] = {"etag": answer.get("etag"), "updated_at": now}
    if count:
        update["attempts"] = claim.attempts + 1
    return claim.model_copy(update=update)


# -- released -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """Undo a claim whose send certainly reached nothing: the claim (``If-Match`` the ETag its sender
    wrote) and with it the audit rendered from it, its reconcile row (if it has one), the audit row of a
    claim written before the audit was rendered (``audit_key``), and the queue mark (``mark``: its position,
    None without one)."""

    ops: list[Operation]
    mark: int | None

    def again(self, refused: Refusal | None) -> list[Operation] | None:
        """The operations to submit again after ``refused``: without the queue mark when only the queue
        row was gone (the hand-off was projected away meanwhile); None: nothing to retry."""
        if refused is not None and refused.at(self.mark) and refused.status == 404:
            return self.ops[: self.mark]
        return None


def plan_release(pk: str, row: EventRow, claim: ClaimRow) -> Release:
    ops: list[Operation] = [tx.delete(pk, keys.claim_row(row.event_id, claim.parked_message_id), claim.etag)]
    if claim.audit_key:
        ops.append(tx.delete(pk, claim.audit_key))
    if claim.reconcile_key:
        ops.append(tx.delete(pk, claim.reconcile_key))
    mark: int | None = None
    if row.queue_key:
        mark = len(ops)
        ops.append(tx.merge({"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": UNCLAIMED}))
    return Release(ops, mark)


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
