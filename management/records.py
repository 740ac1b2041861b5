"""State records for operators: one record by key with its history, and records stuck in Processing.

"Stuck" = Processing with its lock expired (catch-up turns those Failed on its next run; the listing shows
what it has not reached yet, or everything when catch-up is not running). It reads the catch-up index of
ADR-0011 and nothing else: the level-1 rows (``statelocks``) of lock minutes that have begun, then, per
(minute, partition), the level-2 rows already due (``~l|{minute}|…`` beside the heads, markers excluded),
then the head each row names. A row whose head no longer names it (concluded, extended, taken over) is
skipped, as catch-up would. Never a scan: its cost follows expired locks.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from itertools import islice

from common.beside import side_by_side
from common.clock import epoch_ms
from common.errors import NotFound
from state import service as state_service
from state.handlers import to_record
from state.keys import LOCK_KIND, due_range, is_marker
from state.lifecycle import INDEX_COLUMNS
from state.model import Status
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


# Where a page of stuck records ended: the level-1 pointer (expiry minute, partition) and the level-2 row.
Position = tuple[int, str, str]


def stuck(
    *, limit: int = MAX_STUCK, after: Position | None = None, now: datetime | None = None
) -> tuple[list[Record], Position | None]:
    """Records whose lock expired while Processing, oldest expiry minute first (index rows only), behind
    ``after``; and where the next page starts (None: none is left)."""

    store = state_service.store()
    moment = now or store.now()
    now_ms = epoch_ms(moment)
    found: list[tuple[Record, Position]] = []
    for pointer in store.index.pointers(LOCK_KIND, moment):
        place = (pointer.bucket, pointer.partition)
        if after is not None and place < after[:2]:
            continue
        low, high = due_range(LOCK_KIND, pointer.bucket, now_ms)
        op = "ge"
        if after is not None and place == after[:2]:
            low, op = after[2], "gt"
        rows = (
            (str(row["RowKey"]), str(row["StateRK"]))
            for row in store.table.query_entities(
                f"PartitionKey eq @pk and RowKey {op} @low and RowKey lt @high",
                parameters={"pk": pointer.partition, "low": low, "high": high},
            )
            if not is_marker(str(row["RowKey"]))
        )
        # The heads a page still needs, read side by side (one point read each).
        while chunk := list(islice(rows, min(limit + 1 - len(found), _HEAD_READS))):
            heads = side_by_side(
                partial(store.read_head_at, pointer.partition),
                [state_row for _, state_row in chunk],
                workers=_HEAD_READERS,
                name="settle-stuck",
            )
            for (row_key, _), head in zip(chunk, heads, strict=True):
                if head is None or head.entity.get(_LOCK_COLUMN) != row_key:
                    continue  # concluded, extended or taken over since: not this lock any more
                if (
                    head.status is not Status.PROCESSING
                    or head.locked_until is None
                    or head.locked_until > moment
                ):
                    continue
                found.append((to_record(head.row, moment), (*place, row_key)))
            if len(found) > limit:
                return [record for record, _ in found[:limit]], found[limit - 1][1]
    return [record for record, _ in found], None
