"""A record head's life as pure decisions: no I/O, no storage client.

Given the head as last read (or None), a request and the time, each function here says what happens: the
answer to give, or the head to write and the operations of the one transaction that writes it (built with
``common/transactions.py``). :class:`~state.store.StateStore` only reads, asks here, submits, and on a
refusal reads again and asks again. The rules, one function each:

* may a lock be taken, and what does it write: :func:`decide_lock` (the status rule itself is
  :func:`state.model.lock_decision`; a takeover is :func:`taken_over`);
* may a release be sent at all: :func:`check_release`;
* does a token still hold the lock it names: :func:`check_holder`; was its conclusion already written:
  :func:`conclusion_replayed`;
* the next version of a head for an outcome (:func:`recorded`), an extension (:func:`extended`) and
  catch-up's conclusions (:func:`concluded`);
* which rows one write changes together: :func:`plan_write` (head, history row, expiry-index rows), and
  what a refusal of one of its index operations means (:class:`WritePlan`);
* after a write whose answer was lost, was it applied: :func:`settled`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, Literal

from common.clock import epoch_ms, from_epoch_ms, iso, to_ms
from common.errors import Conflict, LockLost, PayloadTooLarge
from common.limits import MAX_ENTITY_BYTES, entity_size, int64, plain_int
from common.transactions import Operation, Refusal, delete, insert, merge, replace
from state import envelope
from state.keys import (
    LOCK_KIND,
    RETENTION_KIND,
    escape,
    head_row_key,
    history_row_key_of,
    index_row_key,
)
from state.model import LockDecision, RecordKey, Status, lock_decision
from state.rows import LOCK_INDEX_KEY, RETAIN_INDEX_KEY, IndexRow, StateRow
from state.schemas import PreviousAttempt
from state.token import LockClaims, key_digest

# A finished record with no retention is kept for ever; ``RetainUntil`` still holds a date so that query
# can filter on the effective status (a filter on a missing property never matches).
NEVER = datetime(9999, 12, 31, tzinfo=UTC)
FINISHED = frozenset({Status.PROCESSED, Status.SKIPPED, Status.FAILED})
# Head columns naming the head's own index rows (deleted by the transaction that replaces the head).
INDEX_COLUMNS = {LOCK_INDEX_KEY: LOCK_KIND, RETAIN_INDEX_KEY: RETENTION_KIND}
# The substatus catch-up gives a lock that expired before its holder recorded an outcome.
LOCK_EXPIRED = "LockExpired"
LOCK_TAKEN_OVER = "LockTakenOver"
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
# Every write sets a new Version and UpdatedAt (and a lock its own LockId): these tell versions apart.
_WRITTEN_COLUMNS = ("Version", "Status", "UpdatedAt", "LockId", "LockedUntil", "ClosedLockId", "ClosedDigest")


# -- what a head says ----------------------------------------------------------------------------------
def retain_until(row: StateRow) -> datetime:
    return row.retain_until if row.retain_until is not None else NEVER


def retention_expired(row: StateRow, now: datetime) -> bool:
    """A finished record past its handler's retention window counts as Expired (may be redone)."""
    return row.status in FINISHED and retain_until(row) <= now


def effective_status(row: StateRow, now: datetime) -> Status:
    if retention_expired(row, now):
        return Status.EXPIRED
    assert row.status is not None
    return row.status


@dataclass(frozen=True)
class Head:
    """A record's head row as read or written, with its ETag. ``row`` is the same row typed."""

    entity: dict[str, Any]
    etag: str

    @cached_property
    def row(self) -> StateRow:
        return StateRow.from_entity(self.entity)

    @property
    def status(self) -> Status:
        assert self.row.status is not None
        return self.row.status

    @property
    def version(self) -> int:
        assert self.row.version is not None
        return self.row.version

    @property
    def locked_until(self) -> datetime | None:
        return self.row.locked_until

    def retention_expired(self, now: datetime) -> bool:
        return retention_expired(self.row, now)

    def index_keys(self) -> dict[str, str]:
        """The index rows this head owns, by column."""
        keys = {LOCK_INDEX_KEY: self.row.lock_index_key, RETAIN_INDEX_KEY: self.row.retain_index_key}
        return {c: key for c, key in keys.items() if key}


