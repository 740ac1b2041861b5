"""The rules of a leased receive, pure: when a lease holds a hand-off, and the one conditional write on the
queue row that takes, renews or gives back a lease. No I/O: :mod:`handoff.receive.receiver` reads and submits.

A lease is the queue row's ``ClaimedUntil`` (the lease's end) and ``LeaseToken``, written ``If-Match`` the
row as read: of agents racing for one hand-off, one write wins; a refused write (the row changed, or left
the queue) means the lease was not taken, or is lost.
"""

from __future__ import annotations

from datetime import datetime

from common import transactions as tx
from common.clock import iso
from common.errors import Conflict
from common.transactions import Operation, Refusal
from handoff.storage.records import QueueRow

# ``ClaimedUntil`` of a hand-off no one holds: it sorts before every time, so the column always exists (a
# filter on a missing property never matches).
UNCLAIMED = "0"
# ``ClaimedUntil`` of a hand-off whose settlement is in flight: claims do not expire, so neither does the
# mark; it is cleared when a refused send releases the claim, or the row leaves the queue.
CLAIMED = "9999-12-31T23:59:59.999Z"


class LeaseLost(Conflict, slug="lease-lost", title="The lease on this hand-off was lost"):
    """The lease token no longer holds the hand-off (expired and taken, released, or settled)."""


def held(entry: QueueRow | None, token: str) -> bool:
    """``token`` still holds the hand-off: its lease was not released, taken over, or settled."""
    return (
        entry is not None
        and entry.lease_token == token
        and not entry.claimed_until.startswith(CLAIMED[:4])  # a settlement's mark, however written
        and entry.claimed_until != UNCLAIMED
    )


def plan_lease(
    pk: str, entry: QueueRow, token: str, until: datetime, agent_id: str | None, leased_at: datetime
) -> Operation:
    """Take (or renew) the lease: ``If-Match`` the queue row as read."""
    assert entry.row_key is not None and entry.etag is not None
    entity = {
        "PartitionKey": pk,
        "RowKey": entry.row_key,
        "ClaimedUntil": iso(until),
        "LeaseToken": token,
        "LeasedBy": agent_id or "",
        "LeasedAt": leased_at,
    }
    return tx.merge(entity, entry.etag)


def plan_give_back(pk: str, entry: QueueRow) -> Operation:
    """Give the hand-off back at once (the next receive gets it): ``If-Match`` the queue row as read."""
    assert entry.row_key is not None and entry.etag is not None
    return tx.merge({"PartitionKey": pk, "RowKey": entry.row_key, "ClaimedUntil": UNCLAIMED}, entry.etag)


def lost(refused: Refusal | None) -> bool:
    """A lease write refused because the queue row changed (another agent, a settlement) or left the queue
    (a projection): the lease was not taken, or is lost. Anything else is no answer about the lease."""
    return refused is not None and refused.status in (404, 412)
