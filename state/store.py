"""The built-in handler: records on Table Storage (layout in ``state/keys.py``).

Every write is ETag-conditional (``If-Match``) or insert-only, and every change that writes two rows of a
record (the new head and the history row of the version it supersedes) is one entity group transaction,
so the head and its history can never disagree.

History is written when a version is superseded: the head holds the current version, and the
transaction that replaces it also inserts the replaced version as a history row marked Superseded (its
original status kept in ``RecordedStatus``). A lock on a new key is therefore a single insert, and a
fenced write a single transaction.

Round trips (each line is one sequential request unless noted):
- exists / get: 1 point read.
- lock: 1 insert on a new key (or when this process already knows the head: 1 conditional replace);
  2 when refused (insert conflict, then a read that says why); 3 when re-acquiring a Failed/Expired or
  expired record this process has never seen (insert conflict, read, conditional replace).
- set / release / extend with a token: 1 transaction; without a token: 1 read + 1 transaction.
- upsert: 1 read + 1 transaction (1 insert on a new key known to this process).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from common.clock import iso, utcnow
from common.errors import Conflict, LockLost
from common.tables import Tables
from state import envelope
from state.expiry import LOCK_KIND, RETENTION_KIND, ExpiryIndex, retention_ident
from state.keys import (
    STATE_TABLE,
    check_key_size,
    escape,
    head_row_key,
    history_row_key_of,
    partition_key,
    record_range,
)
from state.model import LockDecision, RecordKey, Status, lock_decision
from state.token import LockToken, key_digest

_HINTS_MAX = 4096
_HINT_MAX_CHUNKS = 2  # do not keep heads with more than ~128 KB of data in memory
_MAX_ATTEMPTS = 4
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


def retention_expired(entity: dict[str, Any], now: datetime) -> bool:
    """A finished record past its handler's retention window counts as Expired (may be redone)."""
    seconds = entity.get("RetentionSeconds")
    if not seconds or int(entity["Status"]) not in (Status.PROCESSED, Status.SKIPPED, Status.FAILED):
        return False
    updated = entity.get("UpdatedAt")
    return isinstance(updated, datetime) and updated + timedelta(seconds=int(seconds)) <= now


def effective_status(entity: dict[str, Any], now: datetime) -> Status:
    if retention_expired(entity, now):
        return Status.EXPIRED
    return Status(int(entity["Status"]))


@dataclass(frozen=True)
class WriteContext:
    """Who writes, and the handler options that shape the record."""

    handler_key: str = "built-in"
    source_app_id: int | None = None
    entity_execution_id: int | None = None
    retention_seconds: int | None = None


@dataclass(frozen=True)
class LockOutcome:
    acquired: bool
    status: Status
    token: str | None = None
    locked_until: datetime | None = None
    reason: str | None = None
    takeover: bool = False


@dataclass
class _Hints:
    """What this process last knew of recently used heads (None = known absent).

    A hint only saves a read: writes made from it are still ETag-conditional, and a stale hint costs
    one failed attempt and a fresh read.
    """

    entries: OrderedDict[tuple[str, str], Head | None] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, pk: str, rk: str) -> tuple[bool, Head | None]:
        with self.lock:
            if (pk, rk) not in self.entries:
                return False, None
            self.entries.move_to_end((pk, rk))
            return True, self.entries[(pk, rk)]

    def put(self, pk: str, rk: str, head: Head | None) -> None:
        with self.lock:
            if head is not None and int(head.entity.get("DataChunks") or 0) > _HINT_MAX_CHUNKS:
                self.entries.pop((pk, rk), None)
                return
            self.entries[(pk, rk)] = head
            self.entries.move_to_end((pk, rk))
            while len(self.entries) > _HINTS_MAX:
                self.entries.popitem(last=False)

    def forget(self, pk: str, rk: str) -> None:
        with self.lock:
            self.entries.pop((pk, rk), None)


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


