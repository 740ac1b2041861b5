"""When a settlement claim is confirmed, re-sent or looked at again, and what an answer tells the caller
about it. Pure: no I/O here.

A re-send is the identical message (same MessageId, body and properties) and happens only when the
endpoint topic's duplicate detection will drop it if the first copy arrived: inside the detection window,
measured from the claim.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import Enum

from handoff.storage.claim_state import ClaimState

# How long after the claim the reconciler first looks: a healthy send and its projection by the resolver
# take seconds; this leaves room for a slow resolver before anything is re-sent.
CONFIRM_AFTER = timedelta(minutes=2)
# A settling process sends only this soon after its claim. It bounds when the first copy can reach the
# broker, which the re-send rule below relies on (a process frozen longer gives the job to the reconciler).
SEND_DEADLINE = timedelta(seconds=60)
# Re-sends stop this long before the detection window (counted from the claim) ends. The deadline is
# checked immediately before each send, so the margin covers the send path's bounded worst case
# (``handoff.messages.transport.SEND_WORST_CASE``, 25 s: link open budget + send timeout) plus clock error.
RESEND_MARGIN = timedelta(minutes=1)
# How often an unconfirmed claim is looked at again (it may still be confirmed by a late projection).
RECHECK_MIN = timedelta(minutes=5)
RECHECK_MAX = timedelta(hours=1)
# After a failed re-send or reconcile step.
RETRY_AFTER = timedelta(minutes=1)


class Step(Enum):
    """What the reconciler does with one due claim."""

    DONE = "done"  # sent / delivered / superseded already: drop the reconcile row
    DELIVERED = "delivered"  # the resolver projected it
    SUPERSEDED = "superseded"  # the event moved on without it
    RESEND = "resend"  # identical copy, the broker will deduplicate it
    UNCONFIRMED = "unconfirmed"  # cannot confirm and cannot safely re-send
    WAIT = "wait"  # too early to judge


def can_resend(claimed_at: datetime, now: datetime, window: timedelta | None) -> bool:
    """A re-send is safe while every copy lands inside one duplicate-detection window.

    The first copy is sent within ``SEND_DEADLINE`` of the claim (or not at all), every re-send before
    ``claimed_at + window - RESEND_MARGIN``: all copies then arrive less than a window apart, so the topic
    keeps the first one that arrives and drops the others.
    """
    if window is None:
        return False
    return now - claimed_at < window - RESEND_MARGIN


def next_step(
    state: ClaimState,
    *,
    projected: bool,
    moved_on: bool,
    claimed_at: datetime,
    now: datetime,
    window: timedelta | None,
) -> Step:
    """The reconciler's decision for one claim (``projected``: its history row exists)."""
    if not state.open:
        return Step.DONE
    if projected:
        return Step.DELIVERED
    if moved_on:
        return Step.SUPERSEDED
    if now - claimed_at < CONFIRM_AFTER:
        return Step.WAIT
    if can_resend(claimed_at, now, window):
        return Step.RESEND
    return Step.UNCONFIRMED


def recheck_after(claimed_at: datetime, now: datetime) -> timedelta:
    """Back-off for an unconfirmed claim: half its age, between 5 minutes and an hour."""
    return min(max((now - claimed_at) / 2, RECHECK_MIN), RECHECK_MAX)


def follow_up_note(
    state: ClaimState, *, confirmed: bool, claimed_at: datetime, window: timedelta | None, endpoint_id: str
) -> str | None:
    """What an unconfirmed 202 leaves to Settle, and where operators see it if that fails (None: confirmed).

    Part of the answer so that a caller knows the residual without reading the docs: without duplicate
    detection an ambiguous send is never re-sent (a second copy could reach the endpoint).
    """
    if confirmed:
        return None
    listed = f"GET /api/v1/handoffs/{endpoint_id}/unconfirmed"
    if state is ClaimState.unconfirmed:
        return (
            "Settle could neither confirm this message nor re-send it safely; it is listed at "
            f"{listed}: an operator must check whether it reached the endpoint."
        )
    if window is None:
        return (
            "Not confirmed, and the endpoint topics have no duplicate detection "
            "(HANDOFF_DUPLICATE_DETECTION=false), so Settle never re-sends it (a second copy could reach "
            "the endpoint): it is confirmed when the resolver projects it; otherwise it is listed at "
            f"{listed} for an operator to check the endpoint."
        )
    until = (claimed_at + window - RESEND_MARGIN).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        "Not confirmed yet: Settle confirms it from the resolver's history or re-sends the identical message "
        f"(same MessageId: duplicate detection drops a second copy) until {until}; if it is still "
        f"unconfirmed then, it is listed at {listed} for an operator to check the endpoint."
    )
