"""Reads for operators: counts per endpoint, event listings, one event with what it allows.

It lives with the hand-off tables it reads: the resolver writes the listing rows and the counts' deltas,
and the sweeper's tick folds the deltas, both below the operator API that shows them.

Counts (``handoff/storage/counts.py``, ADR-0022):

* **tallied** buckets (Completed, Skipped, Poison): a snapshot row ``ct|0`` plus insert-only delta rows
  ``ct|d|…`` that the resolver writes in the same transaction as the change they count. Reading them is one
  range query (snapshot first, then the deltas) followed by a point read of the snapshot: an unchanged ETag
  proves no fold ran in between (a fold changes the snapshot and deletes the deltas it folded in one
  transaction), so the sum is exact; a changed one means "read again". Folding is ETag-conditional, at
  most 99 deltas a transaction, done by the timer and by a reader that meets many deltas.
* **open** buckets (Pending, PendingHandoff, Deferred, Failed, DeadLettered, Unsupported): the open
  events' listing rows, read keys-only (with the two columns the overview needs) in three ranges per
  partition (``sd|DeadLettered|``…``sd|Failed}``, ``sd|Pending|``, ``sd|Unsupported|``): one request per
  1,000 open events, never a scan of the table. Each row is counted in the status it had when its page was
  read: an event that changes status *during* the read may be counted in both or neither for that read.
  The same read gives the oldest ages (``SinceAt`` of the Pending rows and of the Failed and DeadLettered
  rows). Each status is read up to :data:`OPEN_COUNT_CAP` rows (10 pages) of the endpoint, then its rows
  are skipped (the read goes on from the next status's first key): a count that reached the cap says
  "at least" (``PendingHandoff`` too when ``Pending`` reached it, its rows being ``Pending``'s), and so does
  the oldest age of a group it belongs to: the rows read are the most recently changed, so the oldest
  event is at least as old as the oldest read. At 100 % open that bounds the read to 10 pages per open
  status: 50 requests at one shard when each holds that many, and whatever it holds at most
  5 * cap / 1,000 + 10 S + 10 with S shards (a query per range and shard, one more per status that fills,
  each at most one page beyond its rows).

A listing page: one range read per listed status and shard (a status: 1; all events: the 7 statuses'
ranges, merged newest change first; ``PendingHandoff``: ``Pending``'s range, filtered server-side).

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from common import page_tokens
from common.clock import utcnow
from common.errors import Conflict
from common.tables import first_rows, quoted
from common.transactions import Operation, delete, insert, replace
from handoff.messages.contract import HANDOFF_SUB_STATUS, ResolutionStatus
from handoff.storage import counts, keys
from handoff.storage.counts import Capped
from handoff.storage.records import ListingRow
from handoff.storage.store import HandoffStore

log = logging.getLogger("settle.management")

FOLD_BATCH = 99  # + the snapshot = 100 operations, Azure's limit per transaction
FOLD_WHEN = 200  # a reader folds when it meets this many deltas
_READ_ATTEMPTS = 5
MAX_PAGE = 200
# The open events' listing rows counted per status and endpoint (10 pages of OPEN_PAGE): beyond, "at least"
# (ADR-0022 "Reads, measured"). Read when a read starts, so a test can make them small.
OPEN_COUNT_CAP = 10_000
OPEN_PAGE = 1000  # keys-only rows a page (Azure's largest)
# The open statuses with rows of their own (``PendingHandoff`` is counted from ``Pending``'s).
OPEN_LISTED = tuple(s for s in counts.OPEN if s in counts.LISTED)


@dataclass(frozen=True)
class CountsRead:
    totals: dict[str, int]
    snapshot: Any  # the TableEntity (its ETag is in ``metadata``), or None
    deltas: list[Any]


@dataclass(frozen=True)
class OpenEvents:
    """The open events of an endpoint: how many per open bucket, and when the oldest entered each group;
    ``at_least``: the buckets whose reading stopped at :data:`OPEN_COUNT_CAP` (there may be more, and an
    older one among them)."""

    totals: dict[str, int]
    oldest_pending_at: datetime | None
    oldest_failed_at: datetime | None
    at_least: frozenset[str] = frozenset()

    def count(self, bucket: str) -> Capped:
        return Capped(self.totals[bucket], bucket in self.at_least)

    @property
    def oldest_pending_at_least(self) -> bool:
        """The Pending events were not all read: the oldest is at least as old as ``oldest_pending_at``."""
        return ResolutionStatus.Pending.name in self.at_least

    @property
    def oldest_failed_at_least(self) -> bool:
        """As :attr:`oldest_pending_at_least`, for the Failed and DeadLettered events."""
        return bool({ResolutionStatus.Failed.name, ResolutionStatus.DeadLettered.name} & self.at_least)


@dataclass(frozen=True)
class Listing:
    items: list[ListingRow]
    continuation: str | None


class Overview:
    def __init__(self, store_: HandoffStore, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store_
        self.clock = clock

    def _table(self) -> Any:
        return self.store.table(keys.EVENTS_TABLE)

    def _range(self, pk: str, low: str, high: str, **kw: Any) -> Any:
        query = f"PartitionKey eq {quoted(pk)} and RowKey ge {quoted(low)} and RowKey lt {quoted(high)}"
        return self._table().query_entities(query, **kw)

    # -- counts -------------------------------------------------------------------------------------

    def read_counts(self, pk: str) -> CountsRead:
        """Snapshot + deltas, proven consistent by the snapshot's unchanged ETag (see module docstring)."""
        from azure.core.exceptions import ResourceNotFoundError

        low, high = keys.COUNTS_RANGE
        for _ in range(_READ_ATTEMPTS):
            snapshot: Any = None
            deltas: list[Any] = []
            for entity in self._range(pk, low, high):
                if entity["RowKey"] == keys.COUNTS_SNAPSHOT:
                    snapshot = entity
                else:
                    deltas.append(entity)
            try:
                check = self._table().get_entity(pk, keys.COUNTS_SNAPSHOT, select=["RowKey"])
                etag = check.metadata.get("etag")
            except ResourceNotFoundError:
                etag = None
            if etag == (snapshot.metadata.get("etag") if snapshot is not None else None):
                totals = counts.add(counts.read_columns(snapshot or {}), {})
                for entity in deltas:
                    totals = counts.add(totals, counts.read_columns(entity))
                return CountsRead(totals, snapshot, deltas)
        raise Conflict("The counts kept changing while being read; retry.")

    def _count_partitions(self, endpoint_id: str | None) -> list[str]:
        """Where an endpoint's counts live: its unsharded partition (poison's ``ct|`` rows) and, with
        ``SETTLE_HANDOFF_SHARDS`` > 1, each shard (the deltas written with its events' changes)."""
        if endpoint_id is None:
            return [keys.UNATTRIBUTED_PARTITION]
        base = keys.partition(endpoint_id)
        return [base, *(pk for pk in self.store.endpoint_partitions(endpoint_id) if pk != base)]

    def tallies(self, endpoint_id: str | None) -> dict[str, int]:
        """Exact counts of the tallied buckets of an endpoint (None: poison that names no endpoint), the sum
        of its partitions' folds; folds a partition when its deltas pile up."""
        totals: dict[str, int] = {}
        for pk in self._count_partitions(endpoint_id):
            read = self.read_counts(pk)
            if len(read.deltas) >= FOLD_WHEN:
                self._fold(pk, read)
            totals = counts.add(totals, read.totals) if totals else read.totals
        return totals

    def counts(self, endpoint_id: str | None) -> dict[str, int]:
        """Every bucket's count of an endpoint: the tallies, and the open events' rows counted (up to
        :data:`OPEN_COUNT_CAP` each: :meth:`open_events` says which stopped there)."""
        totals = self.tallies(endpoint_id)
        if endpoint_id is not None:
            totals.update(self.open_events(endpoint_id).totals)
        return totals

    def count(self, endpoint_id: str, bucket: str) -> Capped:
        """One bucket's count, reading only what it needs (an open status: its own range, up to the cap;
        a tally is exact)."""
        if bucket in counts.OPEN:
            return self.open_events(endpoint_id, statuses=counts.listed(bucket), ages=False).count(bucket)
        return Capped(self.tallies(endpoint_id)[bucket], False)

    def open_events(
        self, endpoint_id: str, *, statuses: Sequence[str] = OPEN_LISTED, ages: bool = True
    ) -> OpenEvents:
        """Counts and (``ages``) oldest ages of the endpoint's open events of ``statuses`` (all open ones by
        default), from their listing rows: the keys and the columns those need, every shard, each status up
        to :data:`OPEN_COUNT_CAP` rows (see the module docstring)."""
        tally = _OpenTally(statuses, OPEN_COUNT_CAP)
        select = ["RowKey"]
        if ResolutionStatus.Pending.name in statuses:
            select.append("PendingSubStatus")  # the hand-off subset
        if ages:
            select += ["SinceAt", "UpdatedAt"]
        for pk in self.store.endpoint_partitions(endpoint_id):
            for low, high in keys.open_ranges(statuses, (*counts.LISTED, counts.PENDING_HANDOFF)):
                while (low := tally.unread(low, high)) < high:
                    for entity in self._range(pk, low, high, select=select, results_per_page=OPEN_PAGE):
                        full = tally.add(entity)
                        if full is not None:  # the rest of its rows: skipped, read on from the next status
                            low = keys.listing_range(full, None, None)[1]
                            break
                    else:
                        break
        return tally.open_events()

    def fold(self, endpoint_id: str | None) -> int:
        """Fold up to :data:`FOLD_BATCH` deltas of each partition into its snapshot; how many (0 when
        another fold won)."""
        return sum(self._fold(pk, self.read_counts(pk)) for pk in self._count_partitions(endpoint_id))

    def fold_all(self, endpoint_ids: Sequence[str], *, rounds: int = 10) -> dict[str, str]:
        """Fold every endpoint's deltas (the timer), at most ``rounds`` transactions each; one endpoint's
        failure is reported and the others go on. Returns endpoint → error."""
        errors: dict[str, str] = {}
        for endpoint_id in [*endpoint_ids, None]:
            try:
                for _ in range(rounds):
                    if self.fold(endpoint_id) < FOLD_BATCH:
                        break
            except Exception as exc:
                log.warning("folding the counts of %s failed", endpoint_id, exc_info=True)
                errors[endpoint_id or keys.UNATTRIBUTED_PARTITION] = f"{type(exc).__name__}: {exc}"
        return errors

    def _fold(self, pk: str, read: CountsRead) -> int:
        from azure.data.tables import TableTransactionError

        batch = read.deltas[:FOLD_BATCH]
        if not batch:
            return 0
        totals = counts.read_columns(read.snapshot or {})
        for entity in batch:
            totals = counts.add(totals, counts.read_columns(entity))
        snapshot = {"PartitionKey": pk, "RowKey": keys.COUNTS_SNAPSHOT, "FoldedAt": self.clock()}
        snapshot.update({counts.column(b): v for b, v in totals.items()})
        ops: list[Operation] = [
            insert(snapshot) if read.snapshot is None else replace(snapshot, read.snapshot.metadata["etag"])
        ]
        ops += [delete(pk, str(entity["RowKey"])) for entity in batch]
        try:
            self.store.submit(ops)
        except TableTransactionError:
            return 0  # another fold won (the snapshot changed, or the deltas are gone): nothing lost
        return len(batch)

    def oldest_poison_day(self, endpoint_id: str | None) -> str | None:
        """The UTC day (YYYYMMDD) of the oldest poison still counted: the first ``pz|`` index row."""
        pk = keys.partition(endpoint_id) if endpoint_id is not None else keys.UNATTRIBUTED_PARTITION
        low, high = keys.POISON_INDEX_RANGE
        for entity in first_rows(self._range(pk, low, high, results_per_page=1), 1):
            return str(entity["Day"])
        return None

    # -- listings ----------------------------------------------------------------------------------

    def events(
        self,
        endpoint_id: str,
        *,
        bucket: str | None,
        event_type_ids: Sequence[str],
        oldest: datetime | None,
        newest: datetime | None,
        page_size: int,
        continuation: str | None,
    ) -> Listing:
        """A page of the endpoint's events, newest change first, from the rows that can match only.

        Every listed status's range (one for a status, seven for all events) in every shard: the next
        ``page_size + 1`` rows of each, merged by the key after the status (newest first); the continuation
        holds each range's position."""
        ranges = {
            _label(status, pk): (status, pk)
            for status in counts.listed(bucket)
            for pk in self.store.endpoint_partitions(endpoint_id)
        }
        bound = page_tokens.binding(
            "events",
            endpoint_id,
            bucket,
            sorted(event_type_ids),
            oldest and oldest.isoformat(),
            newest and newest.isoformat(),
        )
        positions: dict[str, str] = {}
        if continuation:
            positions = page_tokens.decode(continuation, bound)
            if not isinstance(positions, dict) or not all(
                label in ranges
                and isinstance(key, str)
                and _within(key, keys.listing_range(ranges[label][0], newest, oldest))
                for label, key in positions.items()
            ):
                raise page_tokens.refused()
        filters: list[str] = []
        if event_type_ids:
            filters.append("(" + " or ".join(f"EventTypeId eq {quoted(t)}" for t in event_type_ids) + ")")
        if bucket == counts.PENDING_HANDOFF:
            filters.append(f"PendingSubStatus eq {quoted(HANDOFF_SUB_STATUS)}")
        merged: list[tuple[str, str, Any]] = []
        for label, (status, pk) in ranges.items():
            low, high = keys.listing_range(status, newest, oldest)
            after = positions.get(label)
            clauses = [
                f"PartitionKey eq {quoted(pk)}",
                f"RowKey {'gt' if after else 'ge'} {quoted(after or low)}",
                f"RowKey lt {quoted(high)}",
                *filters,
            ]
            entities = self._table().query_entities(" and ".join(clauses), results_per_page=page_size + 1)
            prefix = keys.listing_prefix(status)
            for n, entity in enumerate(entities, 1):
                # newest first across statuses: the key after the status is "{inverted change}|{event}"
                merged.append((str(entity["RowKey"])[len(prefix) :], label, entity))
                if n > page_size:
                    break
        merged.sort(key=lambda item: item[:2])
        rows = [ListingRow.from_entity(entity) for _, _, entity in merged[:page_size]]
        if len(merged) <= page_size:
            return Listing(rows, None)
        for _, label, entity in merged[:page_size]:
            positions[label] = str(entity["RowKey"])
        return Listing(rows, page_tokens.encode(bound, positions))


