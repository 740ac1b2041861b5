"""Which status buckets an event row counts in, and what one change does to the counts. Pure.

Two kinds of buckets (ADR-0022):

* **open** statuses (Pending and its hand-off subset, Deferred, Failed, DeadLettered, Unsupported) are
  counted by reading their listing rows (``sd|{status}|``, one per open event, keys and two columns only):
  the rows exist anyway, so counting them costs no write; the read is linear in the endpoint's *open*
  events, never in the table, and stops at a cap per status (then the count is :class:`Capped`: "at
  least").
* **tallied** buckets (Completed, Skipped, and Poison) grow without bound, so they are counted the way
  they always were: a projection that moves an event into or out of one inserts a *delta* row
  (``+1 Completed``) in the same entity-group transaction as the event row, so the delta exists exactly
  when the change does and inserts never contend; readers add the deltas to a snapshot row, and folding
  is one ETag-conditional transaction that also deletes the deltas it folded
  (``handoff/storage/overview.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from handoff.messages.contract import HANDOFF_SUB_STATUS, ResolutionStatus

PENDING_HANDOFF = "PendingHandoff"
POISON = "Poison"

# The open buckets, counted from the open events' listing rows (no delta is written for them). ``Pending``
# holds every Pending row, hand-offs included (NimBus's Pending column counts Pending + Handoff);
# ``PendingHandoff`` is the subset (the seeds' badge).
OPEN = (
    ResolutionStatus.Pending.name,
    PENDING_HANDOFF,
    ResolutionStatus.Deferred.name,
    ResolutionStatus.Failed.name,
    ResolutionStatus.DeadLettered.name,
    ResolutionStatus.Unsupported.name,
)
# The closed statuses grow without bound: counted by snapshot + deltas (tallied), with poison.
CLOSED = (ResolutionStatus.Completed.name, ResolutionStatus.Skipped.name)
TALLIED = (*CLOSED, POISON)
# Every bucket a row can count in, and every count.
BUCKETS = (*OPEN, *CLOSED)
COUNTED = (*BUCKETS, POISON)
# The statuses with a listing range of their own (``PendingHandoff`` is a filter on ``Pending``'s).
LISTED = tuple(s.name for s in ResolutionStatus if s.name in BUCKETS)

# Groups of the oldest-first index: when an open event became Pending (P), or failed (F: Failed or
# DeadLettered, NimBus's OldestFailureAt).
PENDING_GROUP = "P"
FAILED_GROUP = "F"


@dataclass(frozen=True)
class Capped:
    """A count whose reading stops at a cap: ``at_least`` when it reached it (there may be more)."""

    count: int
    at_least: bool


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


def tallied(change: Mapping[str, int]) -> dict[str, int]:
    """The part of a change a delta row records: the tallied buckets only (open ones are read from rows)."""
    return {bucket: value for bucket, value in change.items() if bucket in TALLIED}


def listed(bucket: str | None) -> tuple[str, ...]:
    """The listing ranges an events listing of ``bucket`` reads (None: all events)."""
    if bucket is None:
        return LISTED
    return (ResolutionStatus.Pending.name,) if bucket == PENDING_HANDOFF else (bucket,)


def column(bucket: str) -> str:
    """Column name of a bucket in delta and snapshot rows."""
    return f"N{bucket}"


def add(total: Mapping[str, int], change: Mapping[str, int]) -> dict[str, int]:
    out = {bucket: int(total.get(bucket, 0)) for bucket in COUNTED}
    for bucket, value in change.items():
        out[bucket] = out.get(bucket, 0) + int(value)
    return out


def read_columns(entity: Mapping[str, object]) -> dict[str, int]:
    """The tallied buckets' values stored in a delta or snapshot row (missing columns are 0; the open
    buckets' columns that rows before ADR-0022 carry are not read)."""
    values: dict[str, int] = {}
    for bucket in TALLIED:
        raw = entity.get(column(bucket))
        raw = getattr(raw, "value", raw)
        if isinstance(raw, int | str) and not isinstance(raw, bool):
            values[bucket] = int(raw)
    return values
