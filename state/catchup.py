"""Catch-up: expired locks become Failed, records past retention become Expired.

It reads the expiry index (``state/expiry.py``), never the records table as a whole, so its cost grows
with the number of expired locks and retention deadlines, not with the table. Each index row is checked
against the record's head (a point read) and acted on with an ETag-conditional transaction, so several
instances may run it at once: one of them wins each record, the others see the change and move on.
Work per run is bounded by ``max_rows``; what is left waits for the next run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

from common.clock import iso, utcnow
from state.expiry import LOCK_KIND, RETENTION_KIND, ExpiryIndex, IndexRow
from state.model import Status
from state.store import StateStore, is_conflict, retention_expired

log = logging.getLogger("settle.state.catchup")

DEFAULT_MAX_ROWS = 500


@dataclass
class CatchupResult:
    """What one run did; ``index_rows_read + records_read`` is every entity it read."""

    index_rows_read: int = 0
    records_read: int = 0
    locks_failed: int = 0
    records_expired: int = 0
    stale_index_rows: int = 0
    elapsed_ms: float = 0.0

    @property
    def entities_read(self) -> int:
        return self.index_rows_read + self.records_read


class Catchup:
    def __init__(self, store: StateStore, expiry: ExpiryIndex) -> None:
        self._store = store
        self._expiry = expiry

    def run(self, *, now: datetime | None = None, max_rows: int = DEFAULT_MAX_ROWS) -> CatchupResult:
        started = time.perf_counter()
        result = CatchupResult()
        self._expiry.flush()
        when = now or utcnow()
        for row in self._expiry.due(LOCK_KIND, when, limit=max_rows):
            result.index_rows_read += 1
            self._expire_lock(row, when, result)
        budget = max_rows - result.index_rows_read
        if budget > 0:
            for row in self._expiry.due(RETENTION_KIND, when, limit=budget):
                result.index_rows_read += 1
                self._expire_retention(row, when, result)
        result.elapsed_ms = (time.perf_counter() - started) * 1000
        log.info("state catch-up: %s", result)
        return result

    def _expire_lock(self, row: IndexRow, now: datetime, result: CatchupResult) -> None:
        for _ in range(2):
            head = self._store.read_head_at(row.state_pk, row.state_rk)
            result.records_read += 1
            until = head.locked_until if head else None
            if (
                head is None
                or head.status is not Status.PROCESSING
                or head.entity.get("LockId") != row.ident
                or until is None
                or until > now
            ):
                result.stale_index_rows += 1
                break
            try:
                self._store.conclude(
                    head,
                    Status.FAILED,
                    substatus="LockExpired",
                    error=f"The lock expired at {iso(until)} before its holder recorded an outcome.",
                    now=now,
                )
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                continue  # someone changed it meanwhile: look again
            result.locks_failed += 1
            break
        self._expiry.delete(row)

    def _expire_retention(self, row: IndexRow, now: datetime, result: CatchupResult) -> None:
        for _ in range(2):
            head = self._store.read_head_at(row.state_pk, row.state_rk)
            result.records_read += 1
            if head is None or head.version != row.version or not retention_expired(head.entity, now):
                result.stale_index_rows += 1
                break
            try:
                self._store.conclude(head, Status.EXPIRED, substatus="RetentionExpired", error=None, now=now)
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                continue
            result.records_expired += 1
            break
        self._expiry.delete(row)
