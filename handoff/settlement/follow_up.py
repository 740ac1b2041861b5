"""Following up a settlement claim: confirm it, re-send it while that is safe, show it as unconfirmed, or
release it after a send that certainly reached nothing. The I/O around :mod:`handoff.settlement.claims`
(the rules) and :mod:`handoff.settlement.timing` (what to do next with a claim): read, ask, submit, ask again.

:class:`ClaimFollowUp` is held by :class:`~handoff.settlement.settler.SettlementService` (its ``follow_up``):
the reconciler, a retried settlement and the first sender share it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from common import telemetry
from common.transactions import refusal
from handoff.messages.outbound import OutboxMessage
from handoff.messages.transport import SendRefused, Transport
from handoff.settlement import claims
from handoff.settlement.in_flight import await_sender
from handoff.settlement.timing import (
    CONFIRM_AFTER,
    RETRY_AFTER,
    Step,
    can_resend,
    next_step,
    recheck_after,
)
from handoff.storage.claim_state import ClaimState
from handoff.storage.records import ClaimRow, EventRow
from handoff.storage.store import HandoffStore

log = logging.getLogger("settle.settlement")


class ClaimFollowUp:
    """Moves open claims on, with the settlement service's store, transport and clock."""

    def __init__(
        self, store: HandoffStore, transport: Callable[[], Transport], clock: Callable[[], datetime]
    ) -> None:
        self.store = store
        # Looked up at each use: ``service.use_transport`` changes it for everyone at once.
        self.transport = transport
        self.clock = clock

    def advance(self, endpoint_id: str, claim: ClaimRow, *, bookkeeping: bool = True) -> ClaimRow:
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
        window = self.transport().duplicate_window
        step = next_step(
            claim.state,
            projected=projected,
            moved_on=not projected and claims.moved_on(claim, row),
            claimed_at=claim.claimed_at,
            now=now,
            window=window,
        )
        if not bookkeeping and step in (Step.WAIT, Step.UNCONFIRMED):
            # A retry re-sends at once when that is safe, else only answers.
            step = Step.RESEND if can_resend(claim.claimed_at, now, window) else Step.WAIT
        if step is Step.DELIVERED:
            return self.transition(endpoint_id, claim, ClaimState.delivered)
        if step is Step.SUPERSEDED:
            log.warning(
                "event %s/%s moved on before %s %s was confirmed; the claim is superseded",
                endpoint_id,
                claim.event_id,
                claim.message_type.name,
                claim.control_message_id,
            )
            return self.transition(endpoint_id, claim, ClaimState.superseded)
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
            return self.transition(
                endpoint_id, claim, ClaimState.unconfirmed, due=now + recheck_after(claim.claimed_at, now)
            )
        if step is Step.WAIT and bookkeeping:
            return self.transition(endpoint_id, claim, claim.state, due=claim.claimed_at + CONFIRM_AFTER)
        if step is Step.WAIT:
            # A retry about to answer 202 pins the claim (If-Match its ETag), so that a first sender whose
            # send is being refused right now cannot release it under that answer.
            return self._pinned(endpoint_id, claim, count=False)[0]
        return claim

    def reschedule(self, endpoint_id: str, claim: ClaimRow, due: datetime) -> ClaimRow:
        """Look at an open claim again at ``due`` (its reconcile row moves)."""
        return self.transition(endpoint_id, claim, claim.state, due=due)

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
            return self.transition(
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
            return self.transition(endpoint_id, taken, taken.state, due=self.clock() + RETRY_AFTER)
        log.info("re-sent %s for %s/%s", claim.control_message_id, endpoint_id, claim.event_id)
        span.set_outcome("sent")
        return self.transition(endpoint_id, taken, ClaimState.sent, sent=True)

    def _pinned(self, endpoint_id: str, claim: ClaimRow, *, count: bool) -> tuple[ClaimRow, bool]:
        """The claim after its pin (:func:`handoff.settlement.claims.plan_pin`), and whether the write was
        ours.

        Another change won the race: the claim as it is now, and False. The claim is gone (released):
        503, the same settlement must start again.
        """
        now = self.clock()
        pk = self.store.event_partition(endpoint_id, claim.event_id)
        try:
            [answer] = self.store.submit([claims.plan_pin(pk, claim, now=now, count=count)])
        except Exception:
            current = self.store.get_claim(endpoint_id, claim.event_id, claim.parked_message_id)
            if current is None:
                raise SendRefused(
                    f"The settlement of event {claim.event_id!r} was released (its send was refused); retry."
                ) from None
            log.info("claim of %s/%s changed meanwhile", endpoint_id, claim.event_id)
            return current, False
        return claims.pinned(claim, answer, now=now, count=count), True

    def transition(
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
        """Move the claim (:func:`handoff.settlement.claims.plan_transition`); best effort.

        A move that lost its ``If-Match`` reads the claim again: progress still ahead of it is applied again
        while :func:`handoff.settlement.claims.redo` says so (a retry's pin or a reconciler's attempt count
        came
        between); otherwise the claim is answered as storage holds it
        (:func:`handoff.settlement.claims.unrecorded`:
        another replay's identical ``delivered`` won the race), or as it was after a storage fault. The
        reconciler looks again at whatever is still open.
        """
        pk = self.store.event_partition(endpoint_id, claim.event_id)
        move = claims.plan_transition(pk, claim, state, now=self.clock(), due=due, sent=sent, attempt=attempt)
        try:
            answers = self.store.submit(move.ops)
        except Exception:
            current = self._read_again(endpoint_id, claim)
            if again > 0 and claims.redo(claim, current, state):
                assert current is not None
                log.info(
                    "claim of %s/%s changed meanwhile; recording %s again",
                    endpoint_id,
                    claim.event_id,
                    state.name,
                )
                return self.transition(
                    endpoint_id, current, state, due=due, sent=sent, attempt=attempt, again=again - 1
                )
            answered = claims.unrecorded(claim, current, sent=sent)
            if answered.etag != claim.etag:
                log.info(
                    "claim of %s/%s was moved to %s meanwhile; answered as stored",
                    endpoint_id,
                    claim.event_id,
                    answered.state.name,
                )
            else:
                log.warning(
                    "claim of %s/%s: could not record %s",
                    endpoint_id,
                    claim.event_id,
                    state.name,
                    exc_info=True,
                )
            return answered
        return move.applied(answers)

    def _read_again(self, endpoint_id: str, claim: ClaimRow) -> ClaimRow | None:
        """The claim as storage holds it now; None when it is gone or cannot be read."""
        try:
            return self.store.get_claim(endpoint_id, claim.event_id, claim.parked_message_id)
        except Exception:
            log.warning("claim of %s/%s: could not read it again", endpoint_id, claim.event_id, exc_info=True)
            return None

    def release(self, endpoint_id: str, row: EventRow, claim: ClaimRow) -> bool:
        """Undo a claim whose send certainly reached nothing (:func:`handoff.settlement.claims.plan_release`);
        False
        when the claim may still stand."""
        release = claims.plan_release(self.store.event_partition(endpoint_id, row.event_id), row, claim)
        try:
            try:
                self.store.submit(release.ops)
            except Exception as exc:
                again = release.again(refusal(exc))
                if again is None:
                    raise
                self.store.submit(again)  # the index row is gone: release the claim alone
        except Exception:
            log.warning("could not release the claim on %s/%s", endpoint_id, row.event_id, exc_info=True)
            try:
                still = self.store.get_claim(endpoint_id, row.event_id, claim.parked_message_id)
            except Exception:
                return True  # unknown: the caller's retry meets its own claim if it is still there
            return still is None
        return True
