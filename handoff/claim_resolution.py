"""The human way out of an unconfirmed settlement: an operator marks it delivered (checked at the endpoint)
or releases it (the hand-off can be settled again), in one transaction with an audit row saying who, why
and what was resolved.

Several operators (or one client retrying on a timeout) may send the same resolution at once. Whether it
is already done is decided from storage read inside the retry loop, never from a list read before it: the
claim's change and the resolution's audit are written in one transaction, so a claim that is gone (or
delivered) is explained by the audit read after it. Every identical resolution is answered as done, the
repeats ``replayed`` with the audit of the one that did it; a different resolution of a settlement already
resolved is a 409 that says what it was resolved to, by whom and when.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from common.clock import iso
from common.errors import Conflict, NotFound
from handoff import keys, store
from handoff.outbox import ClaimState
from handoff.records import AuditRow, ClaimRow, EventRow
from handoff.settlement import UNCLAIMED, SettlementService
from handoff.store import Operation, classify_event_rows

RESOLVE_AUDIT = "ResolveSettlement"
DELIVERED, RELEASED = "delivered", "released"
_ATTEMPTS = 3


@dataclass(frozen=True)
class ClaimResolution:
    """What an operator's resolution of an unconfirmed claim did."""

    state: str  # delivered | released
    replayed: bool
    claim: ClaimRow | None  # as it was resolved (None: answered from an earlier release's audit)
    # The audit written, or for a repeat the audit of the resolution it repeats (None only for a claim
    # the reconciler confirmed delivered without an operator).
    audit: AuditRow | None

    @property
    def control_message_id(self) -> str | None:
        """The control message resolved: the claim's, or the one the earlier resolution's audit names."""
        if self.claim is not None:
            return self.claim.control_message_id
        return control_of(self.audit) if self.audit is not None else None


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
        from azure.data.tables import TableTransactionError

        for attempt in range(_ATTEMPTS):
            if attempt:
                row = self.store.get_event(endpoint_id, row.event_id) or row
            claim = self.store.get_claim(endpoint_id, row.event_id, addressed)
            if (
                claim is None
                or claim.state is not ClaimState.unconfirmed
                or _other_claim(claim, control_message_id)
            ):
                # Read after the claim: a resolution that changed it wrote its audit in the same transaction.
                earlier = self._latest_resolution(endpoint_id, row.event_id, addressed, control_message_id)
                done = _done_before(claim, addressed, resolution, earlier)
                if done is not None:
                    return done
                if claim is None:
                    raise NotFound(
                        f"No settlement of message {addressed!r} of event {row.event_id!r} is claimed."
                    )
                if _other_claim(claim, control_message_id):
                    raise Conflict(
                        f"The claim of message {addressed!r} holds control message "
                        f"{claim.control_message_id!r}, not {control_message_id!r} (it was released and "
                        "settled again?).",
                        field="controlMessageId",
                    )
            if claim.state is not ClaimState.unconfirmed:
                raise Conflict(
                    f"The settlement of message {addressed!r} is {claim.state.name}, not unconfirmed: "
                    "only an unconfirmed settlement is resolved by an operator.",
                    field="messageId",
                )
            ops = _ops(self.store.event_partition(endpoint_id, row.event_id), row, claim, resolution, audit)
            try:
                self.store.submit(ops)
            except TableTransactionError:
                # The claim changed meanwhile (another operator resolved it, the reconciler looked again),
                # or the hand-off was projected away: read both again and decide again.
                continue
            return ClaimResolution(resolution, False, claim, audit)
        raise Conflict(f"The claim of message {addressed!r} kept changing; retry.", field="messageId")

    def _latest_resolution(
        self, endpoint_id: str, event_id: str, addressed: str, control_message_id: str | None
    ) -> AuditRow | None:
        _, _, audits = classify_event_rows(self.store.event_rows(endpoint_id, event_id))
        return resolution_audit(audits, addressed, None, control_message_id)


