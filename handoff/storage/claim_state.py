"""The states of a settlement claim, as its row stores them (by name).

A settlement claim is an outbox record. It is written (and is its audit) *before* the control message
is sent and holds the exact message, so that whatever happens to the send (refused, accepted, lost in
between, the process killed) Settle can finish the job later without guessing:

* ``sending``: written, the send not known to have succeeded (in progress, ambiguous, or never attempted);
* ``sent``: the broker acknowledged it;
* ``delivered``: the resolver projected it (its history row exists);
* ``unconfirmed``: not confirmed, and a re-send could reach the endpoint twice: operators must look;
* ``superseded``: the event moved on without it (an operator resubmitted or skipped it, a new park).

A claim whose message was (or may have been) sent is never taken over, and never deleted except after a
send that certainly reached nothing. The rules for what happens next live in
``handoff.settlement.timing``.
"""

from __future__ import annotations

from enum import Enum


class ClaimState(Enum):
    """Where one settlement's control message is (stored by name)."""

    sending = "sending"
    sent = "sent"
    delivered = "delivered"
    unconfirmed = "unconfirmed"
    superseded = "superseded"

    @property
    def open(self) -> bool:
        """Still followed by the reconciler."""
        return self in (ClaimState.sending, ClaimState.unconfirmed)