class _OpenTally:
    """The open events' listing rows counted as :meth:`Overview.open_events` reads them, each status up to
    ``cap`` rows (over every shard)."""

    def __init__(self, statuses: Sequence[str], cap: int) -> None:
        self.statuses = statuses
        self.cap = cap
        self.totals = dict.fromkeys(counts.OPEN, 0)
        self.oldest: dict[str, datetime] = {}

    def full(self, status: str) -> bool:
        return self.totals[status] >= self.cap

    def unread(self, low: str, high: str) -> str:
        """Where reading ``[low, high)`` goes on: past the statuses at its start that are full."""
        for status in sorted(self.statuses, key=keys.listing_prefix):
            end = keys.listing_range(status, None, None)[1]
            if low < end <= high:
                if not self.full(status):
                    break
                low = end
        return low

    def add(self, entity: Any) -> str | None:
        """Counts one listing row; the status it names when that status is full (then a row of it is not
        counted: reading goes on past it)."""
        status = keys.listing_status(str(entity["RowKey"]))
        if status not in self.statuses:
            return None  # not a listing row of these statuses (cannot be in these ranges)
        if self.full(status):
            return status  # a row of a status another shard filled
        self.totals[status] += 1
        if status == ResolutionStatus.Pending.name and entity.get("PendingSubStatus") == HANDOFF_SUB_STATUS:
            self.totals[counts.PENDING_HANDOFF] += 1
        group = counts.group_of(ResolutionStatus[status])
        # rows before ADR-0022 carry no SinceAt: their last change is the closest time they hold
        since = entity.get("SinceAt") or entity.get("UpdatedAt")
        if group and isinstance(since, datetime) and (group not in self.oldest or since < self.oldest[group]):
            self.oldest[group] = since
        return status if self.full(status) else None

    def open_events(self) -> OpenEvents:
        at_least = {s for s in self.statuses if self.full(s)}
        if ResolutionStatus.Pending.name in at_least:
            at_least.add(counts.PENDING_HANDOFF)  # counted among the Pending rows read
        return OpenEvents(
            self.totals,
            self.oldest.get(counts.PENDING_GROUP),
            self.oldest.get(counts.FAILED_GROUP),
            frozenset(at_least),
        )


def _label(status: str, pk: str) -> str:
    """A listing range's name in a continuation token (statuses hold no space)."""
    return f"{status} {pk}"


def _within(key: str, span: tuple[str, str]) -> bool:
    return span[0] <= key < span[1]
