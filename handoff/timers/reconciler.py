"""The reconciler: every open settlement claim is confirmed, re-sent safely, or shown as unconfirmed.

It runs on every tick of the ``handoff_sweeper`` timer (always on; only the timeout sweep is opt-in). For
each endpoint that ever parked it reads the queue rows whose settlement claim is due (``ReconcileAt``: a
hand-off's settlement has no reconcile row of its own while it is first followed up, ADR-0022 change 9) and
the ``rc|`` index up to now, a bounded number of rows per run of each, and follows each claim up
(:meth:`~handoff.settlement.follow_up.ClaimFollowUp.advance`): the resolver's history proves delivery;
otherwise the identical message is re-sent while the topic's duplicate detection covers it; otherwise the
claim is marked ``unconfirmed`` (logged as an error, listed by
``GET /api/v1/handoffs/{endpointId}/unconfirmed``) and looked at again, less and less often, in case the
message shows up late. The ``rc|`` range also holds lookup index rows (``hoids``) whose insert the resolver
could not make: they are written, and their row deleted. One endpoint's failure never stops the run: it is
reported and the next one goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from common import telemetry
from common import transactions as tx
from handoff.settlement import claims
from handoff.settlement.timing import RETRY_AFTER
from handoff.storage import ids
from handoff.storage.claim_state import ClaimState
from handoff.storage.records import ClaimRow, ReconcileRow
from handoff.timers.endpoint_pass import EndpointPass

log = logging.getLogger("settle.reconciler")

ROWS_PER_ENDPOINT = 200


@dataclass
class ReconcileReport:
    """Event ids by what happened to their claim; ``errors``: endpoint → {event id or ``*``: reason}."""

    delivered: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    indexed: list[str] = field(default_factory=list)
    errors: dict[str, dict[str, str]] = field(default_factory=dict)


class Reconciler(EndpointPass):
    ROWS_PER_ENDPOINT = ROWS_PER_ENDPOINT

    @cached_property
    def ids(self) -> ids.IdsIndex:
        return ids.IdsIndex(self.store)

    def clock(self) -> datetime:
        return self._clock() if self._clock else self.settlement.clock()

    def run(self, endpoint_ids: Sequence[str] | None = None) -> ReconcileReport:
        """One pass over ``endpoint_ids`` (the tick's endpoint list; read here when not given)."""
        with telemetry.span("settle.reconciler.run") as span:
            report = self._run(self.store.endpoints() if endpoint_ids is None else endpoint_ids)
            span.update({f"settle.reconciler.{k}": len(v) for k, v in vars(report).items()})
            span.set_outcome("errors" if report.errors else "done")
            return report

    def _run(self, endpoint_ids: Sequence[str]) -> ReconcileReport:
        report = ReconcileReport()
        self.each_endpoint(
            endpoint_ids,
            lambda endpoint_id: self.reconcile_endpoint(endpoint_id, report),
            endpoint_of=str,
            errors=report.errors,
            log=log,
            doing="reconciling",
        )
        if any(report.__dict__[k] for k in ("delivered", "resent", "unconfirmed", "superseded")):
            log.info(
                "reconciler: %d delivered, %d re-sent, %d unconfirmed, %d superseded",
                len(report.delivered),
                len(report.resent),
                len(report.unconfirmed),
                len(report.superseded),
            )
        return report

    def reconcile_endpoint(self, endpoint_id: str, report: ReconcileReport) -> None:
        try:
            self._queue_claims(endpoint_id, report)
        except Exception as exc:  # the queue's read failed: the reconcile rows are still followed up
            log.warning("reading the due queue marks of %s failed", endpoint_id, exc_info=True)
            report.errors.setdefault(endpoint_id, {})["*"] = f"{type(exc).__name__}: {exc}"
        for due in self.store.due_reconcile(endpoint_id, self.clock(), limit=self.rows_per_endpoint):
            try:
                if due.task == ids.IDS_TASK:
                    # Left in place if this fails: the next run writes the rows again (inserts).
                    self.store.submit([self.ids.replay(endpoint_id, due)])
                    report.indexed.append(due.event_id)
                    continue
                self._one(endpoint_id, due, report)
            except Exception as exc:
                log.warning("reconciling %s/%s failed", endpoint_id, due.event_id, exc_info=True)
                report.errors.setdefault(endpoint_id, {})[due.event_id] = f"{type(exc).__name__}: {exc}"
                if due.task != ids.IDS_TASK:
                    self._postpone(endpoint_id, due)

    def _queue_claims(self, endpoint_id: str, report: ReconcileReport) -> None:
        """Settlements of parked hand-offs whose first look is due: found by their queue mark (ADR-0022
        change 9). A claim confirmed meanwhile took its queue row with it (the projection of its message
        deletes the row); what is left is followed up as a reconcile row's claim is. Each mark handled is
        then moved (``If-Match`` the row as read): to ``RECONCILED`` when the claim is over or a reconcile
        row of its own now says when to look again, else a retry's delay later."""
        for queued in self.store.due_queue_claims(endpoint_id, self.clock(), limit=self.rows_per_endpoint):
            handled = False
            try:
                claim = self.store.get_claim(endpoint_id, queued.event_id, queued.parked_message_id)
                if claim is not None and claims.followed_on_queue(claim):
                    claim = self._advance(endpoint_id, claim, report)
                handled = claim is None or not claims.followed_on_queue(claim)
            except Exception as exc:
                log.warning("reconciling %s/%s failed", endpoint_id, queued.event_id, exc_info=True)
                report.errors.setdefault(endpoint_id, {})[queued.event_id] = f"{type(exc).__name__}: {exc}"
            look = claims.RECONCILED if handled else self.clock() + RETRY_AFTER
            pk = self.store.event_partition(endpoint_id, queued.event_id)
            try:
                self.store.submit([claims.plan_queue_look(pk, queued, look)])
            except Exception:
                # Changed since (a new claim has its own mark; gone: projected) or a fault: the next run reads
                # the row again, and only a claim still due through it is followed up again.
                log.debug("queue mark of %s/%s not moved", endpoint_id, queued.event_id, exc_info=True)

    def _one(self, endpoint_id: str, due: ReconcileRow, report: ReconcileReport) -> None:
        claim = self.store.get_claim(endpoint_id, due.event_id, due.parked_message_id)
        if claim is None or not claim.state.open or claim.reconcile_key != due.row_key:
            # Released, finished, or re-keyed by a transaction that lost its answer: this row is stale.
            self._drop(endpoint_id, due)
            return
        after = self._advance(endpoint_id, claim, report)
        if after.state is claim.state and after.reconcile_key == claim.reconcile_key:
            self._postpone(endpoint_id, due)  # nothing could be recorded: do not spin on this row

    def _advance(self, endpoint_id: str, claim: ClaimRow, report: ReconcileReport) -> ClaimRow:
        """Follow one open claim up, and report what it came to."""
        before = claim.state
        after = self.settlement.follow_up.advance(endpoint_id, claim)
        if after.state is ClaimState.delivered:
            report.delivered.append(claim.event_id)
        elif after.state is ClaimState.sent:
            report.resent.append(claim.event_id)
        elif after.state is ClaimState.superseded:
            report.superseded.append(claim.event_id)
        elif after.state is ClaimState.unconfirmed:
            report.unconfirmed.append(claim.event_id)
        else:
            report.waiting.append(claim.event_id)
        if after.state is before:
            outcome = "waiting"
        else:
            outcome = "resent" if after.state is ClaimState.sent else after.state.name
        telemetry.add("settle.reconciler.claims", outcome=outcome)
        return after

    def _drop(self, endpoint_id: str, due: ReconcileRow) -> None:
        assert due.row_key is not None
        pk = self.store.event_partition(endpoint_id, due.event_id)
        self.store.submit([tx.delete(pk, due.row_key, due.etag)])

    def _postpone(self, endpoint_id: str, due: ReconcileRow) -> None:
        """Move a row that could not be handled behind the others (best effort), so it blocks no one."""
        assert due.row_key is not None
        claim = None
        try:
            claim = self.store.get_claim(endpoint_id, due.event_id, due.parked_message_id)
            if claim is None or not claim.state.open:
                self._drop(endpoint_id, due)
                return
            self.settlement.follow_up.reschedule(endpoint_id, claim, self.clock() + RETRY_AFTER)
        except Exception:
            log.debug("could not postpone %s/%s", endpoint_id, due.event_id, exc_info=True)
