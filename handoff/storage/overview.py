"""Reads for operators: exact counts per endpoint, event listings, one event with what it allows.

It lives with the hand-off tables it reads: the resolver writes the counts' deltas and the sweeper's tick
folds them, both below the operator API that shows them.

Counts (``handoff/storage/counts.py``): a snapshot row ``ct|0`` plus insert-only delta rows ``ct|d|…`` that
the
resolver writes in the same transaction as the change they count. Reading them is one range query
(snapshot first, then the deltas) followed by a point read of the snapshot: an unchanged ETag proves no
fold ran in between (a fold changes the snapshot and deletes the deltas it folded in one transaction),
so the sum is exact; a changed one means "read again". Folding is ETag-conditional, at most 99 deltas a
transaction, done by the timer and by a reader that meets many deltas.

Round trips: counts 2 (+1 per fold); oldest ages 1 per group (the first row of ``sa|P|`` / ``sa|F|``);
the oldest poison day 1, only where poison is counted (the first ``pz|`` row); the overview 1 (the
endpoint list) + 4 per endpoint (+1 with poison) + 2 for unattributed poison (+1 with any); a listing
page 1.

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
from handoff.storage import counts, keys
from handoff.storage.records import ListingRow, SinceRow
from handoff.storage.store import HandoffStore

log = logging.getLogger("settle.management")

FOLD_BATCH = 99  # + the snapshot = 100 operations, Azure's limit per transaction
FOLD_WHEN = 200  # a reader folds when it meets this many deltas
_READ_ATTEMPTS = 5
MAX_PAGE = 200


@dataclass(frozen=True)
class CountsRead:
    totals: dict[str, int]
    snapshot: Any  # the TableEntity (its ETag is in ``metadata``), or None
    deltas: list[Any]


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

    def counts(self, endpoint_id: str | None) -> dict[str, int]:
        """Exact counts of an endpoint (None: poison that names no endpoint), the sum of its partitions'
        folds; folds a partition when its deltas pile up."""
        totals: dict[str, int] = {}
        for pk in self._count_partitions(endpoint_id):
            read = self.read_counts(pk)
            if len(read.deltas) >= FOLD_WHEN:
                self._fold(pk, read)
            totals = counts.add(totals, read.totals) if totals else read.totals
        return totals

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

    def oldest(self, endpoint_id: str, group: str) -> datetime | None:
        low, high = keys.since_range(group)
        found: list[datetime] = []
        for pk in self.store.endpoint_partitions(endpoint_id):  # each shard's first row; the oldest of them
            for entity in first_rows(self._range(pk, low, high, results_per_page=1), 1):
                row: SinceRow = SinceRow.from_entity(entity)
                found.append(row.since_at)
        return min(found) if found else None

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

        Sharded endpoints: each shard's next ``page_size + 1`` rows, merged by RowKey (newest first); the
        continuation holds each shard's position."""
        partitions = self.store.endpoint_partitions(endpoint_id)
        low, high = keys.listing_range(bucket, newest, oldest)
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
                k in partitions and isinstance(v, str) and low <= v < high for k, v in positions.items()
            ):
                raise page_tokens.refused()
        merged: list[tuple[str, str, Any]] = []
        for pk in partitions:
            after = positions.get(pk)
            clauses = [
                f"PartitionKey eq {quoted(pk)}",
                f"RowKey {'gt' if after else 'ge'} {quoted(after or low)}",
                f"RowKey lt {quoted(high)}",
            ]
            if event_type_ids:
                clauses.append("(" + " or ".join(f"EventTypeId eq {quoted(t)}" for t in event_type_ids) + ")")
            entities = self._table().query_entities(" and ".join(clauses), results_per_page=page_size + 1)
            for n, entity in enumerate(entities, 1):
                merged.append((str(entity["RowKey"]), pk, entity))
                if n > page_size:
                    break
        merged.sort(key=lambda item: item[:2])
        rows = [ListingRow.from_entity(entity) for _, _, entity in merged[:page_size]]
        if len(merged) <= page_size:
            return Listing(rows, None)
        for row_key, pk, _ in merged[:page_size]:
            positions[pk] = row_key
        return Listing(rows, page_tokens.encode(bound, positions))
