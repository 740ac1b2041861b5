"""Catch-up: expired locks become Failed, records past retention become Expired.

It reads the expiry index (``state/expiry.py``), never the records table as a whole: level 1 names the
(minute, partition) pairs whose minute has begun, and in each such partition one range read returns the
minute's markers, whose entries name its locks (ADR-0021), and its index rows (deadlines; locks of the code
before ADR-0021). Each due one is checked against the record's head (a point read) and acted on with an
ETag-conditional transaction, so several instances may run at once: one of them wins each record, the
others see the change and move on. A lock's entry is skipped when its head finished, was locked again
(remembered: :data:`ENDED`) or moved to another minute. Its cost grows with the locks and deadlines that
became due (and the partitions holding them), not with the table or with live locks of later minutes.

A minute whose end lies ``CLOSE_MARGIN_MS`` in the past is closed once everything in it was handled:
delete the minute's markers in that partition, each ``If-Match`` the read that showed its entries (a lock
merged since fails the delete: the minute is read again), read its rows again (an earlier code's row that
slipped in while the range was read is handled now), then delete the level-1 row ``If-Match`` the ETag
read at the start. If a lock path touched it meanwhile, the delete fails and the next run looks again
(ADR-0011).

Scale-out: a run works on up to ``STATE_CATCHUP_PARALLELISM`` (default 8) level-1 pointers at once, one
thread per (minute, partition) pair taken in order from level 1, so a backlog spread over a node's shards
(``SETTLE_STATE_SHARDS``) is caught up in parallel while each partition still sees one sequential stream
of catch-up writes (a few hundred entities/s at most, well inside a partition's budget). Every write is
ETag-conditional or insert-only, so workers (and instances) that meet the same record race safely.

Across instances: before visiting a pointer a run leases it (``ExpiryIndex.lease``: a merge of
``LeasedBy``/``LeasedUntil`` into the level-1 row ``If-Match`` the ETag it listed, for ``DEFAULT_LEASE_MS``),
and a run of another instance skips a pointer whose lease still runs, so several instances' runs divide the
backlog. Leases divide work only (every write stays conditional); the minute is closed ``If-Match`` the ETag
the lease returned, which keeps ADR-0011's proof (the lease is the read the markers are listed after).

Throttled: a record's transaction refused twice in a row (503 ServerBusy / 500 OperationTimedOut; the store
asks once more itself) is tried again after a back-off (``THROTTLED_BACKOFF_S``), and after the last one left
for the next run. A refusal outside a record (the level-1 listing, a lease) stops the run early
(``storage_busy`` in its result, a warning) with what it did kept: a refusal delays catch-up, it never
fails the timer. Index rows are read a page at a time (``INDEX_PAGE_ROWS``), each page acted on first.

Work per run is bounded by ``max_rows`` (index rows handled plus partitions visited). The timer
(:meth:`Catchup.drain`) runs again while a run ran out of rows, for up to ``DRAIN_SECONDS``, so a backlog
larger than one run (a fleet of workers killed at once) is still caught up within one timer period; only
what is left after that waits for the next timer. A drain's later runs pass by the pointers its earlier
runs left with no due row, so each run starts where work is left.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from common import telemetry
from common.clock import epoch_ms, iso, to_ms
from common.errors import StorageTableMissing, is_transient_storage_fault
from common.roundtrips import ROUND_TRIPS
from common.transactions import is_conflict
from state.expiry import ExpiryIndex, Pointer
from state.keys import BUCKET_MS, LOCK_KIND, RETENTION_KIND, bucket_range, parse_index_row_key
from state.lifecycle import INDEX_COLUMNS, Head, retain_until
from state.model import Status
from state.rows import IndexRow, LockEntry, MarkerRow, index_entry
from state.store import StateStore

log = logging.getLogger("settle.state.catchup")

DEFAULT_MAX_ROWS = 500
# Index rows per query page (the service's maximum, 1,000: ``reference/idempotency-anchors.md``, query page);
# a run acts on a page before it reads the next.
INDEX_PAGE_ROWS = 1000
CLOSE_MARGIN_MS = 5_000
# Reads of a minute that closing it may take: a marker delete refused (412, a lock merged into it after the
# read) reads the minute again; past the last, the minute stays open for the next run.
CLOSE_ATTEMPTS = 3
# How long one timer invocation keeps starting bounded runs while they run out of rows (the default schedule
# is every minute; timer functions run on one instance at a time, so a longer drain only delays the next).
DRAIN_SECONDS = 50.0
PARALLELISM_SETTING = "STATE_CATCHUP_PARALLELISM"
DEFAULT_PARALLELISM = 8
# How long a run's lease on a level-1 pointer keeps other instances' runs off it (one timer period).
DEFAULT_LEASE_MS = 60_000
# Leases are per instance (process): every run of this process may take this process's leases again.
PROCESS_OWNER = uuid.uuid4().hex
# Back-off before trying a record again whose transaction storage refused twice in a row (throttled: Azure's
# guidance is to back off exponentially); each wait is taken with ±50 % jitter so refused workers spread.
THROTTLED_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
_COLUMN_OF_KIND = {kind: column for column, kind in INDEX_COLUMNS.items()}
# Lock ids whose lock this process saw end (ADR-0021): how many it keeps.
_ENDED_MAX = 100_000


class _Ended:
    """Locks this process saw end: the head no longer Processing under that lock id (finished, taken again
    or concluded here). A lock id is never taken again, so that holds for ever, and a later run passes their
    entries by without a read or a share of its budget: a minute holding more entries than one run's
    ``max_rows`` is still worked through, run after run. Only a cache: without it the head is read again."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, lock_id: str) -> None:
        with self._lock:
            self._ids[lock_id] = None
            while len(self._ids) > self._size:
                self._ids.popitem(last=False)

    def __contains__(self, lock_id: object) -> bool:
        with self._lock:
            return lock_id in self._ids


