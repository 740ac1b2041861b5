"""The human way out of an unconfirmed settlement: an operator marks it delivered (checked at the endpoint)
or releases it (the hand-off can be settled again), in one transaction with an audit row saying who, why
and what was resolved. The rules are :mod:`handoff.settlement.unconfirmed_rules`; this module reads and
writes.

Several operators (or one client retrying on a timeout) may send the same resolution at once. Whether it
is already done is decided from storage read inside the retry loop, never from a list read before it: the
claim's change and the resolution's audit are written in one transaction, so a claim that is gone (or
delivered) is explained by the audit read after it. Every identical resolution is answered as done, the
repeats ``replayed`` with the audit of the one that did it; a different resolution of a settlement already
resolved is a 409 that says what it was resolved to, by whom and when.
"""

from __future__ import annotations

from common.errors import Conflict
from common.transactions import refusal
from handoff.settlement import unconfirmed_rules as rules
from handoff.settlement.settler import SettlementService
from handoff.settlement.unconfirmed_rules import ClaimResolution, resolution_audit
from handoff.storage.records import AuditRow, EventRow
from handoff.storage.store import classify_event_rows

_ATTEMPTS = 3


class ClaimResolver:
    """Resolves one unconfirmed claim; a retry of the same resolution is answered as done (``replayed``)."""

    def __init__(self, settlement: SettlementService) -> None:
        self.store = settlement.store

    def resolve(
        self,
        endpoint_id: str,
        row: EventRow,
        addressed: str,
        *,
        resolution: str,
        control_message_id: str | None,
        audit: AuditRow,
    ) -> ClaimResolution:
        for attempt in range(_ATTEMPTS):
            if attempt:
                row = self.store.get_event(endpoint_id, row.event_id) or row
            claim = self.store.get_claim(endpoint_id, row.event_id, addressed)
            # Read after the claim: a resolution that changed it wrote its audit in the same transaction.
            earlier = (
                self._latest_resolution(endpoint_id, row.event_id, addressed, control_message_id)
                if rules.needs_history(claim, control_message_id)
                else None
            )
            decided = rules.decide(
                claim,
                earlier,
                event_id=row.event_id,
                addressed=addressed,
                resolution=resolution,
                control_message_id=control_message_id,
            )
            if isinstance(decided, ClaimResolution):
                return decided
            pk = self.store.event_partition(endpoint_id, row.event_id)
            try:
                self.store.submit(rules.plan_resolution(pk, row, decided, resolution, audit))
            except Exception as exc:
                if refusal(exc) is None:
                    raise
                # The claim changed meanwhile (another operator resolved it, the reconciler looked again),
                # or the hand-off was projected away: read both again and decide again.
                continue
            return ClaimResolution(resolution, False, decided, audit)
        raise Conflict(f"The claim of message {addressed!r} kept changing; retry.", field="messageId")

    def _latest_resolution(
        self, endpoint_id: str, event_id: str, addressed: str, control_message_id: str | None
    ) -> AuditRow | None:
        _, _, audits = classify_event_rows(self.store.event_rows(endpoint_id, event_id))
        return resolution_audit(audits, addressed, None, control_message_id)
