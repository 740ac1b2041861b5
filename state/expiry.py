"""The expiry index catch-up reads: two levels, kept atomic with the records (ADR-0011).

Level 2 lives in each record's own partition of the ``state`` table: for a lock, an entry
``L{lockId}`` = ``{expiry ms}|{head RowKey}`` in its minute's marker (ADR-0021), merged by the transaction
that takes, takes over or extends the lock; for a retention deadline, a row (``~r|...``) pointing at the
head's RowKey, which the head names (``RetainIndexKey``) and the transaction that changes the head inserts
and deletes. So a live lock is always named: no buffer, no background thread, nothing a process exit or a
kill can lose. A process merges at most :data:`MARKER_ENTRIES` entries into one marker, then prepares
another for the same minute.

Level 1 (table ``statelocks``) tells catch-up where to look: one row per (kind, expiry minute M, state
partition P). It cannot join the record's transaction (another table), so it is guarded by **markers**: every
transaction that inserts a level-2 row or a lock entry of minute M in P also merges (``If-Match: *``) a marker
row ``~{kind}|{M}|{n or m}{nonce}`` of P, and fails unless that marker exists. A process makes its marker once
per (P, kind, M) (:meth:`ExpiryIndex.prepare`): (a) insert a marker with a fresh nonce, (b) insert the level-1
row or, when it exists, touch it (one Insert Or Merge: a merge changes its ETag); only then is the nonce used.
Catch-up deletes a level-1 row only after deleting every marker it listed (each ``If-Match`` the read that
showed its entries) and re-reading the minute's rows, and only with ``If-Match`` the ETag it read first. A
marker listed and deleted cannot be used again (its nonce is never re-created); a marker made later was
followed by a touch that changed the ETag (the delete fails) or re-created the row. So a successful lock
transaction always finds a level-1 row, and no crash, lost answer or slow request can leave a live lock that
catch-up cannot find. The proof is in ADR-0011.

The cost on the lock path: the marker merge rides in the lock's own transaction (still one round trip);
preparing costs two requests once per partition, minute and process.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from common.clock import epoch_ms
from common.table_protocol import TableSource
from common.transactions import merge_if_unchanged
from state.keys import EXPIRY_TABLE, STATE_TABLE, bucket_of, level1_partition
from state.rows import Level1Row, LockEntry, MarkerRow

_PREPARED_MAX = 4096
_TOUCH_ATTEMPTS = 4
# Lock entries one process merges into one marker before it prepares another for the same minute
# (ADR-0021). An entity holds 252 user properties (255 with PartitionKey, RowKey and Timestamp:
# shared/reference/idempotency-anchors.md, "Properties per entity"); 240 entries of at most
# 33 + 14 + 1 KiB of key (UTF-16) stay far under its 1 MiB too.
MARKER_ENTRIES = 240


def level1_entity(kind: str, bucket: int, partition: str) -> dict[str, Any]:
    """The level-1 row's entity as preparing a marker writes it: its keys only (``state/rows.py``)."""
    return Level1Row.of(kind, bucket, partition).to_entity()


@dataclass(frozen=True)
class Pointer:
    """A level-1 row as catch-up read it: partition ``partition`` holds rows of ``kind`` due in ``bucket``."""

    kind: str
    bucket: int
    partition: str
    etag: str
    leased_by: str | None = None  # the catch-up run's owner that leased it (a lease divides work only)
    leased_until: datetime | None = None


def _pointer(entity: Any) -> Pointer:
    row = Level1Row.from_entity(entity)
    found, bucket = row.minute()
    return Pointer(
        found,
        bucket,
        row.row_key,
        str(entity.metadata["etag"]),
        leased_by=row.leased_by,
        leased_until=row.leased_until,
    )