ENDED = _Ended(_ENDED_MAX)


def storage_busy(exc: BaseException) -> bool:
    """Storage could not take the request now (throttled 503, server-side 5xx such as 500
    OperationTimedOut, 408/429, unreachable, an unreadable answer): catch-up backs off until the next timer
    period instead of failing the invocation. A refusal a deployment must fix (401/403, a missing table)
    and anything else still raises, so the timer's failure shows it."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    if isinstance(exc, ClientAuthenticationError | StorageTableMissing):
        return False
    if isinstance(exc, HttpResponseError) and exc.status_code in (401, 403):
        return False
    return is_transient_storage_fault(exc)


@dataclass
class CatchupResult:
    """What one run did; ``index_rows_read + records_read`` is every entity it read."""

    index_rows_read: int = 0
    records_read: int = 0
    locks_failed: int = 0
    records_expired: int = 0
    stale_index_rows: int = 0
    locks_ended: int = 0  # marker entries whose lock had ended (finished, taken again): skipped from now on
    minutes_visited: int = 0
    minutes_closed: int = 0
    minutes_finished: int = 0  # pointers left with no due row (the drain's later runs pass them by)
    leases_skipped: int = 0  # pointers another instance's run held a lease on
    storage_busy: int = 0  # storage refused (throttled, timed out, unreachable): the run stopped early
    exhausted: bool = False  # the run stopped at max_rows: there may be more to do
    elapsed_ms: float = 0.0

    @property
    def progressed(self) -> bool:
        """Did the run change the index or learn of ended locks (so another run would start further on)?"""
        return bool(
            self.locks_failed
            or self.records_expired
            or self.stale_index_rows
            or self.locks_ended
            or self.minutes_closed
            or self.minutes_finished
        )

    def add(self, other: CatchupResult) -> None:
        for name in (
            "index_rows_read",
            "records_read",
            "locks_failed",
            "records_expired",
            "stale_index_rows",
            "locks_ended",
            "minutes_visited",
            "minutes_closed",
            "minutes_finished",
            "leases_skipped",
            "storage_busy",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class _Budget:
    def __init__(self, rows: int) -> None:
        self.left = rows
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True


def parallelism_from_env() -> int:
    value = os.environ.get(PARALLELISM_SETTING) or str(DEFAULT_PARALLELISM)
    try:
        return max(1, min(64, int(value)))
    except ValueError as exc:
        raise ValueError(f"{PARALLELISM_SETTING} must be a whole number (1-64); got {value!r}") from exc


class Catchup:
    def __init__(
        self,
        store: StateStore,
        index: ExpiryIndex | None = None,
        *,
        parallelism: int | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        owner: str | None = None,
    ) -> None:
        self._store = store
        self._index = index or store.index
        self.parallelism = parallelism if parallelism is not None else parallelism_from_env()
        # Whose leases this run's are (an instance: the process, unless a test plays several instances).
        self.owner = owner or PROCESS_OWNER
        self.lease_ms = lease_ms

    def drain(self, *, now: datetime | None = None, max_rows: int | None = None) -> list[CatchupResult]:
        """What the timer does: bounded runs, again while one ran out of rows having changed something
        (a run that only re-read live work would find the same next time) and time is left."""
        max_rows = DEFAULT_MAX_ROWS if max_rows is None else max_rows
        started = time.monotonic()
        # Pointers this drain finished (every due row handled): a later run of the drain passes them by at no
        # cost, so each run starts where work is left instead of spending its budget on visits that find
        # nothing (with more open pointers than ``max_rows``, runs would otherwise never reach the rest).
        finished: set[tuple[str, int, str]] = set()
        results = [self._run(now, max_rows, finished)]
        while results[-1].exhausted and results[-1].progressed and time.monotonic() - started < DRAIN_SECONDS:
            results.append(self._run(now, max_rows, finished))
        return results

    def run(self, *, now: datetime | None = None, max_rows: int | None = None) -> CatchupResult:
        return self._run(now, max_rows, set())

    def _run(
        self, now: datetime | None, max_rows: int | None, finished: set[tuple[str, int, str]]
    ) -> CatchupResult:
        max_rows = DEFAULT_MAX_ROWS if max_rows is None else max_rows
        with telemetry.span("settle.catchup.run", {"settle.catchup.max_rows": max_rows}) as span:
            started = time.perf_counter()
            result = CatchupResult()
            # Locks are failed only once they have expired whatever the clock estimate's error: the
            # earliest the storage clock may read (a holder judges its own lock by the latest).
            when = to_ms(now) if now is not None else self._store.earliest()
            budget = _Budget(max_rows)
            self._visit_all(when, result, budget, finished)
            result.exhausted = budget.left <= 0
            result.elapsed_ms = (time.perf_counter() - started) * 1000
            span.update(
                {
                    f"settle.catchup.{k}": v
                    for k, v in vars(result).items()
                    if k not in ("elapsed_ms", "exhausted")
                }
            )
            if result.storage_busy:
                span.set_outcome("storage-busy")
                log.warning("state catch-up stopped early, storage busy (the next run goes on): %s", result)
            else:
                span.set_outcome("budget-exhausted" if result.exhausted else "done")
                log.info("state catch-up: %s", result)
            return result

    def _visit_all(
        self, when: datetime, result: CatchupResult, budget: _Budget, finished: set[tuple[str, int, str]]
    ) -> None:
        """Visit the level-1 pointers in order, up to ``parallelism`` of them at once."""

        def listed() -> Iterator[Pointer]:
            for kind in (LOCK_KIND, RETENTION_KIND):
                yield from self._index.pointers(kind, when)

        pointers = listed()
        lock = threading.Lock()
        stopped = False
        tallies = ROUND_TRIPS.open_tallies()
        errors: list[BaseException] = []

        def worker(own: CatchupResult) -> None:
            nonlocal stopped
            ROUND_TRIPS.adopt(tallies)  # the caller's round-trip measure counts the workers' requests
            while True:
                with lock:
                    if stopped or errors:
                        return
                    try:
                        pointer = next(pointers, None)
                    except BaseException as exc:
                        if not storage_busy(exc):
                            errors.append(exc)
                            return
                        own.storage_busy += 1
                        stopped = True
                        return
                    if pointer is None:
                        stopped = True
                        return
                    own.index_rows_read += 1
                    if (pointer.kind, pointer.bucket, pointer.partition) in finished:
                        continue
                    if not budget.take():
                        stopped = True
                        return
                try:
                    leased = self._index.lease(
                        pointer, self.owner, when, when + timedelta(milliseconds=self.lease_ms)
                    )
                    if leased is None:
                        own.leases_skipped += 1
                        continue
                    own.minutes_visited += 1
                    if self._visit(leased, when, own, budget):
                        with lock:
                            finished.add((pointer.kind, pointer.bucket, pointer.partition))
                            own.minutes_finished += 1
                except BaseException as exc:
                    with lock:
                        if storage_busy(exc):
                            # Backpressure: stop this run (every worker), leave the rest to the next
                            # timer period. A pointer leased here is leased to this owner: its lease runs
                            # out, or this instance's next run takes it again.
                            own.storage_busy += 1
                            stopped = True
                        else:
                            errors.append(exc)
                    return

        own = [CatchupResult() for _ in range(self.parallelism)]
        if self.parallelism == 1:
            worker(own[0])
        else:
            # Each worker runs in a copy of the caller's context: its events (a lock expired) belong to
            # the run's span, as they do with one worker.
            threads = [
                threading.Thread(target=contextvars.copy_context().run, args=(worker, r), daemon=True)
                for r in own
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for r in own:
            result.add(r)
        if errors:
            raise errors[0]

    def _visit(self, pointer: Pointer, now: datetime, result: CatchupResult, budget: _Budget) -> bool:
        """Handle one partition's due rows and lock entries of one minute; close the minute when it is over
        and done. True when every due one was handled (nothing is left there at ``now``)."""
        now_ms = epoch_ms(now)
        closable = (pointer.bucket + 1) * BUCKET_MS <= now_ms - CLOSE_MARGIN_MS
        # The whole minute: index rows (an earlier version's locks, deadlines), then its markers (they sort
        # after the rows), whose entries name this minute's locks (ADR-0021). Rows not due are not read on.
        low, high = bucket_range(pointer.kind, pointer.bucket)
        for _ in range(CLOSE_ATTEMPTS):
            markers: list[MarkerRow] = []
            rows = self._rows(pointer.partition, low, high, result)
            if not self._handle_all(pointer, rows, now, result, budget, markers):
                return False
            if not closable:
                return True
            if not self._delete_markers(pointer.partition, markers):
                continue  # a lock merged into a marker after it was read (412): read the minute again
            # An index row of the earlier code (a lock's, a deadline's) whose transaction applied while the
            # range was being read is found now: its marker went, so no later one can land (ADR-0011).
            again = self._rows(pointer.partition, low, high, result)
            if not self._handle_all(pointer, again, now, result, budget, [], entries=False):
                return False
            if self._index.drop(pointer):
                result.minutes_closed += 1
            return True
        return False

    def _delete_markers(self, partition: str, markers: list[MarkerRow]) -> bool:
        """Delete every marker listed, each ``If-Match`` the ETag of the read in which its entries were seen
        (ADR-0021): a lock that merged into it since changed that ETag, so the delete fails (False: read the
        minute again) instead of taking an entry nobody handled with it. Every one must go before level 1
        may: a lock path still holding one could otherwise add an entry nobody would find."""
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        for marker in markers:
            assert marker.etag is not None  # read from the table
            try:
                self._store.table.delete_entity(
                    partition, marker.row_key, etag=marker.etag, match_condition=MatchConditions.IfNotModified
                )
            except ResourceModifiedError:
                return False
            except ResourceNotFoundError:
                continue  # another run closed it, after handling what it held
        return True

    def _rows(
        self, partition: str, low: str, high: str, result: CatchupResult
    ) -> Iterator[IndexRow | MarkerRow]:
        """The index rows and markers (with their ETags and entries), a page at a time (``INDEX_PAGE_ROWS``):
        each page is acted on before the next is read, so a run that storage stops midway keeps what it did,
        and no read is larger than a page."""
        for entity in self._store.table.query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
            parameters={"pk": partition, "low": low, "high": high},
            results_per_page=INDEX_PAGE_ROWS,
        ):
            result.index_rows_read += 1
            yield index_entry(entity)

    def _handle_all(
        self,
        pointer: Pointer,
        rows: Iterator[IndexRow | MarkerRow],
        now: datetime,
        result: CatchupResult,
        budget: _Budget,
        markers: list[MarkerRow],
        *,
        entries: bool = True,
    ) -> bool:
        """Act on every due index row, then (``entries``) on every due lock entry of the markers (kept in
        ``markers``); False when one is still live or the budget ran out."""
        done = True
        now_ms = epoch_ms(now)
        for row in rows:
            if isinstance(row, MarkerRow):
                markers.append(row)
                continue
            if parse_index_row_key(row.row_key)[2] > now_ms:
                done = False  # not due yet (the minute is still running)
                continue
            if not budget.take() or not self._handle(pointer, row, now, result):
                done = False
        if not entries:
            return done
        for marker in markers:
            for entry in marker.entries:
                if entry.lock_id in ENDED:
                    continue
                if entry.expiry_ms > now_ms:
                    done = False
                    continue
                if not budget.take() or not self._handle_entry(pointer, entry, now, result):
                    done = False
        return done

    def _handle(self, pointer: Pointer, index: IndexRow, now: datetime, result: CatchupResult) -> bool:
        """Conclude the record an index row points at, or drop the row when it is stale; False if still
        live. A lock's row is one an earlier version of Settle wrote (ADR-0021, migration)."""
        column = _COLUMN_OF_KIND[pointer.kind]

        def act(head: Head | None) -> bool:
            if head is None or head.index_keys().get(column) != index.row_key:
                self._drop_stale(pointer.partition, index)
                result.stale_index_rows += 1
                return True
            if pointer.kind == LOCK_KIND:
                if not self._fail_lock(head, now):
                    return False
                result.locks_failed += 1
                self._drop_stale(pointer.partition, index)  # a conclusion no longer deletes a lock's row
                return True
            if not self._expire(head, now):
                return False
            result.records_expired += 1
            return True

        return self._settle(index.partition_key, index.state_row_key, index.row_key, act, result)

    def _handle_entry(self, pointer: Pointer, entry: LockEntry, now: datetime, result: CatchupResult) -> bool:
        """Conclude the lock a marker's entry names if its head is still Processing under that lock and it
        expired; skip it when the head finished, was locked again, or was extended to another minute (whose
        marker names it). False if still live."""

        def act(head: Head | None) -> bool:
            if head is None or head.status is not Status.PROCESSING or head.row.lock_id != entry.lock_id:
                ENDED.add(entry.lock_id)
                result.locks_ended += 1
                return True
            moved = head.row.lock_index_key
            if moved and parse_index_row_key(moved)[1] != pointer.bucket:
                return True  # not ended: the entry of its new minute is read when that minute is visited
            if not self._fail_lock(head, now):
                return False
            ENDED.add(entry.lock_id)
            result.locks_failed += 1
            return True

        return self._settle(pointer.partition, entry.head_row_key, entry.column, act, result)

    def _settle(
        self,
        partition: str,
        head_row_key: str,
        what: str,
        act: Callable[[Head | None], bool],
        result: CatchupResult,
    ) -> bool:
        """Read the head at ``head_row_key`` and ``act`` on it; a conflict (someone changed it meanwhile)
        reads it again; throttled, back off and look again. False: left for a later run."""
        conflicts = refusals = 0
        while conflicts < 3:
            try:
                head = self._store.read_head_at(partition, head_row_key)
                result.records_read += 1
                return act(head)
            except Exception as exc:
                if is_conflict(exc):
                    conflicts += 1
                    continue  # someone changed it meanwhile: look again
                if not storage_busy(exc):
                    raise
                # Throttled (503 ServerBusy, 500 OperationTimedOut) or unreachable: a read after the
                # SDK's retries, or the write twice in a row (the store asked once more). Back off and
                # look again, never abort the run (every other pointer's work with it). Past the last
                # attempt the row stays for the next run.
                if refusals >= len(THROTTLED_BACKOFF_S):
                    log.warning("state catch-up: %s still refused, left for the next run: %s", what, exc)
                    return False
                time.sleep(THROTTLED_BACKOFF_S[refusals] * (0.5 + random.random()))
                refusals += 1
        return False

    def _fail_lock(self, head: Head, now: datetime) -> bool:
        until = head.locked_until
        if head.status is not Status.PROCESSING or until is None or until > now:
            return False
        self._store.conclude(
            head,
            Status.FAILED,
            substatus="LockExpired",
            error=f"The lock expired at {iso(until)} before its holder recorded an outcome.",
            now=now,
        )
        telemetry.add("settle.catchup.expired_locks")
        row = head.row
        telemetry.current().event(
            "settle.catchup.lock_expired",
            {
                "settle.tenant_id": row.tenant_id,
                "settle.entity_id": row.entity_id,
                "settle.item_entity_key": row.item_entity_key,
                "settle.lock_id": row.lock_id,
            },
        )
        return True

    def _expire(self, head: Head, now: datetime) -> bool:
        if (
            head.status not in (Status.PROCESSED, Status.SKIPPED, Status.FAILED)
            or retain_until(head.row) > now
        ):
            return False
        self._store.conclude(head, Status.EXPIRED, substatus="RetentionExpired", error=None, now=now)
        return True

    def _drop_stale(self, partition: str, index: IndexRow) -> None:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError

        with contextlib.suppress(ResourceModifiedError):  # rewritten meanwhile: the next run judges it
            self._store.table.delete_entity(
                partition, index.row_key, etag=index.etag, match_condition=MatchConditions.IfNotModified
            )