def _done_before(
    claim: ClaimRow | None, addressed: str, resolution: str, earlier: AuditRow | None
) -> ClaimResolution | None:
    """The answer when the claim was resolved before (None: it was not, decide from the claim): the same
    resolution is done, a different one is a 409 naming what it was resolved to, by whom and when."""
    own = earlier if earlier and (claim is None or control_of(earlier) == claim.control_message_id) else None
    if claim is not None and claim.state is ClaimState.delivered and own is None:
        # Confirmed by the reconciler (the resolver projected the control message): no operator's audit.
        if resolution == DELIVERED:
            return ClaimResolution(DELIVERED, True, claim, None)
        raise Conflict(
            f"The settlement of message {addressed!r} was confirmed delivered (the endpoint answered it): "
            "it cannot be released.",
            field="resolution",
        )
    if earlier is None:
        return None
    was = resolution_of(earlier)
    if was == resolution:
        # The same resolution (of this claim, or of the one released before this message was settled again).
        return ClaimResolution(resolution, True, claim if own is not None else None, earlier)
    if own is None:
        return None  # resolved differently before it was settled again: this claim decides
    raise Conflict(
        f"The settlement of message {addressed!r} was already resolved {was} by {earlier.auditor_name!r} "
        f"at {iso(earlier.audit_timestamp)} ({earlier.comment or 'no reason given'}); "
        f"it cannot be {resolution} now.",
        field="resolution",
    )


def _other_claim(claim: ClaimRow, control_message_id: str | None) -> bool:
    """The message was settled again after a release: the claim is not the one the caller resolves."""
    return bool(control_message_id) and claim.control_message_id != control_message_id


def _ops(pk: str, row: EventRow, claim: ClaimRow, resolution: str, audit: AuditRow) -> list[Operation]:
    claim_key = keys.claim_row(claim.event_id, claim.parked_message_id)
    now = audit.audit_timestamp
    ops: list[Operation] = []
    if resolution == DELIVERED:
        ops.append(
            store.merge(
                {
                    "PartitionKey": pk,
                    "RowKey": claim_key,
                    "State": ClaimState.delivered.name,
                    "UpdatedAt": now,
                    "ReconcileKey": "",
                    "UnconfirmedKey": "",
                },
                claim.etag or "*",
            )
        )
    else:
        ops.append(store.delete(pk, claim_key, claim.etag or "*"))
        if row.queue_key and row.last_message_id == claim.parked_message_id:
            ops.append(store.merge({"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": UNCLAIMED}))
    if claim.reconcile_key:
        ops.append(store.delete(pk, claim.reconcile_key))
    if claim.unconfirmed_key:
        ops.append(store.delete(pk, claim.unconfirmed_key))
    ops.append(store.insert(audit.to_entity(pk, keys.audit_row(claim.event_id, now, uuid.uuid4().hex))))
    return ops


def resolution_of(audit: AuditRow) -> str | None:
    """What a ``ResolveSettlement`` audit resolved (delivered / released); None for any other audit."""
    if audit.audit_type != RESOLVE_AUDIT or audit.access_denied or not audit.data:
        return None
    try:
        data = json.loads(audit.data)
    except ValueError:
        return None
    value = data.get("resolution") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def control_of(audit: AuditRow) -> str | None:
    """The control message a ``ResolveSettlement`` audit resolved."""
    try:
        data = json.loads(audit.data or "{}")
    except ValueError:
        return None
    value = data.get("controlMessageId") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def resolution_audit(
    audits: list[AuditRow], addressed: str, resolution: str | None, control_message_id: str | None
) -> AuditRow | None:
    """The latest ``ResolveSettlement`` audit (not a refusal) that resolved ``addressed`` (so, when
    ``resolution`` is given; of that control message, when given)."""
    for audit in reversed(audits):
        was = resolution_of(audit)
        if was is None or (resolution is not None and was != resolution):
            continue
        data = json.loads(audit.data or "{}")
        if data.get("addressedMessageId") == addressed and (
            control_message_id is None or data.get("controlMessageId") == control_message_id
        ):
            return audit
    return None
