"""What one resolver message does to the event row: NimBus's ``UpdateState`` as a pure function.

Given the typed message and the current event row (or none), decide: the new row (applied) or a refusal
(Spec 030), and the bookkeeping the next projection needs. No I/O; :mod:`handoff.resolver` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from common.errors import KeyTooLong
from handoff import counts, guard, keys
from handoff.contract import InboundMessage, MessageType, ResolutionStatus
from handoff.records import EventRow, HistoryRow
from handoff.status_map import overrides_processing_time, pending_sub_status, status_for

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
    return HistoryRow(
        event_id=m.event_id,
        message_id=m.message_id,
        message_type=m.message_type,
        endpoint_id=m.endpoint_id,
        event_type_id=m.event_type_id,
        originating_message_id=m.originating_message_id,
        parent_message_id=m.parent_message_id,
        from_=m.from_,
        to=m.to,
        originating_from=m.originating_from,
        session_id=m.session_id,
        correlation_id=m.correlation_id,
        enqueued_time_utc=m.enqueued_time_utc,
        message_content=m.body_text or None,
        dead_letter_reason=m.dead_letter_reason,
        dead_letter_error_description=m.dead_letter_error_description,
        queue_time_ms=m.queue_time_ms,
        processing_time_ms=m.processing_time_ms,
        pending_sub_status=pending_sub_status(m.message_type),
        handoff_reason=m.handoff_reason,
        external_job_id=m.external_job_id,
        expected_by=m.expected_by,
        delivery_count=m.delivery_count,
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
    # Operator listings: newest change first per bucket; the oldest-first row keeps the time the event
    # entered its group (Pending, or Failed/DeadLettered) for as long as it stays there.
    group = counts.group_of(status)
    stays = (
        current is not None
        and current.counted
        and current.since_key is not None
        and counts.group_of(current.resolution_status) == group
    )
    since_at = (current.since_at if current and stays else now) if group else None
    since_key = (
        (current.since_key if current and stays else keys.since_row(group, now, m.event_id))
        if group
        else None
    )
    notes = list(m.input_notes)
    job_key = None
    if parked and m.external_job_id:
        try:
            job_key = keys.job_row(m.external_job_id, m.event_id)
        except KeyTooLong:
            # NimBus stores the id; the park is kept (and settles by its coordinates), only the lookup by
            # job id cannot find it.
            notes.append(
                "ExternalJobId is too long for the job index (a Table Storage key holds 1 KiB): "
                "kept on the row, but the job lookup cannot find this park."
            )
    row = EventRow(
        updated_at=now,
        enqueued_time_utc=m.enqueued_time_utc,
        event_id=m.event_id,
        session_id=m.session_id,
        correlation_id=m.correlation_id,
        resolution_status=status,
        endpoint_id=m.endpoint_id,
        retry_count=m.retry_count,
        retry_limit=m.retry_limit,
        message_type=m.message_type,
        dead_letter_reason=m.dead_letter_reason,
        dead_letter_error_description=m.dead_letter_error_description,
        last_message_id=m.message_id,
        originating_message_id=m.originating_message_id,
        parent_message_id=m.parent_message_id,
        reason=(error.ErrorText if error else None)
        if m.message_type is MessageType.SkipResponse
        else m.dead_letter_error_description,
        originating_from=m.originating_from,
        event_type_id=m.event_type_id,
        to=m.to,
        from_=m.from_,
        message_content=m.body_text or None,
        queue_time_ms=m.queue_time_ms,
        processing_time_ms=processing_time,
        pending_sub_status=sub_status,
        handoff_reason=m.handoff_reason,
        external_job_id=m.external_job_id,
        expected_by=m.expected_by,
        input_notes="\n".join(notes) or None,
        request_enqueued_at=request_at,
        handoff_seen=handoff_seen,
        history_count=(current.history_count if current else 0) + 1,
        queue_key=keys.queue_row(m.enqueued_time_utc, m.event_id) if parked else None,
        job_key=job_key,
        expiry_key=keys.expiry_row(m.expected_by, m.event_id) if parked and m.expected_by else None,
        counted=True,
        all_key=keys.all_events_row(now, m.event_id),
        bucket_keys="\n".join(
            keys.bucket_row(b, now, m.event_id) for b in counts.buckets_of(status, sub_status)
        ),
        since_key=since_key,
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
