"""The lock-expiry and retention index the catch-up timer range-reads (table ``statelocks``).

Why an index in its own table, written in the background: a lock on a new key must stay a single insert
(the fastest thing Table Storage does), and an index row in another partition cannot join that insert's
transaction. So each process buffers its index rows and writes them in entity group transactions of up to
100 rows (grouped by expiry minute) every :data:`FLUSH_INTERVAL_S`: the hot path pays nothing and the
index costs about one request per 100 locks. A lock released before the buffer is flushed never reaches
the table at all; one released later is deleted (ETag-conditional) in the next batch.

What the buffer can lose: rows of a process that dies within one flush interval of taking a lock. Such a
lock is still taken over by the next ``lock`` call once it expires (lock judges expiry itself); only the
timer's early conversion to Failed is missed. Catch-up validates every row against the record's head
before acting, so a stale or duplicate row is harmless: it is read once and deleted.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from common.tables import Tables
from state.keys import EXPIRY_TABLE

log = logging.getLogger("settle.state.expiry")

FLUSH_INTERVAL_S = 0.2
BATCH = 100
LOCK_KIND = "l"
RETENTION_KIND = "r"
_MAX_REMEMBERED = 20_000
_MAX_ATTEMPTS = 50


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def index_keys(kind: str, expires_at: datetime, ident: str) -> tuple[str, str]:
    ms = _ms(expires_at)
    return f"{kind}{ms // 60_000:010d}", f"{ms:013d}|{ident}"


def retention_ident(state_pk: str, state_rk: str, version: int) -> str:
    return hashlib.sha256(f"{state_pk}\n{state_rk}\n{version}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class IndexRow:
    kind: str
    ident: str
    partition_key: str
    row_key: str
    state_pk: str
    state_rk: str
    version: int
    etag: str | None = None

    def entity(self) -> dict[str, Any]:
        return {
            "PartitionKey": self.partition_key,
            "RowKey": self.row_key,
            "Ident": self.ident,
            "StatePK": self.state_pk,
            "StateRK": self.state_rk,
            "Version": self.version,
        }


class ExpiryIndex:
    """Buffered writer and reader of the expiry index."""

    def __init__(self, tables: Tables) -> None:
        self._tables = tables
        self._lock = threading.Lock()  # guards the dictionaries below
        self._flushing = threading.Lock()  # one flush at a time, so no row is written twice
        self._pending: dict[str, IndexRow] = {}  # ident -> the row to insert
        self._written: OrderedDict[str, IndexRow] = OrderedDict()  # ident -> the row in the table
        self._deletes: dict[str, IndexRow] = {}  # row key -> a written row (with ETag) to delete
        self._attempts: dict[str, int] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- writing ---------------------------------------------------------------------------------
    def track(
        self, kind: str, expires_at: datetime, ident: str, state_pk: str, state_rk: str, version: int
    ) -> None:
        """Catch ``ident`` up at ``expires_at`` (replacing an earlier deadline of the same ident)."""
        pk, rk = index_keys(kind, expires_at, ident)
        row = IndexRow(kind, ident, pk, rk, state_pk, state_rk, version)
        with self._lock:
            previous = self._written.get(ident)
            if previous is not None and previous.row_key == rk:
                self._pending.pop(ident, None)  # already in the table as it should be
                return
            self._pending[ident] = row
            if previous is not None:
                del self._written[ident]
                self._deletes[previous.row_key] = previous
            self._ensure_thread()

    def untrack(self, ident: str) -> None:
        """The lock (or retention version) ``ident`` no longer needs catching up."""
        with self._lock:
            self._pending.pop(ident, None)
            written = self._written.pop(ident, None)
            if written is not None:
                self._deletes[written.row_key] = written
                self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="settle-expiry-index", daemon=True)
            self._thread.start()
            atexit.register(self._flush_at_exit)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(FLUSH_INTERVAL_S)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # the flusher must survive anything; rows stay buffered
                log.exception("expiry index flush failed; will retry")

    def flush(self) -> None:
        """Write buffered rows now (catch-up calls this first, so a run sees this process's locks)."""
        with self._flushing:
            with self._lock:
                inserts = list(self._pending.values())
                deletes = list(self._deletes.values())
            if not inserts and not deletes:
                return
            table = self._tables.table(EXPIRY_TABLE)
            for group in _grouped(inserts):
                self._submit(table, group, insert=True)
            for group in _grouped(deletes):
                self._submit(table, group, insert=False)

    def _submit(self, table: Any, rows: list[IndexRow], *, insert: bool) -> None:
        from azure.core import MatchConditions
        from azure.data.tables import TableTransactionError

        remaining = list(rows)
        while remaining:
            if insert:
                ops: list[Any] = [("create", r.entity()) for r in remaining]
            else:
                ops = [
                    ("delete", r.entity(), {"etag": r.etag, "match_condition": MatchConditions.IfNotModified})
                    for r in remaining
                ]
            try:
                results = table.submit_transaction(ops)
            except TableTransactionError as exc:
                # One row already there (insert) or already gone/changed (delete): drop it, retry the rest.
                index = exc.index if exc.index is not None and 0 <= exc.index < len(remaining) else 0
                self._done(remaining.pop(index), insert=insert, etag=None)
                continue
            except Exception:
                for row in remaining:
                    self._retry_later(row, insert=insert)
                raise
            for row, result in zip(remaining, results, strict=True):
                self._done(row, insert=insert, etag=result.get("etag"))
            return

    def _done(self, row: IndexRow, *, insert: bool, etag: str | None) -> None:
        with self._lock:
            self._attempts.pop(row.row_key, None)
            if not insert:
                self._deletes.pop(row.row_key, None)
                return
            written = replace(row, etag=etag) if etag is not None else None
            if self._pending.get(row.ident) is row:
                del self._pending[row.ident]
                if written is not None:
                    self._written[row.ident] = written
                    while len(self._written) > _MAX_REMEMBERED:
                        self._written.popitem(last=False)
            elif written is not None:
                # Untracked or re-tracked while it was being written: it is stale already.
                self._deletes[row.row_key] = written

    def _retry_later(self, row: IndexRow, *, insert: bool) -> None:
        with self._lock:
            attempts = self._attempts.get(row.row_key, 0) + 1
            self._attempts[row.row_key] = attempts
            if attempts >= _MAX_ATTEMPTS:
                log.error("giving up on expiry index row %s after %d attempts", row.row_key, attempts)
                if insert and self._pending.get(row.ident) is row:
                    del self._pending[row.ident]
                if not insert:
                    self._deletes.pop(row.row_key, None)
                self._attempts.pop(row.row_key, None)

    def _flush_at_exit(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        except Exception as exc:  # storage may be gone at interpreter exit; catch-up copes
            log.warning("expiry index rows not written at exit: %s", exc)

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    # -- reading (catch-up) ------------------------------------------------------------------------
    def due(self, kind: str, now: datetime, *, limit: int, page_size: int = 100) -> Iterator[IndexRow]:
        """Index rows of ``kind`` whose expiry is at or before ``now``, oldest first, at most ``limit``."""
        table = self._tables.table(EXPIRY_TABLE)
        ms = _ms(now)
        query = "PartitionKey ge @low and PartitionKey le @high and RowKey le @until"
        parameters = {"low": kind, "high": f"{kind}{ms // 60_000:010d}", "until": f"{ms:013d}|~"}
        entities = table.query_entities(query, parameters=parameters, results_per_page=page_size)
        for seen, entity in enumerate(entities, start=1):
            yield IndexRow(
                kind=kind,
                ident=str(entity["Ident"]),
                partition_key=entity["PartitionKey"],
                row_key=entity["RowKey"],
                state_pk=str(entity["StatePK"]),
                state_rk=str(entity["StateRK"]),
                version=int(entity["Version"]),
                etag=entity.metadata.get("etag"),
            )
            if seen >= limit:
                return

    def delete(self, row: IndexRow) -> None:
        """Remove a row catch-up has dealt with (conditional on its ETag; gone or changed is fine)."""
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        with self._lock:
            if (known := self._written.get(row.ident)) is not None and known.row_key == row.row_key:
                del self._written[row.ident]
        with contextlib.suppress(ResourceNotFoundError, ResourceModifiedError):
            self._tables.table(EXPIRY_TABLE).delete_entity(
                row.partition_key, row.row_key, etag=row.etag, match_condition=MatchConditions.IfNotModified
            )


def _grouped(rows: list[IndexRow]) -> Iterator[list[IndexRow]]:
    by_partition: dict[str, list[IndexRow]] = {}
    for row in rows:
        by_partition.setdefault(row.partition_key, []).append(row)
    for group in by_partition.values():
        for start in range(0, len(group), BATCH):
            yield group[start : start + BATCH]
