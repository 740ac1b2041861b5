"""The built-in handler: records on Table Storage (layout in ``state/keys.py``).

Every write is ETag-conditional (``If-Match``) or insert-only, and every change that writes several rows
of a record (the new head, the history row of the version it supersedes, the expiry-index rows the head
names) is one entity group transaction, so the head, its history and its index can never disagree.

History is written when a version is superseded: the head holds the current version, and the
transaction that replaces it also inserts the replaced version as a history row marked Superseded (its
original status kept in ``RecordedStatus``).

Round trips (sequential requests; the table with every case is in docs/tables.md):
- exists / get: 1 point read.
- lock: 1 transaction on a new key (or when this process already knows the head); 2 when refused
  (insert conflict, then a read that says why); 3 when re-acquiring a Failed/Expired or expired record
  this process has never seen (conflict, read, transaction).
- set / release / extend with a token: 1 transaction; without a token: 1 read + 1 transaction.
- upsert: 1 read + 1 transaction.
- amortised: a process's first lock in a partition and expiry minute first prepares the expiry index
  (2 requests, ``state/expiry.py``), and its first token needs the signing key (1 read, sent beside
  that preparation: ``common/beside.py``).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from common import telemetry
from common.beside import Beside
from common.clock import earliest_now, epoch_ms, from_epoch_ms, iso, latest_now, to_ms, utcnow
from common.errors import (
    Conflict,
    LockLost,
    PayloadTooLarge,
    is_refused_unreceived,
    is_transient_storage_fault,
)
from common.layouts import LayoutBook
from common.limits import MAX_ENTITY_BYTES, entity_size, int64, plain_int
from common.partition_meter import METER
from common.signing import Signer, load_signer
from common.tables import Tables
from state import envelope
from state.expiry import ExpiryIndex
from state.keys import (
    EXPIRY_TABLE,
    LOCK_KIND,
    RETENTION_KIND,
    STATE_TABLE,
    Layout,
    check_key_size,
    escape,
    head_row_key,
    history_row_key_of,
    index_row_key,
    parse_index_row_key,
    record_range,
)
from state.model import LockDecision, RecordKey, Status, lock_decision
from state.token import LockClaims, key_digest

# A finished record with no retention is kept for ever; ``RetainUntil`` still holds a date so that query
# can filter on the effective status (a filter on a missing property never matches).
NEVER = datetime(9999, 12, 31, tzinfo=UTC)
FINISHED = frozenset({Status.PROCESSED, Status.SKIPPED, Status.FAILED})
# Head columns naming the head's own index rows (deleted by the transaction that replaces the head).
INDEX_COLUMNS = {"LockIndexKey": LOCK_KIND, "RetainIndexKey": RETENTION_KIND}

HINT_BYTES = 16 * 1024 * 1024
# The substatus catch-up gives a lock that expired before its holder recorded an outcome.
LOCK_EXPIRED = "LockExpired"
_MAX_ATTEMPTS = 4
# A write refused 503 ServerBusy (never received, so never applied) is sent again up to this many times,
# after an exponential back-off with jitter (at most _BUSY_BACKOFF_S * 2**n s before the n-th), as the
# SDK's own retry policy would; then the caller gets the 503 (state API: with Retry-After).
_BUSY_RESENDS = 3
_BUSY_BACKOFF_S = 0.1
# What a successor version inherits from the version it replaces.
_IDENTITY = (
    "PartitionKey",
    "RowKey",
    "TenantId",
    "ScopeId",
    "EntityId",
    "ItemEntityKey",
    "EntityExecutionId",
    "SourceAppId",
    "HandlerKey",
    "RetentionSeconds",
)


def retain_until(entity: dict[str, Any]) -> datetime:
    value = entity.get("RetainUntil")
    return value if isinstance(value, datetime) else NEVER


def retention_expired(entity: dict[str, Any], now: datetime) -> bool:
    """A finished record past its handler's retention window counts as Expired (may be redone)."""
    return Status(int(entity["Status"])) in FINISHED and retain_until(entity) <= now


def effective_status(entity: dict[str, Any], now: datetime) -> Status:
    if retention_expired(entity, now):
        return Status.EXPIRED
    return Status(int(entity["Status"]))


@dataclass(frozen=True)
class Head:
    """A record's head row as read or written, with its ETag."""

    entity: dict[str, Any]
    etag: str

    @property
    def status(self) -> Status:
        return Status(int(self.entity["Status"]))

    @property
    def version(self) -> int:
        return int(self.entity["Version"])

    @property
    def locked_until(self) -> datetime | None:
        value = self.entity.get("LockedUntil")
        return value if isinstance(value, datetime) else None

    def retention_expired(self, now: datetime) -> bool:
        return retention_expired(self.entity, now)

    def index_keys(self) -> dict[str, str]:
        """The index rows this head owns, by column."""
        return {c: str(self.entity[c]) for c in INDEX_COLUMNS if self.entity.get(c)}


