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
* which rows one write changes together: :func:`plan_write` (head, history row, retention index rows, the
  markers, a lock's entry in its minute's marker: :func:`lock_entry`), and
  what a refusal of one of its index operations means (:class:`WritePlan`);
* after a write whose answer was lost, was it applied: :func:`settled`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from common.clock import epoch_ms, from_epoch_ms, iso, to_ms
from common.errors import Conflict, LockLost, PayloadTooLarge
from common.limits import MAX_ENTITY_BYTES, entity_size
from common.transactions import Operation, Refusal, delete, insert, merge
from common.transactions import replace as replace_entity
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
from state.rows import LOCK_INDEX_KEY, RETAIN_INDEX_KEY, IndexRow, LockEntry, StateRow
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
# Every write sets a new Version and UpdatedAt (and a lock its own LockId): these tell versions apart.
_WRITTEN = ("version", "status", "updated_at", "lock_id", "locked_until", "closed_lock_id", "closed_digest")


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
    """A record's head row as read or written, with its ETag."""

    row: StateRow
    etag: str

    @classmethod
    def read(cls, entity: Mapping[str, Any], etag: str) -> Head:
        """The head a Table entity holds (as storage answered it)."""
        return cls(StateRow.from_entity(entity), etag)

    @property
    def entity(self) -> dict[str, Any]:
        """The head as a Table entity (what is written; a reader that sizes or copies the row)."""
        return self.row.to_entity()

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
def head_columns(key: RecordKey, partition: str, status: Status, handler_key: str) -> StateRow:
    """The columns every head starts with: its keys, the record's key fields, its status and handler."""
    return StateRow(
        partition_key=partition,
        row_key=head_row_key(key),
        tenant_id=key.tenant_id,
        scope_id=int(key.scope),
        entity_id=key.entity_id,
        item_entity_key=escape(key.item_entity_key),
        status=status,
        handler_key=handler_key,
        retain_until=NEVER,
    )


def new_head(
    key: RecordKey,
    ctx: WriteContext,
    status: Status,
    now: datetime,
    *,
    partition: str,
    version: int = 1,
    created_at: datetime | None = None,
) -> StateRow:
    """A head in ``status`` written at ``now`` (the first version unless ``version`` says otherwise)."""
    execution = key.entity_execution_id if key.entity_execution_id is not None else ctx.entity_execution_id
    row = replace(
        head_columns(key, partition, status, ctx.handler_key),
        entity_execution_id=execution,
        source_app_id=ctx.source_app_id,
        retention_seconds=ctx.retention_seconds or None,
        version=version,
        created_at=created_at or now,
        updated_at=now,
        data_chunks=0,
    )
    if ctx.retention_seconds and status in FINISHED:
        row = retain(row, now + timedelta(seconds=ctx.retention_seconds))
    return row


def next_head(
    key: RecordKey, ctx: WriteContext, current: Head | None, status: Status, now: datetime, *, partition: str
) -> StateRow:
    """The version after ``current`` (or the first one), in ``status``; a record stays in its partition."""
    if current is None:
        return new_head(key, ctx, status, now, partition=partition)
    return new_head(
        key,
        ctx,
        status,
        now,
        partition=current.row.partition_key,
        version=current.version + 1,
        created_at=current.row.created_at or now,
    )


def lock_fields(row: StateRow, lock_id: str, locked_at: datetime, until: datetime) -> StateRow:
    """``row`` as a Processing head's lock, with the index row that catch-up finds it by."""
    until = to_ms(until)
    return replace(
        row,
        lock_id=lock_id,
        locked_at=locked_at,
        locked_until=until,
        lock_index_key=index_row_key(LOCK_KIND, epoch_ms(until), lock_id),
    )


def retain(row: StateRow, until: datetime) -> StateRow:
    """``row`` with a finished head's retention deadline, and the index row that catch-up expires it by."""
    until = to_ms(until)
    return replace(
        row,
        retain_until=until,
        retain_index_key=index_row_key(RETENTION_KIND, epoch_ms(until), uuid.uuid4().hex),
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
) -> StateRow:
    """The head an outcome (set, upsert, release) writes after ``current``."""
    new = next_head(key, ctx, current, status, now, partition=partition)
    if envelope_props:
        new = new.with_data(envelope_props)
    if substatus is not None:
        new = replace(new, substatus=substatus)
    if error is not None:
        new = replace(new, error=error)
    return new


def extended(current: Head, now: datetime, lock_seconds: int) -> StateRow:
    """The same version with its lock moved to ``now + lock_seconds`` (same lock id, substatus, note)."""
    row = current.row
    assert row.lock_id is not None and row.locked_at is not None
    return lock_fields(
        replace(row, updated_at=now), row.lock_id, row.locked_at, now + timedelta(seconds=lock_seconds)
    )


