"""Which status buckets an event row counts in, and what one change does to the counts. Pure.

The operator overview needs exact counts per endpoint without scanning a partition, and the resolver
projects concurrently (sessions in parallel, several instances), so a single counter row updated in every
projection would serialise them. Instead every projection that moves an event between buckets inserts
one *delta* row (``+1 Failed, -1 Pending``) in the same entity-group transaction as the event row: the
delta exists exactly when the change does, and inserts never contend. Readers add the deltas to a
snapshot row; folding deltas into the snapshot is one ETag-conditional transaction that also deletes
the deltas it folded (``management/overview.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from handoff.messages.contract import HANDOFF_SUB_STATUS, ResolutionStatus

PENDING_HANDOFF = "PendingHandoff"
POISON = "Poison"

# Every bucket a row can count in. ``Pending`` holds every Pending row, hand-offs included (NimBus's
# Pending column counts Pending + Handoff); ``PendingHandoff`` is the subset (the seeds' badge).
BUCKETS = (
    ResolutionStatus.Pending.name,
    PENDING_HANDOFF,
    ResolutionStatus.Deferred.name,
    ResolutionStatus.Failed.name,
    ResolutionStatus.DeadLettered.name,
    ResolutionStatus.Unsupported.name,
    ResolutionStatus.Completed.name,
    ResolutionStatus.Skipped.name,
)
COUNTED = (*BUCKETS, POISON)

# Groups of the oldest-first index: when an open event became Pending (P), or failed (F: Failed or
# DeadLettered, NimBus's OldestFailureAt).
PENDING_GROUP = "P"
FAILED_GROUP = "F"


def buckets_of(status: ResolutionStatus, sub_status: str | None) -> tuple[str, ...]:
    """The listing buckets of a row (a parked row is in ``Pending`` and ``PendingHandoff``)."""
    if status is ResolutionStatus.Pending and sub_status == HANDOFF_SUB_STATUS:
        return (status.name, PENDING_HANDOFF)
    return (status.name,)


def group_of(status: ResolutionStatus) -> str | None:
    if status is ResolutionStatus.Pending:
        return PENDING_GROUP
    if status in (ResolutionStatus.Failed, ResolutionStatus.DeadLettered):
        return FAILED_GROUP
    return None


def delta(before: Iterable[str], after: Iterable[str]) -> dict[str, int]:
    """The count changes of a row moving from buckets ``before`` to ``after`` (empty: no change)."""
    old, new = set(before), set(after)
    changes = {bucket: -1 for bucket in old - new}
    changes.update({bucket: 1 for bucket in new - old})
    return changes


def column(bucket: str) -> str:
    """Column name of a bucket in delta and snapshot rows."""
    return f"N{bucket}"


def add(total: Mapping[str, int], change: Mapping[str, int]) -> dict[str, int]:
    out = {bucket: int(total.get(bucket, 0)) for bucket in COUNTED}
    for bucket, value in change.items():
        out[bucket] = out.get(bucket, 0) + int(value)
    return out


def read_columns(entity: Mapping[str, object]) -> dict[str, int]:
    """The bucket values stored in a delta or snapshot row (missing columns are 0)."""
    values: dict[str, int] = {}
    for bucket in COUNTED:
        raw = entity.get(column(bucket))
        raw = getattr(raw, "value", raw)
        if isinstance(raw, int | str) and not isinstance(raw, bool):
            values[bucket] = int(raw)
    return values
