"""What one resolver message does to the event row: NimBus's ``UpdateState`` as a pure function.

Given the typed message and the current event row (or none), decide: the new row (applied) or a refusal
(Spec 030), and the bookkeeping the next projection needs (:func:`project`); then the one transaction
that writes it (:func:`plan_projection`) and what a refusal of that transaction means
(:func:`projection_refused`). No I/O; :mod:`handoff.projection.resolver` reads, submits and decides again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from common import transactions as tx
from common.models import from_fields
from common.transactions import Operation, Refusal
from handoff.messages.contract import MANAGER_ID, InboundMessage, MessageType, ResolutionStatus
from handoff.projection import guard
from handoff.projection.status_map import overrides_processing_time, pending_sub_status, status_for
from handoff.storage import counts, keys
from handoff.storage.json_text import text_at
from handoff.storage.records import (
    AuditRow,
    EventRow,
    HistoryRow,
    ListingRow,
    QueueRow,
    System,
    TableRecord,
    columns_of,
    int64,
)

RESOLVER_AUDITOR = "Resolver"


@dataclass(frozen=True)
class Projection:
    """The decision for one message: ``row`` is the new event row when applied, else None (refused)."""

    status: ResolutionStatus
    applied: bool
    row: EventRow | None
    request_enqueued_at: datetime | None
    handoff_seen: bool
    # Why a refusal was not the usual stale one (the Resolver Comment says it instead).
    refusal: str | None = None


def history_row(m: InboundMessage, *, now: datetime, sequence: int) -> HistoryRow:
    """The per-message history row (``MessageEntity``), as received."""
    return from_fields(
        HistoryRow,
        m,
        endpoint_id=m.endpoint_id,
        message_content=m.body_text or None,
        pending_sub_status=pending_sub_status(m.message_type),
        throttle_retry_count=m.throttle_retry_count or None,
        recorded_at=now,
        input_notes="\n".join(m.input_notes) or None,
        sequence=sequence,
    )


def project(m: InboundMessage, current: EventRow | None, *, now: datetime) -> Projection:
    """Decide the projection of ``m`` over ``current`` (status map, guard, override, index keys)."""
    status = status_for(m.message_type, dead_letter_error_description=m.dead_letter_error_description)
    # Bookkeeping stands in for NimBus's history read: it is updated even when the write is refused,
    # because NimBus's history keeps refused messages too.
    request_at = current.request_enqueued_at if current else None
    if m.message_type is MessageType.EventRequest and (
        request_at is None or m.enqueued_time_utc < request_at
    ):
        request_at = m.enqueued_time_utc
    handoff_seen = (
        bool(current and current.handoff_seen) or m.message_type is MessageType.PendingHandoffResponse
    )

    current_view = (
        guard.CurrentRow(
            resolution_status=current.resolution_status,
            message_type=current.message_type,
            parent_message_id=current.parent_message_id,
            last_message_id=current.last_message_id,
        )
        if current
        else None
    )
    if current is not None and other_session_than_park(m, current):
        # One row per (endpoint, event), where NimBus keeps one per session: another session's message
        # never replaces a park (it would vanish from ``next`` and could no longer be settled). It is kept
        # in the history, with a Comment saying so (docs/tables.md, "Sessions").
        refusal = (
            f"Kept the park of session {current.session_id!r}: {m.message_type.name} {m.message_id} of "
            f"session {m.session_id!r} for the same event is recorded in the history only."
        )
        return Projection(status, False, None, request_at, handoff_seen, refusal)
    if not guard.allows(status, m.message_type, m.message_id, current_view):
        return Projection(status, False, None, request_at, handoff_seen)

    processing_time = m.processing_time_ms
    if overrides_processing_time(m.message_type) and handoff_seen and request_at is not None:
        processing_time = max(0, int((now - request_at).total_seconds() * 1000))
    sub_status = pending_sub_status(m.message_type)
    parked = status is ResolutionStatus.Pending and sub_status is not None
    error = m.content.ErrorContent
    # Operator listings: one row per event in its status's range, newest change first (ADR-0022). An open
    # event's row keeps the time it entered its group (Pending, or Failed/DeadLettered) for as long as it
    # stays there: the overview's oldest ages read it.
    group = counts.group_of(status)
    stays = (
        current is not None
        and current.counted
        and current.since_at is not None
        and counts.group_of(current.resolution_status) == group
    )
    since_at = (current.since_at if current and stays else now) if group else None
    row = from_fields(
        EventRow,
        m,
        updated_at=now,
        resolution_status=status,
        endpoint_id=m.endpoint_id,
        last_message_id=m.message_id,
        reason=(error.ErrorText if error else None)
        if m.message_type is MessageType.SkipResponse
        else m.dead_letter_error_description,
        message_content=m.body_text or None,
        processing_time_ms=processing_time,
        pending_sub_status=sub_status,
        input_notes="\n".join(m.input_notes) or None,
        request_enqueued_at=request_at,
        handoff_seen=handoff_seen,
        history_count=(current.history_count if current else 0) + 1,
        queue_key=keys.queue_row(m.enqueued_time_utc, m.event_id) if parked else None,
        counted=True,
        bucket_keys=keys.bucket_row(status.name, now, m.event_id),
        since_at=since_at,
    )
    return Projection(status, True, row, request_at, handoff_seen)


def other_session_than_park(m: InboundMessage, current: EventRow) -> bool:
    """Is ``m`` another session's message for an event parked (Pending+Handoff) in a session?"""
    return (
        current.is_pending_handoff
        and current.session_id is not None
        and m.session_id is not None
        and m.session_id != current.session_id
    )