def concluded(current: Head, status: Status, *, substatus: str, error: str | None, now: datetime) -> StateRow:
    """Catch-up's successor of ``current``: a lock that expired (Failed) or a retention that ran out
    (Expired, its data kept so the record can still be read). It inherits the record's identity, its
    handler and retention, nothing of the version it replaces."""
    was = current.row
    new = StateRow(
        partition_key=was.partition_key,
        row_key=was.row_key,
        tenant_id=was.tenant_id,
        scope_id=was.scope_id,
        entity_id=was.entity_id,
        item_entity_key=was.item_entity_key,
        entity_execution_id=was.entity_execution_id,
        source_app_id=was.source_app_id,
        handler_key=was.handler_key,
        retention_seconds=was.retention_seconds,
        status=status,
        version=current.version + 1,
        created_at=was.created_at or now,
        updated_at=now,
        substatus=substatus,
        retain_until=NEVER,
        error=error,
    )
    if status is Status.EXPIRED:
        return new.with_data(envelope.data_properties(current.entity))
    new = replace(new, data_chunks=0)
    if was.retention_seconds is not None and status in FINISHED:
        new = retain(new, now + timedelta(seconds=was.retention_seconds))
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

    new: StateRow | None = None
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
    new = lock_fields(new, lock_id or uuid.uuid4().hex, now, now + timedelta(seconds=request.lock_seconds))
    if request.request_id is not None:
        new = replace(new, lock_request_id=request.request_id)
    if takeover and current is not None:
        new = taken_over(new, current)
    return LockPlan(new=new, takeover=takeover)


def taken_over(new: StateRow, current: Head) -> StateRow:
    """``new``, a lock that replaces the expired one ``current`` holds, saying so."""
    previous = current.locked_until
    at = iso(previous) if previous is not None else "an unknown time"
    note = f"Took over lock {current.row.lock_id} that expired at {at}."
    return replace(new, substatus=LOCK_TAKEN_OVER, note=note)


