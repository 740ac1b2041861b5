"""The rules of an operator's resolution of an unconfirmed settlement, pure: whether it is done already,
refused, or to be written, and the one transaction that writes it. No I/O:
:mod:`handoff.settlement.unconfirmed`
reads the claim and the audits, asks :func:`decide`, submits :func:`plan_resolution` and asks again.

An operator marks an unconfirmed claim delivered (checked at the endpoint) or releases it (the hand-off can
be settled again); the claim's change and the resolution's audit are written in one transaction, so a claim
that is gone (or delivered) is explained by the audit read after it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from common import transactions as tx
from common.clock import iso
from common.errors import Conflict, NotFound
from common.transactions import Operation
from handoff.receive.leases import UNCLAIMED
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.json_text import text_at
from handoff.storage.records import AuditRow, ClaimRow, EventRow

RESOLVE_AUDIT = "ResolveSettlement"
DELIVERED, RELEASED = "delivered", "released"


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


def needs_history(claim: ClaimRow | None, control_message_id: str | None) -> bool:
    """Whether the answer depends on an earlier resolution (its audit must be read): the claim is gone,
    no longer unconfirmed, or another one (the message was settled again after a release)."""
    return (
        claim is None or claim.state is not ClaimState.unconfirmed or _other_claim(claim, control_message_id)
    )


def decide(
    claim: ClaimRow | None,
    earlier: AuditRow | None,
    *,
    event_id: str,
    addressed: str,
    resolution: str,
    control_message_id: str | None,
) -> ClaimResolution | ClaimRow:
    """The answer when the resolution is done already (the same one: ``replayed``), else the unconfirmed
    claim to resolve; raises 404 (no claim), 409 (resolved otherwise, another claim, not unconfirmed).

    ``earlier``: the latest resolution audit of the message (read only when :func:`needs_history`)."""
    if needs_history(claim, control_message_id):
        done = _done_before(claim, addressed, resolution, earlier)
        if done is not None:
            return done
        if claim is None:
            raise NotFound(f"No settlement of message {addressed!r} of event {event_id!r} is claimed.")
        if _other_claim(claim, control_message_id):
            raise Conflict(
                f"The claim of message {addressed!r} holds control message "
                f"{claim.control_message_id!r}, not {control_message_id!r} (it was released and "
                "settled again?).",
                field="controlMessageId",
            )
    assert claim is not None
    if claim.state is not ClaimState.unconfirmed:
        raise Conflict(
            f"The settlement of message {addressed!r} is {claim.state.name}, not unconfirmed: "
            "only an unconfirmed settlement is resolved by an operator.",
            field="messageId",
        )
    return claim


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


def plan_resolution(
    pk: str, row: EventRow, claim: ClaimRow, resolution: str, audit: AuditRow
) -> list[Operation]:
    """One transaction: the claim marked delivered or deleted (``If-Match`` it as read; a release also frees
    the queue row of the hand-off it settled), its index rows deleted, the audit inserted.

    A released claim whose audit was rendered from it (ADR-0022 change 3) leaves that audit behind as a row
    of its own, written here with the claim's time: the settlement's audit stays after its release (its
    message may have reached the endpoint), beside the resolution's, as when the claim wrote it."""
    claim_key = keys.claim_row(claim.event_id, claim.parked_message_id)
    now = audit.audit_timestamp
    ops: list[Operation] = []
    if resolution == DELIVERED:
        ops.append(
            tx.merge(
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
        ops.append(tx.delete(pk, claim_key, claim.etag or "*"))
        if row.queue_key and row.last_message_id == claim.parked_message_id:
            ops.append(tx.merge({"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": UNCLAIMED}))
    if claim.reconcile_key:
        ops.append(tx.delete(pk, claim.reconcile_key))
    if claim.unconfirmed_key:
        ops.append(tx.delete(pk, claim.unconfirmed_key))
    settled = claim.audit() if resolution != DELIVERED else None
    if settled is not None:  # the released claim's own audit, left behind as a row
        key = keys.audit_row(claim.event_id, settled.audit_timestamp, uuid.uuid4().hex)
        ops.append(tx.insert(settled.to_entity(pk, key)))
    ops.append(tx.insert(audit.to_entity(pk, keys.audit_row(claim.event_id, now, uuid.uuid4().hex))))
    return ops


def resolution_of(audit: AuditRow) -> str | None:
    """What a ``ResolveSettlement`` audit resolved (delivered / released); None for any other audit."""
    if audit.audit_type != RESOLVE_AUDIT or audit.access_denied:
        return None
    return text_at(audit.data, "resolution")


def control_of(audit: AuditRow) -> str | None:
    """The control message a ``ResolveSettlement`` audit resolved."""
    return text_at(audit.data, "controlMessageId")


def resolution_audit(
    audits: list[AuditRow], addressed: str, resolution: str | None, control_message_id: str | None
) -> AuditRow | None:
    """The latest ``ResolveSettlement`` audit (not a refusal) that resolved ``addressed`` (so, when
    ``resolution`` is given; of that control message, when given)."""
    for audit in reversed(audits):
        was = resolution_of(audit)
        if was is None or (resolution is not None and was != resolution):
            continue
        if text_at(audit.data, "addressedMessageId") == addressed and (
            control_message_id is None or control_of(audit) == control_message_id
        ):
            return audit
    return None