@dataclass(frozen=True)
class WriteContext:
    """Who writes, and the handler options that shape the record."""

    handler_key: str = "built-in"
    source_app_id: int | None = None
    entity_execution_id: int | None = None
    retention_seconds: int | None = None


@dataclass(frozen=True)
class PreviousAttempt:
    """How the version a lock replaced ended: its status, its error, and whether its lock expired
    (taken over now, or concluded ``LockExpired`` by catch-up before: the holder may have done part of
    the work)."""

    status: Status
    error: str | None
    lock_expired: bool
    version: int


def previous_attempt(entity: dict[str, Any]) -> PreviousAttempt:
    """The attempt a head (or, by its ``RecordedStatus``, a history row) stands for."""
    status = Status(int(entity.get("RecordedStatus", entity["Status"])))
    expired = status is Status.PROCESSING or (
        status is Status.FAILED and entity.get("Substatus") == LOCK_EXPIRED
    )
    error = entity.get("Error")
    return PreviousAttempt(
        status=status,
        error=error if isinstance(error, str) else None,
        lock_expired=expired,
        version=int(entity["Version"]),
    )


@dataclass(frozen=True)
class LockOutcome:
    acquired: bool
    status: Status
    token: str | None = None
    locked_until: datetime | None = None
    reason: str | None = None
    takeover: bool = False
    replayed: bool = False
    previous: PreviousAttempt | None = None


