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

from common.clock import epoch_ms
from common.errors import NotFound
from state import service as state_service
from state.handlers import to_record
from state.keys import LOCK_KIND, due_range, is_marker
from state.model import Status
from state.schemas import HistoryRequest, KeyRequest, Record, RecordPage
from state.store import INDEX_COLUMNS

MAX_STUCK = 200
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


def stuck(*, limit: int = MAX_STUCK, now: datetime | None = None) -> list[Record]:
    """Records whose lock expired while Processing, oldest expiry minute first (index rows only)."""

    store = state_service.store()
    moment = now or store.now()
    now_ms = epoch_ms(moment)
    found: list[Record] = []
    for pointer in store.index.pointers(LOCK_KIND, moment):
        low, high = due_range(LOCK_KIND, pointer.bucket, now_ms)
        rows = store.table.query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
            parameters={"pk": pointer.partition, "low": low, "high": high},
        )
        for row in rows:
            row_key = str(row["RowKey"])
            if is_marker(row_key):
                continue
            head = store.read_head_at(pointer.partition, str(row["StateRK"]))
            if head is None or head.entity.get(_LOCK_COLUMN) != row_key:
                continue  # concluded, extended or taken over since: not this lock any more
            if (
                head.status is not Status.PROCESSING
                or head.locked_until is None
                or head.locked_until > moment
            ):
                continue
            found.append(to_record(head.entity, moment))
            if len(found) >= limit:
                return found
    return found