@dataclass(frozen=True)
class WriteContext:
    """Who writes, and the handler options that shape the record."""

    handler_key: str = "built-in"
    source_app_id: int | None = None
    entity_execution_id: int | None = None
    retention_seconds: int | None = None


def previous_attempt(row: StateRow) -> PreviousAttempt:
    """The attempt a head (or, by its ``RecordedStatus``, a history row) stands for. Its lock expired
    when it is still Processing (taken over now) or catch-up concluded it ``LockExpired``: the holder
    may have done part of the work."""
    status = row.recorded_status or row.status
    assert status is not None and row.version is not None
    expired = status is Status.PROCESSING or (status is Status.FAILED and row.substatus == LOCK_EXPIRED)
    return PreviousAttempt(status=status.label, error=row.error, lock_expired=expired, version=row.version)


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


# -- building heads ------------------------------------------------------------------------------------
def head_columns(key: RecordKey, partition: str, status: Status, handler_key: str) -> dict[str, Any]:
    """The columns every head starts with: its keys, the record's key fields, its status and handler."""
    return {
        "PartitionKey": partition,
        "RowKey": head_row_key(key),
        "TenantId": key.tenant_id,
        "ScopeId": int(key.scope),
        "EntityId": key.entity_id,
        "ItemEntityKey": escape(key.item_entity_key),
        "Status": int(status),
        "HandlerKey": handler_key,
        "RetainUntil": NEVER,
    }