@dataclass
class _Hints:
    """What this process last knew of recently used heads (None = known absent), bounded in bytes.

    A hint only saves a read: writes made from it are still ETag-conditional, and a stale hint costs
    one failed attempt and a fresh read. Heads are counted by their Table size estimate, and a head
    larger than 1/64 of the budget is not kept, so the cache never holds more than ``max_bytes``.
    """

    max_bytes: int = HINT_BYTES
    entries: OrderedDict[tuple[str, str], tuple[Head | None, int]] = field(default_factory=OrderedDict)
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, pk: str, rk: str) -> tuple[bool, Head | None]:
        with self.lock:
            entry = self.entries.get((pk, rk))
            if entry is None:
                return False, None
            self.entries.move_to_end((pk, rk))
            return True, entry[0]

    def put(self, pk: str, rk: str, head: Head | None) -> None:
        size = 64 + 2 * (len(pk) + len(rk)) + (entity_size(head.entity) if head is not None else 0)
        with self.lock:
            self._drop((pk, rk))
            if size > self.max_bytes // 64:
                return
            self.entries[(pk, rk)] = (head, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self.entries.popitem(last=False)
                self.bytes -= evicted

    def forget(self, pk: str, rk: str) -> None:
        with self.lock:
            self._drop((pk, rk))

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.bytes = 0

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[1]


def is_conflict(exc: Exception) -> bool:
    """An insert that found the row, or a conditional write that found it changed."""
    from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
    from azure.data.tables import TableTransactionError

    if isinstance(exc, ResourceExistsError | ResourceModifiedError | ResourceNotFoundError):
        return True
    if isinstance(exc, TableTransactionError):
        code = str(getattr(exc, "error_code", None) or "")
        return code in {"EntityAlreadyExists", "UpdateConditionNotSatisfied", "ResourceNotFound"} or (
            exc.status_code in (404, 409, 412)
        )
    return False


def _not_found(exc: Exception) -> bool:
    from azure.data.tables import TableTransactionError

    return isinstance(exc, TableTransactionError) and (
        exc.status_code == 404 or str(getattr(exc, "error_code", "") or "") == "ResourceNotFound"
    )


class StateStore:
    """Records of the built-in handler."""

    def __init__(
        self,
        tables: Tables,
        *,
        hint_bytes: int = HINT_BYTES,
        layout: Layout | None = None,
        accounts: Sequence[Tables] | None = None,
        layouts: LayoutBook | None = None,
    ) -> None:
        from state.accounts import RoutedTable, extra_accounts
        from state.layout import RecordedLayouts

        self._tables = tables
        # The state table's accounts: 0 is ``tables``; more from SETTLE_TABLES_{i} (ADR-0015).
        if accounts is None:
            accounts = [tables, *(Tables(s) for s in extra_accounts(tables.settings.prefix))]
        self._routed = RoutedTable(accounts) if len(accounts) > 1 else None
        # How a node definition's records spread over partitions (state/keys.py; docs/tables.md): the
        # layout recorded in storage (common/layouts.py), unless a fixed one is given (bench, tests).
        self._layouts = RecordedLayouts(layouts or LayoutBook(tables), len(accounts), fixed=layout)
        self.index = ExpiryIndex(tables, state_table=lambda: self.table)
        self._hints = _Hints(max_bytes=hint_bytes)
        self._signer: Signer | None = None
        self._signer_lock = threading.Lock()

    @property
    def layout(self) -> Layout:
        """The layout records are created in and read from now (cached: no request per call)."""
        return self._layouts.now()

    @property
    def table(self) -> Any:
        """The state table (with several accounts: routed by each call's partition)."""
        return self._routed if self._routed is not None else self._tables.table(STATE_TABLE)

    def signer(self) -> Signer:
        """The deployment's token signer (its key is read once per process)."""
        if self._signer is None:
            with self._signer_lock:
                if self._signer is None:
                    # Kept beside level 1 of the expiry index: a table of Settle's own, never range-read
                    # at ``hmac`` (its partitions are ``l``/``r`` + minute).
                    self._signer = load_signer(self._tables, EXPIRY_TABLE)
        return self._signer

    @staticmethod
    def now() -> datetime:
        """Now by the storage clock, to the millisecond (every instant Settle stores has that precision)."""
        return to_ms(utcnow())

    @staticmethod
    def earliest() -> datetime:
        """The earliest the storage clock may read now (``common.clock.earliest_now``): what another
        holder's expiry is judged by (takeover, catch-up), so an uncertain clock waits, never steals."""
        return to_ms(earliest_now())

    @staticmethod
    def latest() -> datetime:
        """The latest the storage clock may read now: what a holder's own lock is judged by (the fence)."""
        return to_ms(latest_now())

    # -- reads -------------------------------------------------------------------------------------
    def read_head(self, key: RecordKey) -> Head | None:
        check_key_size(key)
        pk, rk = self.layout.partition(key), head_row_key(key)
        head = self.read_head_at(pk, rk)
        if head is None:
            for earlier in self.layout.earlier_partitions(key):  # a record created under an earlier S
                head = self.read_head_at(earlier, rk)
                if head is not None:
                    break
        self._hints.put(pk, rk, head)
        return head

    def read_head_at(self, pk: str, rk: str) -> Head | None:
        """Point-read a head by its Table keys (catch-up knows rows, not request keys)."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            entity = self.table.get_entity(pk, rk)
        except ResourceNotFoundError:
            return None
        return Head(dict(entity), entity.metadata["etag"])

    def history_page(
        self, key: RecordKey, *, page_size: int, continuation: dict[str, str] | None
    ) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
        """Head first, then superseded versions newest first."""
        check_key_size(key)
        low, high = record_range(key)
        query = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"
        if continuation is None and self.layout.earlier_partitions(key):
            for pk in [self.layout.partition(key), *self.layout.earlier_partitions(key)]:
                rows, token = self.query_page(
                    query, {"pk": pk, "low": low, "high": high}, page_size=page_size, continuation=None
                )
                if rows or token:  # a record lives in one layout: the first that has rows is it
                    return rows, token
            return [], None
        pk = self.layout.partition(key)
        if self.layout.earlier_partitions(key):  # a later page: continue where the record lives
            head = self.read_head(key)
            pk = str(head.entity["PartitionKey"]) if head is not None else pk
        return self.query_page(
            query, {"pk": pk, "low": low, "high": high}, page_size=page_size, continuation=continuation
        )

    def query_page(
        self, query: str, parameters: dict[str, Any], *, page_size: int, continuation: dict[str, str] | None
    ) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
        if self._routed is None or "pk" in parameters:
            entities = self.table.query_entities(query, parameters=parameters, results_per_page=page_size)
            pager = entities.by_page(continuation_token=continuation)
            page = [dict(e) for e in next(pager, [])]
            return page, pager.continuation_token
        # Across partitions over several accounts: account after account; the token names the account.
        state = dict(continuation or {})
        account = int(state.pop("Account", "0"))
        if account >= len(self._routed.clients()):
            return [], None  # issued before an account was removed from the settings: nothing more
        table = self._routed.clients()[account]
        pager = table.query_entities(query, parameters=parameters, results_per_page=page_size).by_page(
            continuation_token=state or None
        )
        page = [dict(e) for e in next(pager, [])]
        token = pager.continuation_token
        if token:
            return page, {**token, "Account": str(account)}
        if account + 1 < len(self._routed.clients()):
            return page, {"Account": str(account + 1)}
        return page, None

    # -- lock ----------------------------------------------------------------------------------------
    def lock(
        self, key: RecordKey, ctx: WriteContext, lock_seconds: int, *, request_id: str | None = None
    ) -> LockOutcome:
        """Take the lock (see ``lock_decision``). ``request_id``: a caller-chosen id; a call with the same
        id while that lock holds gets it back (``replayed``) instead of a refusal."""
        check_key_size(key)
        # A lock is only taken when its token can be issued. A process that has not read its signing key
        # yet reads it beside the lock's first requests (the preparation of its expiry minute), and the
        # lock's write waits for it (issue 21: a cold instance's first lock); every answer waits for it.
        if self._signer is not None:
            return self._lock(key, ctx, lock_seconds, request_id, ready=_nothing)
        key_read = Beside(self.signer, name="settle-signing-key")
        try:
            outcome = self._lock(key, ctx, lock_seconds, request_id, ready=key_read.result)
        except BaseException:
            key_read.wait()
            raise
        key_read.result()
        return outcome

    def _lock(
        self,
        key: RecordKey,
        ctx: WriteContext,
        lock_seconds: int,
        request_id: str | None,
        *,
        ready: Callable[[], object],
    ) -> LockOutcome:
        pk, rk = self.layout.partition(key), head_row_key(key)
        known, current = self._hints.get(pk, rk)
        if not known and self.layout.earlier_partitions(key):
            current = self.read_head(key)  # the record may live in an earlier layout: never insert a twin
        if known and current is not None:
            judged = self.earliest()
            decision = lock_decision(
                current.status,
                current.locked_until,
                judged,
                retention_expired=current.retention_expired(judged),
            )
            if not decision.acquire:
                current = self.read_head(key)  # refusals are always confirmed by storage
        for _ in range(_MAX_ATTEMPTS):
            now = self.now()
            if current is None:
                new = self._new_head(key, ctx, Status.PROCESSING, now, version=1, created_at=now)
                decision = LockDecision(acquire=True)
            else:
                # Someone else's expiry is judged by the earliest the storage clock may read (a cold
                # instance's estimate is off by up to half a second): it waits rather than steals.
                judged = self.earliest()
                decision = lock_decision(
                    current.status,
                    current.locked_until,
                    judged,
                    retention_expired=current.retention_expired(judged),
                )
                if not decision.acquire:
                    telemetry.annotate({"settle.status_before": current.status.label})
                    if request_id is not None and _same_request(current, request_id, now):
                        return self._acquired(key, current, replayed=True, previous=self._before(current))
                    return LockOutcome(
                        acquired=False,
                        status=effective_status(current.entity, now),
                        locked_until=current.locked_until if current.status is Status.PROCESSING else None,
                        reason=decision.reason,
                    )
                new = self._next_head(key, ctx, current, Status.PROCESSING, now)
            lock_fields(new, uuid.uuid4().hex, now, now + timedelta(seconds=lock_seconds))
            if request_id is not None:
                new["LockRequestId"] = request_id
            if decision.takeover and current is not None:
                previous = current.locked_until
                new["Substatus"] = "LockTakenOver"
                new["Note"] = (
                    f"Took over lock {current.entity.get('LockId')} that expired at "
                    f"{iso(previous) if previous is not None else 'an unknown time'}."
                )
            try:
                head = _noted(current, self._write(current, new, ready=ready))
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                current = self.read_head(key)
                continue
            before = previous_attempt(current.entity) if current is not None else None
            return self._acquired(key, head, takeover=decision.takeover, previous=before)
        raise Conflict("The record changed on every attempt to lock it; retry.", field="key")

    def _acquired(
        self,
        key: RecordKey,
        head: Head,
        *,
        takeover: bool = False,
        replayed: bool = False,
        previous: PreviousAttempt | None = None,
    ) -> LockOutcome:
        return LockOutcome(
            acquired=True,
            status=Status.PROCESSING,
            token=claims_of(key, head).encode(self.signer()),
            locked_until=head.locked_until,
            takeover=takeover,
            replayed=replayed,
            previous=previous,
        )

    def _before(self, head: Head) -> PreviousAttempt | None:
        """The attempt before ``head`` (its history row; one point read, on the replay path only)."""
        from azure.core.exceptions import ResourceNotFoundError

        if head.version <= 1:
            return None
        pk, rk = str(head.entity["PartitionKey"]), str(head.entity["RowKey"])
        try:
            row = self.table.get_entity(pk, history_row_key_of(rk, head.version - 1))
        except ResourceNotFoundError:
            return None
        return previous_attempt(dict(row))

    def extend(self, key: RecordKey, ctx: WriteContext, token_text: str, lock_seconds: int) -> LockOutcome:
        """Move the lock's expiry. The head is rewritten in place (same version, lock id, substatus and
        note; ``UpdatedAt`` and ``LockedUntil`` move; If-Match its ETag, the lock's index row moved in the
        same transaction) and no history row is written: a lock held for hours leaves one history row,
        its start, when its outcome supersedes it. Fencing is unchanged: the lock id decides."""
        claims = self._check_token(key, token_text)

        def build(current: Head, now: datetime) -> dict[str, Any]:
            new = dict(current.entity)
            new["UpdatedAt"] = now
            lock_fields(new, str(new["LockId"]), new["LockedAt"], now + timedelta(seconds=lock_seconds))
            return new

        return self._acquired(key, self._fenced(key, ctx, claims, build, in_place=True))

    # -- writes of an outcome ----------------------------------------------------------------------------
    def record(
        self,
        key: RecordKey,
        ctx: WriteContext,
        *,
        status: Status,
        envelope_props: dict[str, Any] | None,
        substatus: str | None,
        error: str | None,
        token_text: str | None,
        require_processing: bool = False,
        digest: str | None = None,
    ) -> Head:
        """Record an outcome (set, upsert, release). Fenced by ``token_text`` when given."""

        def build(current: Head | None, now: datetime) -> dict[str, Any]:
            if current is None:
                new = self._new_head(key, ctx, status, now, version=1, created_at=now)
            else:
                new = self._next_head(key, ctx, current, status, now)
            if envelope_props:
                new.update(envelope_props)
            if substatus is not None:
                new["Substatus"] = substatus
            if error is not None:
                new["Error"] = error
            return new

        if token_text is not None:
            claims = self._check_token(key, token_text)
            return self._fenced(key, ctx, claims, build, concludes=status, digest=digest)
        return self._unfenced(key, build, require_processing=require_processing)

    def _unfenced(self, key: RecordKey, build: Any, *, require_processing: bool) -> Head:
        current = self.read_head(key)
        for _ in range(_MAX_ATTEMPTS):
            if require_processing and (current is None or current.status is not Status.PROCESSING):
                state = "no record" if current is None else f"the record is {current.status.label}"
                raise Conflict(f"There is no lock to release: {state}.", field="key")
            try:
                return _noted(current, self._write(current, build(current, self.now())))
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                current = self.read_head(key)
        raise Conflict("The record changed on every attempt to write it; retry.", field="key")

    # -- fencing -------------------------------------------------------------------------------------
    def _check_token(self, key: RecordKey, token_text: str) -> LockClaims:
        check_key_size(key)
        claims = LockClaims.decode(token_text, self.signer())
        if claims.k != key_digest(key):
            raise LockLost("The lock token belongs to another record.", field="lockToken")
        return claims

    def _fenced(
        self,
        key: RecordKey,
        ctx: WriteContext,
        claims: LockClaims,
        build: Any,
        *,
        concludes: Status | None = None,
        digest: str | None = None,
        in_place: bool = False,
    ) -> Head:
        """Write while holding the lock: one transaction from the token, re-reading only if needed.

        ``concludes``: the outcome this write records (it ends the lock); ``digest``: a digest of the
        request. The new head remembers both, so the retry of a write that was applied but whose answer
        was lost gets the record back instead of a false "lock lost"; a different request is refused.
        """
        current: Head | None = None
        # The holder's own lock is judged by the latest the storage clock may read: valid for sure.
        if claims.locked_until > self.latest():
            # Built in the current layout; a record of an earlier layout fails this write (404) and is
            # re-read where it lives.
            current = Head(entity_of(key, claims, self.layout.partition(key)), claims.e)
        for _ in range(_MAX_ATTEMPTS):
            if current is None:
                head = self.read_head(key)
                if concludes is not None and head is not None:
                    done = self._concluded_by(key, head, claims)
                    if done is not None:
                        if done.status is concludes and done.entity.get("ClosedDigest") == digest:
                            telemetry.current().set_outcome("replayed")
                            return done  # this very write was already applied
                        raise LockLost(
                            f"This lock already ended with {done.status.label} (another request). "
                            "Nothing was written.",
                            field="lockToken",
                        )
                current = self._holder_head(head, claims, self.latest())
            new = build(current, self.now())
            if concludes is not None:
                new["ClosedLockId"] = claims.i
                if digest is not None:
                    new["ClosedDigest"] = digest
            try:
                return _noted(current, self._write(current, new, keep_history=not in_place))
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                current = None
        raise Conflict("The record changed on every attempt to write it; retry.", field="key")

    def _concluded_by(self, key: RecordKey, head: Head, claims: LockClaims) -> Head | None:
        """The version that ended the token's lock, if one did: the head, or, when newer versions followed
        (another worker re-locked, retention expired, catch-up), a point read of the version the token's
        write created (``claims.n + 1``), as it was written (its recorded status, not Superseded)."""
        if head.entity.get("ClosedLockId") == claims.i:
            return head
        if head.version <= claims.n + 1:
            return None
        from azure.core.exceptions import ResourceNotFoundError

        rk = str(head.entity["RowKey"])
        try:
            row = dict(
                self.table.get_entity(head.entity["PartitionKey"], history_row_key_of(rk, claims.n + 1))
            )
        except ResourceNotFoundError:
            return None
        if row.get("ClosedLockId") != claims.i or row.get("RecordedStatus") is None:
            return None
        row.update(RowKey=rk, Status=int(row["RecordedStatus"]))
        for column in ("RecordedStatus", "SupersededAt", "SupersededByVersion"):
            row.pop(column, None)
        return Head(row, "")

    def _holder_head(self, head: Head | None, claims: LockClaims, now: datetime) -> Head:
        """Make sure the token still holds the lock of ``head``; raise 409 otherwise."""
        if head is None or head.entity.get("LockId") != claims.i or head.status is not Status.PROCESSING:
            if head is None:
                why = "the record does not exist"
            elif head.status is Status.PROCESSING:
                why = "another caller took the lock over after it expired"
            else:
                why = f"the record is now {head.status.label}"
            raise LockLost(f"The lock is no longer held: {why}. Nothing was written.", field="lockToken")
        until = head.locked_until
        if until is not None and until <= now:
            raise LockLost(
                f"The lock expired at {iso(until)}; take the lock again. Nothing was written.",
                field="lockToken",
            )
        return head

    def _after_ambiguity(
        self, pk: str, rk: str, current: Head | None, new: dict[str, Any], exc: Exception
    ) -> Head | None:
        """After a write whose answer was lost: the head when it is the version ``new`` describes; None when
        the head is still ``current``, the one ``new`` replaces (nothing was written: ask again); else a
        conflict. ``current`` is compared by ETag, so an in-place rewrite (an extension keeps its Version)
        is told apart from the head it replaces."""
        from azure.core.exceptions import ResourceModifiedError

        try:
            head = self.read_head_at(pk, rk)
        except Exception:
            raise exc from None  # storage cannot say: the original fault (503), never a guess
        if head is not None and _is_version(head.entity, new):
            return head
        if (head is None and current is None) or (
            head is not None and current is not None and head.etag == current.etag
        ):
            return None
        raise ResourceModifiedError("The record changed while the write's answer was lost.") from exc

    # -- building rows ---------------------------------------------------------------------------------
    def _base_entity(self, key: RecordKey, ctx: WriteContext, status: Status) -> dict[str, Any]:
        entity: dict[str, Any] = {
            "PartitionKey": self.layout.partition(key),
            "RowKey": head_row_key(key),
            "TenantId": key.tenant_id,
            "ScopeId": int(key.scope),
            "EntityId": key.entity_id,
            "ItemEntityKey": escape(key.item_entity_key),
            "Status": int(status),
            "HandlerKey": ctx.handler_key,
            "RetainUntil": NEVER,
        }
        execution = (
            key.entity_execution_id if key.entity_execution_id is not None else ctx.entity_execution_id
        )
        if execution is not None:
            entity["EntityExecutionId"] = execution
        if ctx.source_app_id is not None:
            entity["SourceAppId"] = ctx.source_app_id
        if ctx.retention_seconds:
            entity["RetentionSeconds"] = int64(ctx.retention_seconds)
        return entity

    def _new_head(
        self,
        key: RecordKey,
        ctx: WriteContext,
        status: Status,
        now: datetime,
        *,
        version: int,
        created_at: datetime,
    ) -> dict[str, Any]:
        entity = self._base_entity(key, ctx, status)
        entity.update(Version=version, CreatedAt=created_at, UpdatedAt=now, DataChunks=0)
        if ctx.retention_seconds and status in FINISHED:
            _retain(entity, now + timedelta(seconds=ctx.retention_seconds))
        return entity

    def _next_head(
        self, key: RecordKey, ctx: WriteContext, current: Head, status: Status, now: datetime
    ) -> dict[str, Any]:
        new = self._new_head(
            key,
            ctx,
            status,
            now,
            version=current.version + 1,
            created_at=current.entity.get("CreatedAt", now),
        )
        new["PartitionKey"] = current.entity["PartitionKey"]  # a record stays in the partition it has
        return new

    def conclude(
        self, current: Head, status: Status, *, substatus: str, error: str | None, now: datetime
    ) -> Head:
        """Replace ``current`` by its successor in ``status`` (catch-up: lock expired, retention)."""
        new = {k: current.entity[k] for k in _IDENTITY if k in current.entity}
        new.update(
            Status=int(status),
            Version=current.version + 1,
            CreatedAt=current.entity.get("CreatedAt", now),
            UpdatedAt=now,
            Substatus=substatus,
            RetainUntil=NEVER,
        )
        if status is Status.EXPIRED:
            new.update(envelope.data_properties(current.entity))
        else:
            new["DataChunks"] = 0
            retention = current.entity.get("RetentionSeconds")
            if retention is not None and status in FINISHED:
                _retain(new, now + timedelta(seconds=plain_int(retention)))
        if error is not None:
            new["Error"] = error
        return self._write(current, new)

    def _write(
        self,
        current: Head | None,
        new: dict[str, Any],
        *,
        keep_history: bool = True,
        ready: Callable[[], object] | None = None,
    ) -> Head:
        """Insert the first version, or replace ``current`` (If-Match) and append its history row; in the
        same transaction delete the index rows ``current`` names and insert the ones ``new`` names.
        ``keep_history=False``: ``new`` is the same version rewritten (an extension), no history row.
        ``ready``: waited for (what it raises is raised) after the index is prepared, before the write."""
        from azure.core import MatchConditions
        from azure.data.tables import TableTransactionError, UpdateMode

        pk, rk = new["PartitionKey"], new["RowKey"]
        if entity_size(new) > MAX_ENTITY_BYTES:
            raise PayloadTooLarge(
                f"The record would take {entity_size(new)} bytes in Table Storage; the limit is "
                f"{MAX_ENTITY_BYTES} bytes per row. Send less data.",
                field="data",
                limitBytes=MAX_ENTITY_BYTES,
            )
        old = current.index_keys() if current is not None else {}
        fresh = {c: str(new[c]) for c in INDEX_COLUMNS if new.get(c)}
        deletes = [row for c, row in old.items() if fresh.get(c) != row]
        inserts = [row for c, row in fresh.items() if old.get(c) != row]
        gone: set[str] = set()
        busy = 0  # resends after 503 ServerBusy (nothing applied)
        read_back = False  # an answer that left the outcome open: the head is read back at most once
        for _ in range(_MAX_ATTEMPTS + _BUSY_RESENDS):
            ops: list[Any] = []
            if current is None:
                ops.append(("create", new))
            else:
                history = {k: v for k, v in current.entity.items() if k not in INDEX_COLUMNS}
                history.update(
                    RowKey=history_row_key_of(rk, current.version),
                    Status=int(Status.SUPERSEDED),
                    RecordedStatus=int(current.status),
                    SupersededAt=new["UpdatedAt"],
                    SupersededByVersion=new["Version"],
                )
                replace = {"mode": UpdateMode.REPLACE, "etag": current.etag}
                ops.append(("update", new, {**replace, "match_condition": MatchConditions.IfNotModified}))
                if keep_history:
                    ops.append(("create", history))
            unconditional = {"match_condition": MatchConditions.Unconditionally}  # If-Match: *
            deleting = [row for row in deletes if row not in gone]
            for row in deleting:
                # Safe unconditionally: the head's If-Match in this transaction proves the row is current.
                ops.append(("delete", {"PartitionKey": pk, "RowKey": row}, unconditional))
            markers: list[dict[str, Any]] = []
            for row in inserts:
                kind, bucket, _ = parse_index_row_key(row)
                ops.append(("create", {"PartitionKey": pk, "RowKey": row, "StateRK": rk}))
                marker = self.index.marker(pk, kind, bucket)
                if marker not in markers:
                    markers.append(marker)
            first_marker = len(ops)
            ops += [("update", m, {"mode": UpdateMode.MERGE, **unconditional}) for m in markers]
            if ready is not None:
                ready()
            try:
                # Not retried by the SDK: a retry of a write that was applied but whose answer was lost
                # meets its own write (a conflict) and could write again; the ambiguity is settled below.
                if len(ops) == 1 and current is None:
                    etag = self.table.create_entity(new, retry_total=0)["etag"]
                else:
                    etag = self.table.submit_transaction(ops, retry_total=0)[0]["etag"]
            except TableTransactionError as exc:
                at = exc.index
                if _not_found(exc) and at is not None and first_marker <= at < len(ops):
                    self.index.forget(
                        markers[at - first_marker]
                    )  # catch-up closed that minute: prepare again
                    continue
                first_delete = len(ops) - len(markers) - len(inserts) - len(deleting)
                if _not_found(exc) and at is not None and first_delete <= at < first_delete + len(deleting):
                    gone.add(deleting[at - first_delete])  # already removed (an older layout): skip it
                    continue
                self._hints.forget(pk, rk)
                raise
            except Exception as exc:
                if is_refused_unreceived(exc):
                    # 503 ServerBusy: refused before storage received it (issue 21; common/errors.py says
                    # from which documentation). Nothing was written and the head is still ``current``
                    # (its hint stays): send again after a back-off, without reading it back.
                    if busy >= _BUSY_RESENDS:
                        raise
                    time.sleep(_BUSY_BACKOFF_S * 2**busy * random.uniform(0.5, 1.0))
                    busy += 1
                    continue
                self._hints.forget(pk, rk)
                if not is_transient_storage_fault(exc) or read_back:
                    raise
                # Applied or not? One point read says: our own version there (its Version, UpdatedAt and
                # lock are ours) is success; the head as it was means nothing was written, so ask once
                # more; anything else is another writer's change (a conflict: the caller re-decides).
                read_back = True
                found = self._after_ambiguity(pk, rk, current, new, exc)
                if found is None:
                    continue  # nothing was written: sent once more (a second open answer is raised)
                self._hints.put(pk, rk, found)
                return found
            head = Head(new, etag)
            self._hints.put(pk, rk, head)
            METER.count(pk, len(ops))
            return head
        raise Conflict("The record's expiry index changed on every attempt to write it; retry.", field="key")


_WRITTEN_COLUMNS = ("Version", "Status", "UpdatedAt", "LockId", "LockedUntil", "ClosedLockId", "ClosedDigest")


def _is_version(entity: dict[str, Any], new: dict[str, Any]) -> bool:
    """Is ``entity`` (read back) the version ``new`` describes? Every write sets a new Version and
    UpdatedAt (and a lock its own LockId), so these columns tell one writer's version from another's."""
    return all(
        _same_value(entity.get(column), new.get(column))
        for column in _WRITTEN_COLUMNS
        if column in new or column in entity
    )


def _same_value(read: Any, written: Any) -> bool:
    if isinstance(read, datetime) and isinstance(written, datetime):
        return epoch_ms(read) == epoch_ms(written)
    return bool(getattr(read, "value", read) == getattr(written, "value", written))


def _nothing() -> None:
    """What a lock waits for when its process already holds the signing key."""


def _noted(current: Head | None, head: Head) -> Head:
    """The write on the operation's span: applied, and the status it moved from and to."""
    span = telemetry.current()
    span.set_outcome("applied")
    span.update(
        {
            "settle.status_before": current.status.label if current is not None else Status.NONE.label,
            "settle.status_after": head.status.label,
            "settle.version": head.version,
        }
    )
    return head


