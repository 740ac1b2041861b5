"""State records for operators: one record by key with its history, and records stuck in Processing.

"Stuck" = Processing with its lock expired (catch-up turns those Failed on its next run; the listing shows
what it has not reached yet, or everything when catch-up is not running). It reads the catch-up index of
ADR-0011 and nothing else: the level-1 rows (``statelocks``) of lock minutes that have begun, then, per
(minute, partition), the locks already due that the minute's markers name (ADR-0021: ``L{lockId}`` entries;
and the earlier code's level-2 rows ``~l|{minute}|…``), then the head each names. A lock whose head no longer
holds it (concluded, extended, taken over) is skipped, as catch-up would. Never a scan: its cost follows the
locks of the minutes that are due.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from functools import partial
from itertools import islice
from typing import Any

from common.beside import side_by_side
from common.clock import epoch_ms
from common.errors import NotFound
from state import service as state_service
from state.handlers import to_record
from state.keys import LOCK_KIND, bucket_range, is_marker, parse_index_row_key
from state.lifecycle import INDEX_COLUMNS, Head
from state.model import Status
from state.rows import MarkerRow, index_entry
from state.schemas import HistoryRequest, KeyRequest, Record, RecordPage

MAX_STUCK = 200
_HEAD_READS = 100  # heads asked for at once
_HEAD_READERS = 10  # the table client keeps 10 connections
# The head's column naming its lock index row.
_LOCK_COLUMN = next(column for column, kind in INDEX_COLUMNS.items() if kind == LOCK_KIND)


def lookup(req: HistoryRequest) -> tuple[Record | None, RecordPage]:
    """The record (None when the key has none) and the first page of its history."""

    handler = state_service.handler(req.handler)
    try:
        record: Record | None = handler.get(KeyRequest(key=req.key, handler=req.handler))
    except NotFound:
        record = None
    return record, handler.history(req)


# Where a page of stuck records ended: the level-1 pointer (expiry minute, partition) and the lock's place in
# that minute (a level-2 row's RowKey, or ``{marker RowKey}|{lockId}`` for a marker's entry).
Position = tuple[int, str, str]


def _locks_due(
    store: Any, partition: str, bucket: int, now_ms: int, after: str | None
) -> Iterator[tuple[str, str, str]]:
    """The locks of one minute of one partition due at ``now_ms``, in order, behind the place ``after``:
    (place, head RowKey, what the head must name): a marker's entries (ADR-0021: the lock id) and the earlier
    code's level-2 rows (their RowKey, the head's ``LockIndexKey``). One range read of the minute from
    ``after``'s row on (markers sort after the rows)."""
    low, high = bucket_range(LOCK_KIND, bucket)
    if after is not None:
        low = after if not is_marker(after.rsplit("|", 1)[0]) else after.rsplit("|", 1)[0]
    found: list[tuple[str, str, str]] = []
    for row in store.table.query_entities(
        "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
        parameters={"pk": partition, "low": low, "high": high},
    ):
        entry = index_entry(row)
        if isinstance(entry, MarkerRow):
            found += [
                (f"{entry.row_key}|{lock.lock_id}", lock.head_row_key, lock.lock_id)
                for lock in entry.entries
                if lock.expiry_ms <= now_ms
            ]
        elif parse_index_row_key(entry.row_key)[2] <= now_ms:
            found.append((entry.row_key, entry.state_row_key, entry.row_key))
    yield from (lock for lock in sorted(found) if after is None or lock[0] > after)


def _holds(head: Head, named: str, bucket: int) -> bool:
    """Does ``head`` still hold the lock a level-2 row (``named`` its RowKey) or a marker's entry (``named``
    the lock id) of minute ``bucket`` names?"""
    index_key = head.entity.get(_LOCK_COLUMN)
    if named == index_key:
        return True
    return bool(named == head.row.lock_id and index_key and parse_index_row_key(index_key)[1] == bucket)


def stuck(
    *, limit: int = MAX_STUCK, after: Position | None = None, now: datetime | None = None
) -> tuple[list[Record], Position | None]:
    """Records whose lock expired while Processing, oldest expiry minute first (the index only), behind
    ``after``; and where the next page starts (None: none is left)."""

    store = state_service.store()
    moment = now or store.now()
    now_ms = epoch_ms(moment)
    found: list[tuple[Record, Position]] = []
    for pointer in store.index.pointers(LOCK_KIND, moment):
        place = (pointer.bucket, pointer.partition)
        if after is not None and place < after[:2]:
            continue
        since = after[2] if after is not None and place == after[:2] else None
        locks = _locks_due(store, pointer.partition, pointer.bucket, now_ms, since)
        # The heads a page still needs, read side by side (one point read each).
        while chunk := list(islice(locks, min(limit + 1 - len(found), _HEAD_READS))):
            heads = side_by_side(
                partial(store.read_head_at, pointer.partition),
                [head_row for _, head_row, _ in chunk],
                workers=_HEAD_READERS,
                name="settle-stuck",
            )
            for (at, _, named), head in zip(chunk, heads, strict=True):
                if head is None or not _holds(head, named, pointer.bucket):
                    continue  # concluded, taken again or moved to another minute: not this lock here
                if (
                    head.status is not Status.PROCESSING
                    or head.locked_until is None
                    or head.locked_until > moment
                ):
                    continue  # finished, or extended: not stuck
                found.append((to_record(head.row, moment), (*place, at)))
            if len(found) > limit:
                return [record for record, _ in found[:limit]], found[limit - 1][1]
    return [record for record, _ in found], None
