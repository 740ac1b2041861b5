"""Spec 030 stale-write guard (``NimBus.MessageStore.StaleWriteGuard``), transliterated. Pure.

A late copy (fan-out lag, a rescheduled redelivery) must never turn a settled row back to Pending.
Terminal-over-terminal stays last-writer-wins, as in NimBus (a non-goal of Spec 030).
"""

from __future__ import annotations

from dataclasses import dataclass

from handoff.messages.contract import MessageType, ResolutionStatus

TERMINAL = frozenset(
    {
        ResolutionStatus.Completed,
        ResolutionStatus.Skipped,
        ResolutionStatus.Failed,
        ResolutionStatus.DeadLettered,
        ResolutionStatus.Unsupported,
    }
)
# Lenient on purpose: Unknown covers rows seeded by tools.
REQUEST_STAGE = frozenset({MessageType.EventRequest, MessageType.DeferralResponse, MessageType.Unknown})
CONTROL_REQUESTS = frozenset(
    {
        MessageType.ResubmissionRequest,
        MessageType.SkipRequest,
        MessageType.RetryRequest,
        MessageType.ContinuationRequest,
        MessageType.HandoffCompletedRequest,
        MessageType.HandoffFailedRequest,
    }
)
_GUARDED_TYPES = (
    frozenset({MessageType.EventRequest, MessageType.DeferralResponse, MessageType.PendingHandoffResponse})
    | CONTROL_REQUESTS
)


@dataclass(frozen=True)
class CurrentRow:
    """The four fields of the stored row the guard reads."""

    resolution_status: ResolutionStatus
    message_type: MessageType
    parent_message_id: str | None
    last_message_id: str | None


def is_guarded(incoming_status: ResolutionStatus, incoming_type: MessageType) -> bool:
    return incoming_status not in TERMINAL and incoming_type in _GUARDED_TYPES


def allows(
    incoming_status: ResolutionStatus,
    incoming_type: MessageType,
    incoming_message_id: str | None,
    current: CurrentRow | None,
) -> bool:
    """True when the incoming write may replace ``current`` (``StaleWriteGuard.Allows``)."""
    if current is None or not is_guarded(incoming_status, incoming_type):
        return True
    # Responses stamp ParentMessageId with the message they answer: the row already holds its outcome.
    if current.parent_message_id and incoming_message_id and current.parent_message_id == incoming_message_id:
        return False
    if incoming_type in (MessageType.EventRequest, MessageType.DeferralResponse):
        return current.resolution_status not in TERMINAL and current.message_type in REQUEST_STAGE
    if incoming_type is MessageType.PendingHandoffResponse:
        # Failed/DeadLettered/Unsupported stay open: a policy retry or a resubmission may park again.
        return current.resolution_status not in (ResolutionStatus.Completed, ResolutionStatus.Skipped)
    return True  # control requests (operator / settlement) apply