def same_request(current: Head, request_id: str, now: datetime) -> bool:
    """Is ``current`` the still-valid lock that a lock call with ``request_id`` took?"""
    until = current.locked_until
    return (
        current.status is Status.PROCESSING
        and current.row.lock_request_id == request_id
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
    if head is None or head.row.lock_id != claims.lock_id or head.status is not Status.PROCESSING:
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


def closes(new: StateRow, claims: LockClaims, digest: str | None) -> StateRow:
    """A write that records an outcome ends the token's lock: the head remembers which lock, and the
    request's digest, so the same request asked again is recognised (:func:`conclusion_replayed`)."""
    closed_digest = digest if digest is not None else new.closed_digest
    return replace(new, closed_lock_id=claims.lock_id, closed_digest=closed_digest)


def closed_by(head: Head, claims: LockClaims) -> bool:
    return head.row.closed_lock_id == claims.lock_id


def conclusion_replayed(done: Head, concludes: Status, digest: str | None) -> bool:
    """``done`` ended the token's lock: True when it is this very request's outcome (answer it again);
    another request's ends in :class:`LockLost`."""
    if done.status is concludes and done.row.closed_digest == digest:
        return True
    raise LockLost(
        f"This lock already ended with {done.status.label} (another request). Nothing was written.",
        field="lockToken",
    )


def as_written(row: StateRow, claims: LockClaims, head_row: str) -> Head | None:
    """The version a history ``row`` was written as, if it is the one that ended the token's lock."""
    if row.closed_lock_id != claims.lock_id or row.recorded_status is None:
        return None
    head = replace(
        row,
        row_key=head_row,
        status=row.recorded_status,
        recorded_status=None,
        superseded_at=None,
        superseded_by_version=None,
    )
    return Head(head, "")


# -- tokens --------------------------------------------------------------------------------------------
def claims_of(key: RecordKey, head: Head) -> LockClaims:
    """The token claims of a Processing head: everything needed to rebuild it (see :func:`row_of`)."""
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


def row_of(key: RecordKey, claims: LockClaims, partition: str) -> StateRow:
    """The Processing head a token was issued for, column for column (its history row copies it)."""
    row = replace(
        head_columns(key, partition, Status.PROCESSING, claims.handler_key),
        version=claims.version,
        created_at=from_epoch_ms(claims.created_at_ms),
        updated_at=from_epoch_ms(claims.updated_at_ms),
        data_chunks=0,
        entity_execution_id=claims.entity_execution_id,
        source_app_id=claims.source_app_id,
        substatus=claims.substatus,
        note=claims.note,
        retention_seconds=claims.retention_seconds,
        lock_request_id=claims.request_id,
    )
    return lock_fields(
        row, claims.lock_id, from_epoch_ms(claims.locked_at_ms), from_epoch_ms(claims.locked_until_ms)
    )


# -- one write: the rows that change together ----------------------------------------------------------
def check_size(new: StateRow) -> None:
    size = entity_size(new.to_entity())
    if size > MAX_ENTITY_BYTES:
        raise PayloadTooLarge(
            f"The record would take {size} bytes in Table Storage; the limit is "
            f"{MAX_ENTITY_BYTES} bytes per row. Send less data.",
            field="data",
            limitBytes=MAX_ENTITY_BYTES,
        )


def index_changes(current: Head | None, new: StateRow) -> tuple[list[str], list[str]]:
    """The expiry-index rows a write deletes (``current`` names them, ``new`` does not) and inserts: the
    retention rows. A lock has no row (ADR-0021): its entry rides in its minute's marker
    (:func:`lock_entry`), and an outcome deletes nothing; a row an earlier version of Settle wrote for a
    lock is left to catch-up, which drops it as stale once the head no longer names it."""
    old = _retention_keys(current.index_keys()) if current is not None else {}
    fresh = _retention_keys(Head(new, "").index_keys())
    deletes = [row for c, row in old.items() if fresh.get(c) != row]
    inserts = [row for c, row in fresh.items() if old.get(c) != row]
    return deletes, inserts


def _retention_keys(keys: dict[str, str]) -> dict[str, str]:
    return {c: key for c, key in keys.items() if INDEX_COLUMNS[c] != LOCK_KIND}


def lock_entry(current: Head | None, new: StateRow) -> LockEntry | None:
    """The entry a write adds to its lock minute's marker (ADR-0021): a lock taken, taken over or moved
    (an extension: the new minute's marker names it; the old entry is skipped when its minute is visited,
    the head naming a later one). None when ``new`` holds no lock, or the lock ``current`` already had."""
    key = new.lock_index_key
    if not key or new.lock_id is None or new.locked_until is None:
        return None
    if current is not None and current.row.lock_index_key == key:
        return None
    return LockEntry(new.lock_id, epoch_ms(new.locked_until), new.row_key)


def history_row(current: Head, new: StateRow) -> StateRow:
    """``current`` as the history row ``new`` supersedes it with (its own status kept as recorded; the
    index rows stay the head's)."""
    return replace(
        current.row,
        lock_index_key=None,
        retain_index_key=None,
        row_key=history_row_key_of(new.row_key, current.version),
        status=Status.SUPERSEDED,
        recorded_status=current.status,
        superseded_at=new.updated_at,
        superseded_by_version=new.version,
    )


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
    new: StateRow,
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
    pk, rk = new.partition_key, new.row_key
    ops: list[Operation] = []
    if current is None:
        ops.append(insert(new.to_entity()))
    else:
        ops.append(replace_entity(new.to_entity(), current.etag))
        if keep_history:
            ops.append(insert(history_row(current, new).to_entity()))
    ops += [delete(pk, row) for row in deleting]
    ops += [insert(IndexRow(pk, row, rk).to_entity()) for row in inserts]
    ops += [merge(m) for m in markers]
    return WritePlan(ops=ops, deleting=list(deleting), inserting=list(inserts), markers=list(markers))


# -- a write whose answer was lost ---------------------------------------------------------------------
Settled = Literal["applied", "not-applied", "changed"]


def settled(read: Head | None, current: Head | None, new: StateRow) -> Settled:
    """Read back after a write whose answer was lost: ``applied`` when the head is the version ``new``
    describes; ``not-applied`` when it is still ``current`` (compared by ETag, so an extension, which keeps
    its Version, is told apart from the head it replaces); else ``changed`` (another writer's version)."""
    if read is not None and is_version(read.row, new):
        return "applied"
    if (read is None and current is None) or (
        read is not None and current is not None and read.etag == current.etag
    ):
        return "not-applied"
    return "changed"


def is_version(row: StateRow, new: StateRow) -> bool:
    """Is ``row`` (read back) the version ``new`` describes?"""
    return all(
        _same_value(getattr(row, name), getattr(new, name))
        for name in _WRITTEN
        if getattr(new, name) is not None or getattr(row, name) is not None
    )


def _same_value(read: Any, written: Any) -> bool:
    if isinstance(read, datetime) and isinstance(written, datetime):
        return epoch_ms(read) == epoch_ms(written)
    return bool(getattr(read, "value", read) == getattr(written, "value", written))