def claims_of(key: RecordKey, head: Head) -> LockClaims:
    """The token claims of a Processing head: everything needed to rebuild it (see :func:`entity_of`)."""
    entity = head.entity
    retention = entity.get("RetentionSeconds")
    return LockClaims(
        i=str(entity["LockId"]),
        k=key_digest(key),
        n=head.version,
        e=head.etag,
        a=epoch_ms(entity["LockedAt"]),
        u=epoch_ms(entity["LockedUntil"]),
        w=epoch_ms(entity["UpdatedAt"]),
        c=epoch_ms(entity["CreatedAt"]),
        h=str(entity["HandlerKey"]),
        s=entity.get("SourceAppId"),
        x=entity.get("EntityExecutionId"),
        t=plain_int(retention) if retention is not None else None,
        b=entity.get("Substatus"),
        o=entity.get("Note"),
        q=entity.get("LockRequestId"),
    )


def entity_of(key: RecordKey, claims: LockClaims, partition: str) -> dict[str, Any]:
    """The Processing head a token was issued for, column for column (its history row copies it)."""
    entity: dict[str, Any] = {
        "PartitionKey": partition,
        "RowKey": head_row_key(key),
        "TenantId": key.tenant_id,
        "ScopeId": int(key.scope),
        "EntityId": key.entity_id,
        "ItemEntityKey": escape(key.item_entity_key),
        "Status": int(Status.PROCESSING),
        "HandlerKey": claims.h,
        "RetainUntil": NEVER,
        "Version": claims.n,
        "CreatedAt": from_epoch_ms(claims.c),
        "UpdatedAt": from_epoch_ms(claims.w),
        "DataChunks": 0,
    }
    optional = {
        "EntityExecutionId": claims.x,
        "SourceAppId": claims.s,
        "Substatus": claims.b,
        "Note": claims.o,
    }
    entity.update({k: v for k, v in optional.items() if v is not None})
    if claims.t is not None:
        entity["RetentionSeconds"] = int64(claims.t)
    if claims.q is not None:
        entity["LockRequestId"] = claims.q
    lock_fields(entity, claims.i, from_epoch_ms(claims.a), from_epoch_ms(claims.u))
    return entity


def lock_fields(entity: dict[str, Any], lock_id: str, locked_at: datetime, until: datetime) -> None:
    """A Processing head's lock, and the index row that catch-up finds it by."""
    until = to_ms(until)
    entity.update(
        LockId=lock_id,
        LockedAt=locked_at,
        LockedUntil=until,
        LockIndexKey=index_row_key(LOCK_KIND, epoch_ms(until), lock_id),
    )


def _retain(entity: dict[str, Any], until: datetime) -> None:
    """A finished head's retention deadline, and the index row that catch-up expires it by."""
    until = to_ms(until)
    entity.update(
        RetainUntil=until, RetainIndexKey=index_row_key(RETENTION_KIND, epoch_ms(until), uuid.uuid4().hex)
    )


def _same_request(current: Head, request_id: str, now: datetime) -> bool:
    """Is ``current`` the still-valid lock that a lock call with ``request_id`` took?"""
    until = current.locked_until
    return (
        current.status is Status.PROCESSING
        and current.entity.get("LockRequestId") == request_id
        and until is not None
        and until > now
    )