def stale_comment(m: InboundMessage) -> str:
    """The Comment NimBus's Resolver audits when Spec 030 refuses a write."""
    return f"Ignored stale {m.message_type.name} {m.message_id}: the audit row already holds a later outcome."


# -- the transaction ----------------------------------------------------------------------------------


class ProjectionRefused(Enum):
    """What a refused projection transaction means."""

    DUPLICATE = "duplicate"  # the history row exists: the message was projected before, nothing changes
    RACED = "raced"  # another writer changed the event's rows between our read and write: decide again
    OTHER = "other"  # no refusal of a row (a fault, a bug): raise


def projection_refused(refused: Refusal | None) -> ProjectionRefused:
    """The history insert comes first and the transaction is atomic: a conflict on it is a duplicate;
    any other refused row is a race with another writer of the event."""
    if refused is None:
        return ProjectionRefused.OTHER
    if refused.at(0) and refused.status == 409:
        return ProjectionRefused.DUPLICATE
    return ProjectionRefused.RACED


def plan_projection(
    pk: str, m: InboundMessage, current: EventRow | None, decision: Projection, *, now: datetime
) -> list[Operation]:
    """The one transaction of a projection: the history row (insert-only, first), then the new event row
    with its index, listing and count rows (applied) or the refusal's audit and bookkeeping (refused), and
    a RetryRequest's audit. Every write is conditional on the event row as read (``current``)."""
    sequence = (current.history_count if current else 0) + 1
    history = history_row(m, now=now, sequence=sequence)
    ops: list[Operation] = [tx.insert(history.to_entity(pk, keys.history_row(m.event_id, m.message_id)))]
    if decision.applied:
        assert decision.row is not None
        ops += _applied_ops(pk, decision.row, current)
    else:
        ops += _refused_ops(pk, m, current, decision, sequence, now=now)
    if m.message_type is MessageType.RetryRequest:
        ops.append(_retry_audit(pk, m, now))
    return ops


def _applied_ops(pk: str, row: EventRow, current: EventRow | None) -> list[Operation]:
    entity = row.to_entity(pk, keys.event_row(row.event_id))
    ops = [tx.insert(entity) if current is None else tx.replace(entity, current.etag or "*")]
    # Index rows change with the event row in the same transaction. The event row's ETag check makes
    # the index keys read from it current, so deleting them by key (If-Match *) cannot miss.
    wanted: list[tuple[str | None, str | None, TableRecord | None]] = [
        (
            current.queue_key if current else None,
            row.queue_key,
            QueueRow(
                event_id=row.event_id,
                event_type_id=row.event_type_id,
                parked_message_id=row.last_message_id or "",
                expected_by=row.expected_by,
            ),
        ),
        # A park's job row of the layout before ADR-0022 (the job lookup now reads ``hoids``): deleted
        # when the park ends, never written again.
        (current.job_key if current else None, None, None),
        # A park's expiry row of the layout before ADR-0022 change 5 (overdue reads the queue row's
        # ExpectedBy): deleted when the park ends, never written again.
        (current.expiry_key if current else None, None, None),
    ]
    for before, after, index_row in wanted:
        if before == after:
            continue  # same hand-off, same index row (it may carry a settlement's ClaimedUntil)
        if before:
            ops.append(tx.delete(pk, before))
        if after and index_row is not None:
            ops.append(tx.insert(index_row.to_entity(pk, after)))
    return ops + _expected_by_kept(pk, row, current) + _operator_ops(pk, row, current)