class ExpiryIndex:
    """Prepares markers for the lock path and reads level 1 for catch-up."""

    def __init__(self, tables: TableSource, *, state_table: Callable[[], Any] | None = None) -> None:
        self._tables = tables
        # Where a partition's markers go (the state table; with several accounts, routed by partition).
        self._state_table = state_table or (lambda: tables.table(STATE_TABLE))
        self._guard = threading.Lock()
        # (partition, kind, minute) -> [nonce, entries merged into it by this process]
        self._prepared: OrderedDict[tuple[str, str, int], list[Any]] = OrderedDict()
        self._preparing: dict[tuple[str, str, int], threading.Lock] = {}

    # -- the lock path -------------------------------------------------------------------------------
    def marker(
        self, partition: str, kind: str, bucket: int, entries: tuple[LockEntry, ...] = ()
    ) -> dict[str, Any]:
        """The marker a transaction inserting an index row (or a lock, named by its ``entries``) of minute
        ``bucket`` must merge (``If-Match *``).

        Prepares it first when this process has none for that partition and minute (2 requests), or when
        the one it has holds :data:`MARKER_ENTRIES` entries already (a new marker for the same minute)."""
        nonce = self._nonce(partition, kind, bucket, len(entries))
        return MarkerRow.of(partition, kind, bucket, nonce, entries).to_entity()

    def forget(self, marker: dict[str, Any]) -> None:
        """The transaction found ``marker`` gone (catch-up closed its minute): prepare afresh next time."""
        row = MarkerRow.from_entity(marker)
        kind, bucket, nonce = row.minute()
        self._drop((row.partition_key, kind, bucket), nonce)

    def _drop(self, key: tuple[str, str, int], nonce: str) -> None:
        with self._guard:
            slot = self._prepared.get(key)
            if slot is not None and slot[0] == nonce:  # not a newer preparation of another thread
                del self._prepared[key]

    def _nonce(self, partition: str, kind: str, bucket: int, take: int) -> str:
        """The nonce of this process's marker for the minute, ``take`` more entries counted against it."""
        key = (partition, kind, bucket)
        while True:
            with self._guard:
                slot = self._prepared.get(key)
                if slot is not None:
                    if slot[1] + take <= MARKER_ENTRIES:
                        slot[1] += take  # counted when taken: a write sent again counts twice (safe)
                        return str(slot[0])
                    del self._prepared[key]  # full: the next entry goes into a new marker
                preparing = self._preparing.setdefault(key, threading.Lock())
            with preparing:  # one preparation per key and process; the others wait for it
                with self._guard:
                    slot = self._prepared.get(key)
                if slot is None:
                    nonce = self._prepare(partition, kind, bucket)
                    with self._guard:
                        self._prepared[key] = [nonce, 0]
                        while len(self._prepared) > _PREPARED_MAX:
                            self._prepared.popitem(last=False)
            with self._guard:
                self._preparing.pop(key, None)

    def _prepare(self, partition: str, kind: str, bucket: int) -> str:
        """(a) a marker with a fresh nonce, then (b) the level-1 row inserted or touched. Order matters.

        (b) is one Insert Or Merge request carrying no property: afterwards the row exists with an ETag
        no earlier read saw (a merge changes it), whether it was there or not, and a lease on it keeps its
        columns. It can overwrite nothing, so it needs no condition; an insert, then a merge ``If-Match *``
        after a conflict, did the same in two requests (a cold instance's first lock waits for them)."""
        from azure.core.exceptions import ResourceExistsError
        from azure.data.tables import UpdateMode

        nonce = uuid.uuid4().hex
        marker = MarkerRow.of(partition, kind, bucket, nonce).to_entity()
        with contextlib.suppress(ResourceExistsError):  # our own insert, applied but its answer lost
            self._state_table().create_entity(marker)
        self._tables.table(EXPIRY_TABLE).upsert_entity(
            level1_entity(kind, bucket, partition), mode=UpdateMode.MERGE
        )
        return nonce

    # -- catch-up --------------------------------------------------------------------------------------
    def pointers(self, kind: str, now: datetime, *, page_size: int = 100) -> Iterator[Pointer]:
        """Level-1 rows of ``kind`` whose minute has begun by ``now``, oldest minute first."""
        query = "PartitionKey ge @low and PartitionKey le @high"
        parameters = {
            "low": level1_partition(kind, 0),
            "high": level1_partition(kind, bucket_of(epoch_ms(now))),
        }
        table = self._tables.table(EXPIRY_TABLE)
        for entity in table.query_entities(query, parameters=parameters, results_per_page=page_size):
            yield _pointer(entity)

    def lease(self, pointer: Pointer, owner: str, now: datetime, until: datetime) -> Pointer | None:
        """Lease ``pointer`` to ``owner`` until ``until``: a merge ``If-Match`` its ETag, so of several
        instances' runs one works on it; None when another owner's lease is still running at ``now`` or
        the row is gone. The returned pointer carries the ETag after the lease, which is the one catch-up
        must delete with (ADR-0011's proof: the lease is the read it orders markers after)."""
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        table = self._tables.table(EXPIRY_TABLE)
        for _ in range(_TOUCH_ATTEMPTS):
            held = pointer.leased_until is not None and pointer.leased_until > now
            if held and pointer.leased_by != owner:
                return None
            row = Level1Row.of(pointer.kind, pointer.bucket, pointer.partition, by=owner, until=until)
            try:
                answer = merge_if_unchanged(table, row.to_entity(), pointer.etag)
                return replace(pointer, etag=str(answer["etag"]), leased_by=owner, leased_until=until)
            except ResourceModifiedError:
                pass  # leased by another run, or touched by a preparation: read it again
            except ResourceNotFoundError:
                return None  # another run closed the minute
            try:
                pointer = _pointer(table.get_entity(row.partition_key, row.row_key))
            except ResourceNotFoundError:
                return None
        return None

    def drop(self, pointer: Pointer) -> bool:
        """Delete a level-1 row if nobody touched it since catch-up read it; False when it stays."""
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        try:
            self._tables.table(EXPIRY_TABLE).delete_entity(
                level1_partition(pointer.kind, pointer.bucket),
                pointer.partition,
                etag=pointer.etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except ResourceModifiedError:
            return False
        except ResourceNotFoundError:
            return True  # another catch-up run was first
        return True