def new_head(
    key: RecordKey,
    ctx: WriteContext,
    status: Status,
    now: datetime,
    *,
    partition: str,
    version: int = 1,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """A head in ``status`` written at ``now`` (the first version unless ``version`` says otherwise)."""
    entity = head_columns(key, partition, status, ctx.handler_key)
    execution = key.entity_execution_id if key.entity_execution_id is not None else ctx.entity_execution_id
    if execution is not None:
        entity["EntityExecutionId"] = execution
    if ctx.source_app_id is not None:
        entity["SourceAppId"] = ctx.source_app_id
    if ctx.retention_seconds:
        entity["RetentionSeconds"] = int64(ctx.retention_seconds)
    entity.update(Version=version, CreatedAt=created_at or now, UpdatedAt=now, DataChunks=0)
    if ctx.retention_seconds and status in FINISHED:
        retain(entity, now + timedelta(seconds=ctx.retention_seconds))
    return entity


def next_head(
    key: RecordKey, ctx: WriteContext, current: Head | None, status: Status, now: datetime, *, partition: str
) -> dict[str, Any]:
    """The version after ``current`` (or the first one), in ``status``; a record stays in its partition."""
    if current is None:
        return new_head(key, ctx, status, now, partition=partition)
    return new_head(
        key,
        ctx,
        status,
        now,
        partition=str(current.entity["PartitionKey"]),
        version=current.version + 1,
        created_at=current.entity.get("CreatedAt", now),
    )


def lock_fields(entity: dict[str, Any], lock_id: str, locked_at: datetime, until: datetime) -> None:
    """A Processing head's lock, and the index row that catch-up finds it by."""
    until = to_ms(until)
    entity.update(
        LockId=lock_id,
        LockedAt=locked_at,
        LockedUntil=until,
        LockIndexKey=index_row_key(LOCK_KIND, epoch_ms(until), lock_id),
    )


def retain(entity: dict[str, Any], until: datetime) -> None:
    """A finished head's retention deadline, and the index row that catch-up expires it by."""
    until = to_ms(until)
    entity.update(
        RetainUntil=until, RetainIndexKey=index_row_key(RETENTION_KIND, epoch_ms(until), uuid.uuid4().hex)
    )


def recorded(
    key: RecordKey,
    ctx: WriteContext,
    current: Head | None,
    now: datetime,
    *,
    partition: str,
    status: Status,
    envelope_props: dict[str, Any] | None,
    substatus: str | None,
    error: str | None,
) -> dict[str, Any]:
    """The head an outcome (set, upsert, release) writes after ``current``."""
    new = next_head(key, ctx, current, status, now, partition=partition)
    if envelope_props:
        new.update(envelope_props)
    if substatus is not None:
        new["Substatus"] = substatus
    if error is not None:
        new["Error"] = error
    return new


def extended(current: Head, now: datetime, lock_seconds: int) -> dict[str, Any]:
    """The same version with its lock moved to ``now + lock_seconds`` (same lock id, substatus, note)."""
    new = dict(current.entity)
    new["UpdatedAt"] = now
    lock_fields(new, str(new["LockId"]), new["LockedAt"], now + timedelta(seconds=lock_seconds))
    return new


def concluded(
    current: Head, status: Status, *, substatus: str, error: str | None, now: datetime
) -> dict[str, Any]:
    """Catch-up's successor of ``current``: a lock that expired (Failed) or a retention that ran out
    (Expired, its data kept so the record can still be read)."""
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
            retain(new, now + timedelta(seconds=plain_int(retention)))
    if error is not None:
        new["Error"] = error
    return new


# -- lock ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LockOrder:
    """A lock call as the rule sees it: which record, who asks, for how long, and the caller's optional
    request id (the same id while its lock holds gets that lock back)."""

    key: RecordKey
    ctx: WriteContext
    lock_seconds: int
    request_id: str | None = None


@dataclass(frozen=True)
class LockPlan:
    """What a lock call does with the head it read: write ``new`` (taking the lock, ``takeover`` when it
    replaces an expired one), answer ``refused``, or ``replay``: hand back the lock ``current`` holds (the
    same request asked again)."""

    new: dict[str, Any] | None = None
    takeover: bool = False
    refused: LockOutcome | None = None
    replay: bool = False


def may_lock(current: Head, judged: datetime) -> bool:
    """Would a lock be taken from ``current``, its expiries judged at ``judged``?"""
    return _judged(current, judged).acquire


def _judged(current: Head, judged: datetime) -> LockDecision:
    """``state.model.lock_decision`` on a head: its status, its lock's and its retention's expiry."""
    return lock_decision(
        current.status, current.locked_until, judged, retention_expired=current.retention_expired(judged)
    )


def decide_lock(
    current: Head | None,
    request: LockOrder,
    *,
    partition: str,
    now: datetime,
    judged: datetime,
    lock_id: str | None = None,
) -> LockPlan:
    """The lock rule. Another holder's expiry is judged at ``judged``, the earliest the storage clock may
    read (an uncertain clock waits, never steals); what is written is stamped ``now``."""
    takeover = False
    if current is not None:
        decision = _judged(current, judged)
        if not decision.acquire:
            if request.request_id is not None and same_request(current, request.request_id, now):
                return LockPlan(replay=True)
            held = current.locked_until if current.status is Status.PROCESSING else None
            refused = LockOutcome(
                acquired=False,
                status=effective_status(current.row, now),
                locked_until=held,
                reason=decision.reason,
            )
            return LockPlan(refused=refused)
        takeover = decision.takeover
    new = next_head(request.key, request.ctx, current, Status.PROCESSING, now, partition=partition)
    lock_fields(new, lock_id or uuid.uuid4().hex, now, now + timedelta(seconds=request.lock_seconds))
    if request.request_id is not None:
        new["LockRequestId"] = request.request_id
    if takeover and current is not None:
        new.update(taken_over(current))
    return LockPlan(new=new, takeover=takeover)


def taken_over(current: Head) -> dict[str, str]:
    """What a lock that replaces an expired one records about it."""
    previous = current.locked_until
    at = iso(previous) if previous is not None else "an unknown time"
    return {
        "Substatus": LOCK_TAKEN_OVER,
        "Note": f"Took over lock {current.entity.get('LockId')} that expired at {at}.",
    }


def same_request(current: Head, request_id: str, now: datetime) -> bool:
    """Is ``current`` the still-valid lock that a lock call with ``request_id`` took?"""
    until = current.locked_until
    return (
        current.status is Status.PROCESSING
        and current.entity.get("LockRequestId") == request_id
        and until is not None
        and until > now
    )


# -- release and fencing -------------------------------------------------------------------------------
def check_release(current: Head | None) -> None:
    """A release without a token needs a lock to release: a Processing head."""
    if current is None or current.status is not Status.PROCESSING:
        state = "no record" if current is None else f"the record is {current.status.label}"
        raise Conflict(f"There is no lock to release: {state}.", field="key")


def check_holder(head: Head | None, claims: LockClaims, now: datetime) -> Head:
    """The head, if the token's lock still holds it at ``now`` (the latest the storage clock may read);
    else :class:`LockLost` saying why."""
    if head is None or head.entity.get("LockId") != claims.lock_id or head.status is not Status.PROCESSING:
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


def closes(new: dict[str, Any], claims: LockClaims, digest: str | None) -> None:
    """A write that records an outcome ends the token's lock: the head remembers which lock, and the
    request's digest, so the same request asked again is recognised (:func:`conclusion_replayed`)."""
    new["ClosedLockId"] = claims.lock_id
    if digest is not None:
        new["ClosedDigest"] = digest


def closed_by(head: Head, claims: LockClaims) -> bool:
    return head.entity.get("ClosedLockId") == claims.lock_id


def conclusion_replayed(done: Head, concludes: Status, digest: str | None) -> bool:
    """``done`` ended the token's lock: True when it is this very request's outcome (answer it again);
    another request's ends in :class:`LockLost`."""
    if done.status is concludes and done.entity.get("ClosedDigest") == digest:
        return True
    raise LockLost(
        f"This lock already ended with {done.status.label} (another request). Nothing was written.",
        field="lockToken",
    )


def as_written(row: dict[str, Any], claims: LockClaims, head_row: str) -> Head | None:
    """The version a history ``row`` was written as, if it is the one that ended the token's lock."""
    if row.get("ClosedLockId") != claims.lock_id or row.get("RecordedStatus") is None:
        return None
    row = dict(row)
    row.update(RowKey=head_row, Status=int(row["RecordedStatus"]))
    for column in ("RecordedStatus", "SupersededAt", "SupersededByVersion"):
        row.pop(column, None)
    return Head(row, "")


# -- tokens --------------------------------------------------------------------------------------------
def claims_of(key: RecordKey, head: Head) -> LockClaims:
    """The token claims of a Processing head: everything needed to rebuild it (see :func:`entity_of`)."""
    row = head.row
    assert row.lock_id and row.locked_at and row.locked_until and row.updated_at and row.created_at
    assert row.handler_key is not None
    return LockClaims(
        lock_id=row.lock_id,
        key_digest=key_digest(key),
        version=head.version,
        etag=head.etag,
        locked_at_ms=epoch_ms(row.locked_at),
        locked_until_ms=epoch_ms(row.locked_until),
        updated_at_ms=epoch_ms(row.updated_at),
        created_at_ms=epoch_ms(row.created_at),
        handler_key=row.handler_key,
        source_app_id=row.source_app_id,
        entity_execution_id=row.entity_execution_id,
        retention_seconds=row.retention_seconds,
        substatus=row.substatus,
        note=row.note,
        request_id=row.lock_request_id,
    )


def entity_of(key: RecordKey, claims: LockClaims, partition: str) -> dict[str, Any]:
    """The Processing head a token was issued for, column for column (its history row copies it)."""
    entity = head_columns(key, partition, Status.PROCESSING, claims.handler_key)
    entity.update(
        Version=claims.version,
        CreatedAt=from_epoch_ms(claims.created_at_ms),
        UpdatedAt=from_epoch_ms(claims.updated_at_ms),
        DataChunks=0,
    )
    optional = {
        "EntityExecutionId": claims.entity_execution_id,
        "SourceAppId": claims.source_app_id,
        "Substatus": claims.substatus,
        "Note": claims.note,
    }
    entity.update({k: v for k, v in optional.items() if v is not None})
    if claims.retention_seconds is not None:
        entity["RetentionSeconds"] = int64(claims.retention_seconds)
    if claims.request_id is not None:
        entity["LockRequestId"] = claims.request_id
    lock_fields(
        entity, claims.lock_id, from_epoch_ms(claims.locked_at_ms), from_epoch_ms(claims.locked_until_ms)
    )
    return entity


# -- one write: the rows that change together ----------------------------------------------------------
def check_size(new: dict[str, Any]) -> None:
    size = entity_size(new)
    if size > MAX_ENTITY_BYTES:
        raise PayloadTooLarge(
            f"The record would take {size} bytes in Table Storage; the limit is "
            f"{MAX_ENTITY_BYTES} bytes per row. Send less data.",
            field="data",
            limitBytes=MAX_ENTITY_BYTES,
        )


def index_changes(current: Head | None, new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The expiry-index rows a write deletes (``current`` names them, ``new`` does not) and inserts."""
    old = current.index_keys() if current is not None else {}
    fresh = {c: str(new[c]) for c in INDEX_COLUMNS if new.get(c)}
    deletes = [row for c, row in old.items() if fresh.get(c) != row]
    inserts = [row for c, row in fresh.items() if old.get(c) != row]
    return deletes, inserts


def history_row(current: Head, new: dict[str, Any]) -> dict[str, Any]:
    """``current`` as the history row ``new`` supersedes it with (its own status kept as recorded)."""
    history = {k: v for k, v in current.entity.items() if k not in INDEX_COLUMNS}
    history.update(
        RowKey=history_row_key_of(str(new["RowKey"]), current.version),
        Status=int(Status.SUPERSEDED),
        RecordedStatus=int(current.status),
        SupersededAt=new["UpdatedAt"],
        SupersededByVersion=new["Version"],
    )
    return history


@dataclass(frozen=True)
class WritePlan:
    """The operations of one write, in order: the head (insert, or replace ``If-Match``), its history
    row, the index rows it deletes, the index rows it inserts, and the markers of their minutes."""

    ops: list[Operation]
    deleting: list[str]
    inserting: list[str]
    markers: list[dict[str, Any]]

    @property
    def single_insert(self) -> bool:
        """Only the first version's insert: sent as one insert, not a transaction."""
        return len(self.ops) == 1 and self.ops[0][0] == "create"

    def gone_marker(self, refused: Refusal) -> dict[str, Any] | None:
        """The marker a refused merge found gone (catch-up closed that minute: prepare it again)."""
        first = len(self.ops) - len(self.markers)
        return _missing_at(refused, first, self.markers)

    def gone_index_row(self, refused: Refusal) -> str | None:
        """The index row a refused delete found gone (removed already, under an older layout: skip it)."""
        first = len(self.ops) - len(self.markers) - len(self.inserting) - len(self.deleting)
        return _missing_at(refused, first, self.deleting)


def _missing_at[T](refused: Refusal, first: int, items: list[T]) -> T | None:
    """The item whose operation (from position ``first`` on) was refused for a missing row."""
    at = refused.index
    if refused.missing and at is not None and first <= at < first + len(items):
        return items[at - first]
    return None


def plan_write(
    current: Head | None,
    new: dict[str, Any],
    *,
    keep_history: bool,
    deleting: list[str],
    inserts: list[str],
    markers: list[dict[str, Any]],
) -> WritePlan:
    """One entity-group transaction: insert the first version or replace ``current`` (If-Match its ETag)
    and append its history row (``keep_history=False``: the same version rewritten, an extension); delete
    the index rows ``deleting`` (unconditionally: the head's If-Match proves they are current), insert
    ``inserts`` pointing at the head, and merge their minutes' ``markers`` (``If-Match: *``: a marker
    catch-up removed fails the write, so no index row lands in a closed minute)."""
    pk, rk = new["PartitionKey"], new["RowKey"]
    ops: list[Operation] = []
    if current is None:
        ops.append(insert(new))
    else:
        ops.append(replace(new, current.etag))
        if keep_history:
            ops.append(insert(history_row(current, new)))
    ops += [delete(pk, row) for row in deleting]
    ops += [insert(IndexRow(pk, row, rk).to_entity()) for row in inserts]
    ops += [merge(m) for m in markers]
    return WritePlan(ops=ops, deleting=list(deleting), inserting=list(inserts), markers=list(markers))


# -- a write whose answer was lost ---------------------------------------------------------------------
Settled = Literal["applied", "not-applied", "changed"]


def settled(read: Head | None, current: Head | None, new: dict[str, Any]) -> Settled:
    """Read back after a write whose answer was lost: ``applied`` when the head is the version ``new``
    describes; ``not-applied`` when it is still ``current`` (compared by ETag, so an extension, which keeps
    its Version, is told apart from the head it replaces); else ``changed`` (another writer's version)."""
    if read is not None and is_version(read.entity, new):
        return "applied"
    if (read is None and current is None) or (
        read is not None and current is not None and read.etag == current.etag
    ):
        return "not-applied"
    return "changed"


def is_version(entity: dict[str, Any], new: dict[str, Any]) -> bool:
    """Is ``entity`` (read back) the version ``new`` describes?"""
    return all(
        _same_value(entity.get(column), new.get(column))
        for column in _WRITTEN_COLUMNS
        if column in new or column in entity
    )


def _same_value(read: Any, written: Any) -> bool:
    if isinstance(read, datetime) and isinstance(written, datetime):
        return epoch_ms(read) == epoch_ms(written)
    return bool(getattr(read, "value", read) == getattr(written, "value", written))
