"""Reads for operators: exact counts per endpoint, event listings, one event with what it allows.

Counts (``handoff/counts.py``): a snapshot row ``ct|0`` plus insert-only delta rows ``ct|d|…`` that the
resolver writes in the same transaction as the change they count. Reading them is one range query
(snapshot first, then the deltas) followed by a point read of the snapshot: an unchanged ETag proves no
fold ran in between (a fold changes the snapshot and deletes the deltas it folded in one transaction),
so the sum is exact; a changed one means "read again". Folding is ETag-conditional, at most 99 deltas a
transaction, done by the timer and by a reader that meets many deltas.

Round trips: counts 2 (+1 per fold); oldest ages 1 per group (the first row of ``sa|P|`` / ``sa|F|``);
the oldest poison day 1, only where poison is counted (the first ``pz|`` row); the overview 1 (the
endpoint list) + 4 per endpoint (+1 with poison) + 2 for unattributed poison (+1 with any); a listing
page 1.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from common.clock import utcnow
from common.errors import Conflict, InvalidInput
from handoff import counts, keys, store
from handoff.records import ListingRow, SinceRow
from handoff.store import HandoffStore, Operation

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


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class Overview:
    def __init__(self, store_: HandoffStore, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store_
        self.clock = clock

    def _table(self) -> Any:
        return self.store.table(keys.EVENTS_TABLE)

    def _range(self, pk: str, low: str, high: str, **kw: Any) -> Any:
        query = f"PartitionKey eq {_quote(pk)} and RowKey ge {_quote(low)} and RowKey lt {_quote(high)}"
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

    def counts(self, endpoint_id: str | None) -> dict[str, int]:
        """Exact counts of an endpoint (None: poison that names no endpoint); folds when deltas pile up."""
        pk = keys.partition(endpoint_id) if endpoint_id is not None else keys.UNATTRIBUTED_PARTITION
        read = self.read_counts(pk)
        if len(read.deltas) >= FOLD_WHEN:
            self._fold(pk, read)
        return read.totals

    def fold(self, endpoint_id: str | None) -> int:
        """Fold up to :data:`FOLD_BATCH` deltas into the snapshot; how many (0 when another fold won)."""
        pk = keys.partition(endpoint_id) if endpoint_id is not None else keys.UNATTRIBUTED_PARTITION
        return self._fold(pk, self.read_counts(pk))

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
            store.insert(snapshot)
            if read.snapshot is None
            else store.replace(snapshot, read.snapshot.metadata["etag"])
        ]
        ops += [store.delete(pk, str(entity["RowKey"])) for entity in batch]
        try:
            self.store.submit(ops)
        except TableTransactionError:
            return 0  # another fold won (the snapshot changed, or the deltas are gone): nothing lost
        return len(batch)

    def oldest(self, endpoint_id: str, group: str) -> datetime | None:
        low, high = keys.since_range(group)
        pages = self._range(keys.partition(endpoint_id), low, high, results_per_page=1).by_page()
        for entity in next(pages, []):
            row: SinceRow = SinceRow.from_entity(entity)
            return row.since_at
        return None

    def oldest_poison_day(self, endpoint_id: str | None) -> str | None:
        """The UTC day (YYYYMMDD) of the oldest poison still counted: the first ``pz|`` index row."""
        pk = keys.partition(endpoint_id) if endpoint_id is not None else keys.UNATTRIBUTED_PARTITION
        low, high = keys.POISON_INDEX_RANGE
        for entity in next(self._range(pk, low, high, results_per_page=1).by_page(), []):
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
        """A page of the endpoint's events, newest change first, from the rows that can match only."""
        pk = keys.partition(endpoint_id)
        low, high = keys.listing_range(bucket, newest, oldest)
        op = "ge"
        if continuation:
            after = decode_continuation(continuation)
            if not (low <= after < high):
                raise InvalidInput(
                    "continuationToken does not belong to this listing (status, from and to must not change "
                    "between pages).",
                    field="continuationToken",
                )
            low, op = after, "gt"
        clauses = [
            f"PartitionKey eq {_quote(pk)}",
            f"RowKey {op} {_quote(low)}",
            f"RowKey lt {_quote(high)}",
        ]
        if event_type_ids:
            clauses.append("(" + " or ".join(f"EventTypeId eq {_quote(t)}" for t in event_type_ids) + ")")
        rows: list[ListingRow] = []
        entities = self._table().query_entities(" and ".join(clauses), results_per_page=page_size + 1)
        for entity in entities:
            if len(rows) == page_size:
                return Listing(rows, encode_continuation(str(rows[-1].row_key)))
            rows.append(ListingRow.from_entity(entity))
        return Listing(rows, None)


def encode_continuation(row_key: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"k": row_key}).encode()).decode().rstrip("=")


def decode_continuation(token: str) -> str:
    """The row key a page ended at. It only positions a read the caller may make anyway, so it needs no
    signature; the caller checks that it lies inside the listing's own range."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        key = data["k"]
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(
            "continuationToken is not one this API issued.", field="continuationToken"
        ) from exc
    if not isinstance(key, str):
        raise InvalidInput("continuationToken is not one this API issued.", field="continuationToken")
    return key