def _expected_by_kept(pk: str, row: EventRow, current: EventRow | None) -> list[Operation]:
    """A park projected again onto the same queue row (a PendingHandoffResponse enqueued in the same
    instant): the row stays (it may hold a lease or a settlement's mark), so its ``ExpectedBy`` is merged
    when it changed, or when the park is from before ADR-0022 change 5 (its ``ex|`` row, deleted above,
    held it). ``If-Match *``, safe as the deletes are. A park that loses its ExpectedBy this way keeps the
    old one on the queue row: the sweeper checks the event row and skips it."""
    if current is None or row.queue_key is None or current.queue_key != row.queue_key:
        return []
    if row.expected_by is None or (current.expiry_key is None and current.expected_by == row.expected_by):
        return []
    return [tx.merge({"PartitionKey": pk, "RowKey": row.queue_key, "ExpectedBy": row.expected_by})]


def _operator_ops(pk: str, row: EventRow, current: EventRow | None) -> list[Operation]:
    """The event's listing row and the closed statuses' count delta, in the event row's transaction.

    One listing row per event (``sd|{status}|{inverted change}|{event}``), moved when the event changes;
    rows of the layout before ADR-0022 that the current row names (``ad|``, ``sd|PendingHandoff|``, ``sa|``)
    are deleted here when their event next changes, never written again. Open statuses are counted by
    reading their listing rows, so only a change into or out of Completed or Skipped writes a delta."""
    ops: list[Operation] = []
    counted = current is not None and current.counted
    old_keys = current.listing_keys if current and counted else []
    summary = columns_of(ListingRow, row, reason=_short(row.reason or error_text(row.message_content)))
    for key in old_keys:
        if key not in row.listing_keys:
            ops.append(tx.delete(pk, key))
    for key in row.listing_keys:
        entity = summary.to_entity(pk, key)
        ops.append(tx.replace(entity, "*") if key in old_keys else tx.insert(entity))
    if current is not None and counted and current.since_key:
        ops.append(tx.delete(pk, current.since_key))  # the oldest-first row of the layout before ADR-0022
    before = (
        counts.buckets_of(current.resolution_status, current.pending_sub_status)
        if current and counted
        else ()
    )
    change = counts.tallied(
        counts.delta(before, counts.buckets_of(row.resolution_status, row.pending_sub_status))
    )
    if change:
        ops.append(tx.insert(delta_entity(pk, row.updated_at, change)))
    return ops


def _retry_audit(pk: str, m: InboundMessage, now: datetime) -> Operation:
    """NimBus audits a RetryRequest (Manager / Retry); in the transaction, so a copy cannot repeat it."""
    return _audit_insert(pk, m, now, MANAGER_ID, "Retry", f"RetryRequest {m.message_id}")


def _audit_insert(
    pk: str, m: InboundMessage, now: datetime, auditor: str, audit_type: str, data: str
) -> Operation:
    """The insert of an audit row of ``m``'s event (``auditor`` / ``audit_type``, saying ``data``)."""
    audit = AuditRow.of(m, now, System(by=auditor), audit_type, data=data)
    return tx.insert(audit.to_entity(pk, keys.audit_row(m.event_id, now, uuid.uuid4().hex)))


def _refused_ops(
    pk: str,
    m: InboundMessage,
    current: EventRow | None,
    decision: Projection,
    sequence: int,
    *,
    now: datetime,
) -> list[Operation]:
    assert current is not None  # only an existing row can refuse
    # The row's projection stays as it is; only the bookkeeping columns move (ETag-conditional, so a
    # concurrent projection makes this transaction fail and re-decide).
    bookkeeping: dict[str, Any] = {
        "PartitionKey": pk,
        "RowKey": keys.event_row(m.event_id),
        "HandoffSeen": decision.handoff_seen,
        "HistoryCount": int64(sequence),
    }
    if decision.request_enqueued_at is not None:
        bookkeeping["RequestEnqueuedAt"] = decision.request_enqueued_at
    comment = decision.refusal or stale_comment(m)
    return [
        _audit_insert(pk, m, now, RESOLVER_AUDITOR, "Comment", comment),
        tx.merge(bookkeeping, current.etag),
    ]


def delta_entity(pk: str, at: datetime, change: dict[str, int]) -> dict[str, Any]:
    """A counts delta row (insert-only; see :mod:`handoff.storage.counts`)."""
    entity: dict[str, Any] = {"PartitionKey": pk, "RowKey": keys.delta_row(at, uuid.uuid4().hex)}
    entity.update({counts.column(bucket): value for bucket, value in change.items()})
    return entity


def error_text(message_content: str | None) -> str | None:
    """``ErrorContent.ErrorText`` of a stored body, if it has one."""
    return text_at(message_content, "ErrorContent", "ErrorText")


def _short(text: str | None, limit: int = 300) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"
