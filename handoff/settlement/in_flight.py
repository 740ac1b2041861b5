"""Waiting for a send another caller has in flight, so that identical settlements get one answer state.

A repeat of a settlement (the same request retried, or sent twice at once) is answered from its claim. If it
arrives while the caller that claimed it (or the one re-sending it) is still sending, the claim says
``sending`` only because that send has not returned yet: answering it would tell this caller ``sending`` and
the sender ``sent``. So the repeat waits, a bounded time, for the claim's next write (the sender's ``sent``,
or its note that the outcome is unknown), then answers from that. The wait never decides anything: the claim
and its ETag-conditional writes do; a sender that died is followed up as before once the wait is over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from handoff.messages.transport import SEND_WORST_CASE
from handoff.storage.claim_state import ClaimState
from handoff.storage.records import ClaimRow
from handoff.storage.store import HandoffStore

# A normal send returns well within this; a slower one is answered ``sending`` (the outcome is not known
# yet), which the sender's own answer then agrees with only if it is unknown too.
WAIT_FOR_SENDER = timedelta(seconds=5)
_POLL_S = (0.02, 0.05, 0.1, 0.2, 0.25)


def first_send_in_flight(claim: ClaimRow, now: datetime) -> bool:
    """The caller that claimed it may still be sending (no attempt recorded, within a send's worst case)."""
    return (
        claim.state is ClaimState.sending and claim.attempts == 0 and now - claim.claimed_at < SEND_WORST_CASE
    )


def await_sender(
    store: HandoffStore,
    endpoint_id: str,
    claim: ClaimRow,
    *,
    clock: Callable[[], datetime],
    until_sent: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> ClaimRow:
    """The claim after the send in flight on it returned (its next write; ``until_sent``: its next write
    that is not ``sending``, as other retries may pin it meanwhile), or as it is after ``WAIT_FOR_SENDER``;
    the claim as given when it is gone (the caller's follow-up then says so)."""
    deadline = time.monotonic() + WAIT_FOR_SENDER.total_seconds()
    start = clock()
    tick = 0
    latest = claim
    while claim.state is ClaimState.sending and time.monotonic() < deadline:
        if clock() - start > WAIT_FOR_SENDER:  # a test's clock moved on: the sender's time is up too
            break
        sleep(_POLL_S[min(tick, len(_POLL_S) - 1)])
        tick += 1
        current = store.get_claim(endpoint_id, claim.event_id, claim.parked_message_id)
        if current is None:
            return claim
        if current.state is not ClaimState.sending or (current.etag != claim.etag and not until_sent):
            return current
        latest = current
    return latest
