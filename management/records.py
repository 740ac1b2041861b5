"""State records for operators: one record by key with its history, and records stuck in Processing.

"Stuck" = Processing with its lock expired (catch-up turns those Failed on its next run; the listing shows
what it has not reached yet, or everything when catch-up is not running). It reads only the lock-expiry
index (``statelocks``, the rows due now) and the head of each record found there: never a scan.
"""

from __future__ import annotations

from datetime import datetime

from common.clock import utcnow
from state import service as state_service
from state.handlers import to_record
from state.model import Status
from state.schemas import HistoryRequest, KeyRequest, Record, RecordPage

MAX_STUCK = 200


def lookup(req: HistoryRequest) -> tuple[Record | None, RecordPage]:
    """The record (None when the key has none) and the first page of its history."""
    from common.errors import NotFound

    handler = state_service.handler(req.handler)
    try:
        record: Record | None = handler.get(KeyRequest(key=req.key, handler=req.handler))
    except NotFound:
        record = None
    return record, handler.history(req)


def stuck(*, limit: int = MAX_STUCK, now: datetime | None = None) -> list[Record]:
    """Records whose lock expired while Processing, oldest expiry first (index rows due now only)."""
    store = state_service.store()
    moment = now or utcnow()
    found: list[Record] = []
    seen: set[tuple[str, str]] = set()
    for row in store.expiry.due("l", moment, limit=limit * 2):
        if (row.state_pk, row.state_rk) in seen:
            continue
        seen.add((row.state_pk, row.state_rk))
        head = store.read_head_at(row.state_pk, row.state_rk)
        if head is None or head.status is not Status.PROCESSING:
            continue
        locked_until = head.locked_until
        if locked_until is None or locked_until > moment:
            continue
        found.append(to_record(head.entity, moment))
        if len(found) >= limit:
            break
    return found