class StateStore:
    """Records of the built-in handler."""

    def __init__(self, tables: Tables, expiry: ExpiryIndex) -> None:
        self._tables = tables
        self.expiry = expiry
        self._hints = _Hints()

    @property
    def table(self) -> Any:
        return self._tables.table(STATE_TABLE)

    # -- reads -------------------------------------------------------------------------------------
    def read_head(self, key: RecordKey) -> Head | None:
        from azure.core.exceptions import ResourceNotFoundError

        check_key_size(key)
        pk, rk = partition_key(key.tenant_id, key.scope, key.entity_id), head_row_key(key)
        try:
            entity = self.table.get_entity(pk, rk)
        except ResourceNotFoundError:
            self._hints.put(pk, rk, None)
            return None
        head = Head(dict(entity), entity.metadata["etag"])
        self._hints.put(pk, rk, head)
        return head

    def history_page(
        self, key: RecordKey, *, page_size: int, continuation: dict[str, str] | None
    ) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
        """Head first, then superseded versions newest first."""
        check_key_size(key)
        low, high = record_range(key)
        pager = self.table.query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
            parameters={
                "pk": partition_key(key.tenant_id, key.scope, key.entity_id),
                "low": low,
                "high": high,
            },
            results_per_page=page_size,
        ).by_page(continuation_token=continuation)
        page = [dict(e) for e in next(pager, [])]
        return page, pager.continuation_token

    def query_page(
        self, query: str, parameters: dict[str, Any], *, page_size: int, continuation: dict[str, str] | None
    ) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
        pager = self.table.query_entities(query, parameters=parameters, results_per_page=page_size).by_page(
            continuation_token=continuation
        )
        page = [dict(e) for e in next(pager, [])]
        return page, pager.continuation_token

    # -- lock ----------------------------------------------------------------------------------------
    def lock(
        self, key: RecordKey, ctx: WriteContext, lock_seconds: int, *, request_id: str | None = None
    ) -> LockOutcome:
        """Take the lock (see ``lock_decision``). ``request_id``: a caller-chosen id; a retry with the same
        id after a lost answer gets its own lock back instead of a refusal."""
        check_key_size(key)
        pk, rk = partition_key(key.tenant_id, key.scope, key.entity_id), head_row_key(key)
        known, current = self._hints.get(pk, rk)
        if known and current is not None:
            decision = lock_decision(
                current.status,
                current.locked_until,
                utcnow(),
                retention_expired=current.retention_expired(utcnow()),
            )
            if not decision.acquire:
                current = self.read_head(key)  # refusals are always confirmed by storage
        for _ in range(_MAX_ATTEMPTS):
            now = utcnow()
            if current is None:
                new = self._new_head(key, ctx, Status.PROCESSING, now, version=1, created_at=now)
                decision = LockDecision(acquire=True)
            else:
                decision = lock_decision(
                    current.status,
                    current.locked_until,
                    now,
                    retention_expired=current.retention_expired(now),
                )
                if not decision.acquire:
                    if request_id is not None and _same_request(current, request_id, now):
                        return self._acquired(key, current, str(current.entity["LockId"]))
                    return LockOutcome(
                        acquired=False,
                        status=effective_status(current.entity, now),
                        locked_until=current.locked_until if current.status is Status.PROCESSING else None,
                        reason=decision.reason,
                    )
                new = self._next_head(key, ctx, current, Status.PROCESSING, now)
            lock_id = _lock_fields(new, now, lock_seconds)
            if request_id is not None:
                new["LockRequestId"] = request_id
            if decision.takeover and current is not None:
                previous = current.entity.get("LockedUntil")
                new["Substatus"] = "LockTakenOver"
                new["Note"] = (
                    f"Took over lock {current.entity.get('LockId')} that expired at "
                    f"{iso(previous) if isinstance(previous, datetime) else previous}."
                )
            # Index first: if the write applies but its answer is lost, catch-up still finds the lock.
            self.expiry.track(LOCK_KIND, new["LockedUntil"], lock_id, pk, rk, int(new["Version"]))
            try:
                head = self._write(current, new)
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                self.expiry.untrack(lock_id)
                current = self.read_head(key)
                continue
            if decision.takeover and current is not None and current.entity.get("LockId"):
                self.expiry.untrack(str(current.entity["LockId"]))
            return self._acquired(key, head, lock_id, takeover=decision.takeover)
        raise Conflict("The record changed on every attempt to lock it; retry.", field="key")

    def _acquired(self, key: RecordKey, head: Head, lock_id: str, *, takeover: bool = False) -> LockOutcome:
        entity = head.entity
        token = LockToken(
            lock_id=lock_id,
            version=head.version,
            etag=head.etag,
            locked_at=entity["LockedAt"],
            locked_until=entity["LockedUntil"],
            key_digest=key_digest(key),
            created_at=entity["CreatedAt"],
            note=entity.get("Substatus"),
        )
        self.expiry.track(
            LOCK_KIND, entity["LockedUntil"], lock_id, entity["PartitionKey"], entity["RowKey"], head.version
        )
        return LockOutcome(
            acquired=True,
            status=Status.PROCESSING,
            token=token.encode(),
            locked_until=entity["LockedUntil"],
            takeover=takeover,
        )

    def extend(self, key: RecordKey, ctx: WriteContext, token_text: str, lock_seconds: int) -> LockOutcome:
        token = self._check_token(key, token_text)

        def build(current: Head, now: datetime) -> dict[str, Any]:
            new = self._next_head(key, ctx, current, Status.PROCESSING, now)
            new["LockId"] = current.entity["LockId"]
            new["LockedAt"] = current.entity["LockedAt"]
            new["LockedUntil"] = now + timedelta(seconds=lock_seconds)
            new["Substatus"] = "LockExtended"
            return new

        head = self._fenced(key, ctx, token, build)
        self.expiry.untrack(token.lock_id)
        return self._acquired(key, head, token.lock_id)

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
            token = self._check_token(key, token_text)
            head = self._fenced(key, ctx, token, build, concludes=status, digest=digest)
            self.expiry.untrack(token.lock_id)
        else:
            head = self._unfenced(key, build, require_processing=require_processing)
        if ctx.retention_seconds and status in (Status.PROCESSED, Status.SKIPPED, Status.FAILED):
            updated = head.entity["UpdatedAt"]
            self.expiry.track(
                RETENTION_KIND,
                updated + timedelta(seconds=ctx.retention_seconds),
                retention_ident(head.entity["PartitionKey"], head.entity["RowKey"], head.version),
                head.entity["PartitionKey"],
                head.entity["RowKey"],
                head.version,
            )
        return head

    def _unfenced(self, key: RecordKey, build: Any, *, require_processing: bool) -> Head:
        current = self.read_head(key)
        for _ in range(_MAX_ATTEMPTS):
            if require_processing and (current is None or current.status is not Status.PROCESSING):
                state = "no record" if current is None else f"the record is {current.status.label}"
                raise Conflict(f"There is no lock to release: {state}.", field="key")
            try:
                head = self._write(current, build(current, utcnow()))
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                current = self.read_head(key)
                continue
            if current is not None and current.entity.get("LockId") and current.status is Status.PROCESSING:
                self.expiry.untrack(str(current.entity["LockId"]))
            return head
        raise Conflict("The record changed on every attempt to write it; retry.", field="key")

    # -- fencing -------------------------------------------------------------------------------------
    def _check_token(self, key: RecordKey, token_text: str) -> LockToken:
        check_key_size(key)
        token = LockToken.decode(token_text)
        if token.key_digest != key_digest(key):
            raise LockLost("The lock token belongs to another record.", field="lockToken")
        return token

    def _fenced(
        self,
        key: RecordKey,
        ctx: WriteContext,
        token: LockToken,
        build: Any,
        *,
        concludes: Status | None = None,
        digest: str | None = None,
    ) -> Head:
        """Write while holding the lock: one transaction from the token, re-reading only if needed.

        ``concludes``: the outcome this write records (it ends the lock); ``digest``: a digest of the
        request. The new head remembers both, so the retry of a write that was applied but whose answer
        was lost gets the record back instead of a false "lock lost"; a different request is refused.
        """
        now = utcnow()
        current: Head | None = None
        if token.locked_until > now:
            current = Head(self._entity_from_token(key, ctx, token), token.etag)
        for _ in range(_MAX_ATTEMPTS):
            if current is None:
                head = self.read_head(key)
                if (
                    concludes is not None
                    and head is not None
                    and head.entity.get("ClosedLockId") == token.lock_id
                ):
                    if head.status is concludes and head.entity.get("ClosedDigest") == digest:
                        return head  # this very write was already applied
                    raise LockLost(
                        f"This lock already ended with {head.status.label} (another request). "
                        "Nothing was written.",
                        field="lockToken",
                    )
                current = self._holder_head(head, token, utcnow())
            new = build(current, utcnow())
            if concludes is not None:
                new["ClosedLockId"] = token.lock_id
                if digest is not None:
                    new["ClosedDigest"] = digest
            try:
                return self._write(current, new)
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                current = None
        raise Conflict("The record changed on every attempt to write it; retry.", field="key")

    def _holder_head(self, head: Head | None, token: LockToken, now: datetime) -> Head:
        """Make sure ``token`` still holds the lock of ``head``; raise 409 otherwise."""
        if head is None or head.entity.get("LockId") != token.lock_id or head.status is not Status.PROCESSING:
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

    def _entity_from_token(self, key: RecordKey, ctx: WriteContext, token: LockToken) -> dict[str, Any]:
        """The Processing version the token was issued for (what its history row must record)."""
        entity = self._base_entity(key, ctx, Status.PROCESSING)
        entity.update(
            Version=token.version,
            LockId=token.lock_id,
            LockedAt=token.locked_at,
            LockedUntil=token.locked_until,
            CreatedAt=token.created_at,
            UpdatedAt=token.locked_at,
            DataChunks=0,
        )
        if token.note:
            entity["Substatus"] = token.note
        return entity

    # -- building rows ---------------------------------------------------------------------------------
    def _base_entity(self, key: RecordKey, ctx: WriteContext, status: Status) -> dict[str, Any]:
        entity: dict[str, Any] = {
            "PartitionKey": partition_key(key.tenant_id, key.scope, key.entity_id),
            "RowKey": head_row_key(key),
            "TenantId": key.tenant_id,
            "ScopeId": int(key.scope),
            "EntityId": key.entity_id,
            "ItemEntityKey": escape(key.item_entity_key),
            "Status": int(status),
            "HandlerKey": ctx.handler_key,
        }
        execution = (
            key.entity_execution_id if key.entity_execution_id is not None else ctx.entity_execution_id
        )
        if execution is not None:
            entity["EntityExecutionId"] = execution
        if ctx.source_app_id is not None:
            entity["SourceAppId"] = ctx.source_app_id
        if ctx.retention_seconds:
            entity["RetentionSeconds"] = ctx.retention_seconds
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
        return entity

    def _next_head(
        self, key: RecordKey, ctx: WriteContext, current: Head, status: Status, now: datetime
    ) -> dict[str, Any]:
        return self._new_head(
            key,
            ctx,
            status,
            now,
            version=current.version + 1,
            created_at=current.entity.get("CreatedAt", now),
        )

    def read_head_at(self, pk: str, rk: str) -> Head | None:
        """Point-read a head by its Table keys (catch-up knows rows, not request keys)."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            entity = self.table.get_entity(pk, rk)
        except ResourceNotFoundError:
            return None
        return Head(dict(entity), entity.metadata["etag"])

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
        )
        if status is Status.EXPIRED:
            new.update(envelope.data_properties(current.entity))
        else:
            new["DataChunks"] = 0
        if error is not None:
            new["Error"] = error
        return self._write(current, new)

    def _write(self, current: Head | None, new: dict[str, Any]) -> Head:
        """Insert the first version, or replace ``current`` (If-Match) and append its history row."""
        from azure.core import MatchConditions
        from azure.data.tables import UpdateMode

        pk, rk = new["PartitionKey"], new["RowKey"]
        if current is None:
            meta = self.table.create_entity(new)
            head = Head(new, meta["etag"])
        else:
            history = dict(current.entity)
            history.update(
                RowKey=history_row_key_of(rk, current.version),
                Status=int(Status.SUPERSEDED),
                RecordedStatus=int(current.status),
                SupersededAt=new["UpdatedAt"],
                SupersededByVersion=new["Version"],
            )
            ops: list[Any] = [
                (
                    "update",
                    new,
                    {
                        "mode": UpdateMode.REPLACE,
                        "etag": current.etag,
                        "match_condition": MatchConditions.IfNotModified,
                    },
                ),
                ("create", history),
            ]
            try:
                results = self.table.submit_transaction(ops)
            except Exception:
                self._hints.forget(pk, rk)
                raise
            head = Head(new, results[0]["etag"])
        self._hints.put(pk, rk, head)
        return head


def _same_request(current: Head, request_id: str, now: datetime) -> bool:
    """Is ``current`` the still-valid lock that a lock call with ``request_id`` took?"""
    until = current.locked_until
    return (
        current.status is Status.PROCESSING
        and current.entity.get("LockRequestId") == request_id
        and until is not None
        and until > now
    )


def _lock_fields(entity: dict[str, Any], now: datetime, lock_seconds: int) -> str:
    lock_id = uuid.uuid4().hex
    entity.update(LockId=lock_id, LockedAt=now, LockedUntil=now + timedelta(seconds=lock_seconds))
    return lock_id
