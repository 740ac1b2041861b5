"""NimBus's ``MessageTypeToStatusMap`` and the sub-status rule (nimbus-contract.md §2.2-2.3). Pure."""

from __future__ import annotations

from handoff.messages.contract import HANDOFF_SUB_STATUS, MessageType, PoisonMessage, ResolutionStatus

STATUS_MAP: dict[MessageType, ResolutionStatus] = {
    MessageType.EventRequest: ResolutionStatus.Pending,
    MessageType.ResubmissionRequest: ResolutionStatus.Pending,
    MessageType.RetryRequest: ResolutionStatus.Pending,
    MessageType.SkipRequest: ResolutionStatus.Pending,
    MessageType.ContinuationRequest: ResolutionStatus.Pending,
    MessageType.PendingHandoffResponse: ResolutionStatus.Pending,
    # ADR-012 (2026-09-15, final): a settlement request projects a *plain* Pending row, which moves the
    # event out of the agent receive query at once; the terminal response then flips it.
    MessageType.HandoffCompletedRequest: ResolutionStatus.Pending,
    MessageType.HandoffFailedRequest: ResolutionStatus.Pending,
    MessageType.ErrorResponse: ResolutionStatus.Failed,
    MessageType.ResolutionResponse: ResolutionStatus.Completed,
    MessageType.DeferralResponse: ResolutionStatus.Deferred,
    MessageType.SkipResponse: ResolutionStatus.Skipped,
    MessageType.UnsupportedResponse: ResolutionStatus.Unsupported,
}


def status_for(message_type: MessageType, *, dead_letter_error_description: str | None) -> ResolutionStatus:
    """The row status a message projects; ``DeadLetterErrorDescription`` wins over the type."""
    if dead_letter_error_description is not None:
        return ResolutionStatus.DeadLettered
    status = STATUS_MAP.get(message_type)
    if status is None:
        raise PoisonMessage(f"MessageType {message_type.name} has no projection.")
    return status


def pending_sub_status(message_type: MessageType) -> str | None:
    """``"Handoff"`` iff the message is a ``PendingHandoffResponse``; every other write clears it."""
    return HANDOFF_SUB_STATUS if message_type is MessageType.PendingHandoffResponse else None


def overrides_processing_time(message_type: MessageType) -> bool:
    """Terminal responses after a hand-off report wall-clock time since the EventRequest (fix 0e18c63)."""
    return message_type in (MessageType.ResolutionResponse, MessageType.ErrorResponse)
