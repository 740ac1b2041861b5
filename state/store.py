"""The built-in handler: records on Table Storage (layout in ``state/keys.py``).

Every write is ETag-conditional (``If-Match``) or insert-only, and every change that writes several rows
of a record (the new head, the history row of the version it supersedes, the expiry-index rows the head
names, the marker that names its lock: ADR-0021) is one entity group transaction, so the head, its
history and its index can never disagree.

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

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

from common import telemetry
from common.beside import Beside
from common.clock import earliest_now, latest_now, to_ms, utcnow
from common.errors import (
    Conflict,
    LockLost,
    StorageTableMissing,
    is_refused_unreceived,
    is_transient_storage_fault,
)
from common.fence import Fence, is_claim, moved_to
from common.layouts import LayoutBook
from common.partition_meter import METER
from common.signing import Signer, load_signer
from common.table_options import RESEND_UNRECEIVED_ONLY
from common.table_protocol import TableSource
from common.tables import Tables
from common.transactions import missing_table, refusal
from state.accounts import RoutedTable, extra_accounts
from state.expiry import ExpiryIndex
from state.hints import HINT_BYTES, Hints
from state.keys import (
    EXPIRY_TABLE,
    LOCK_KIND,
    STATE_TABLE,
    Layout,
    bucket_of,
    check_key_size,
    head_row_key,
    history_row_key_of,
    parse_index_row_key,
    record_range,
)
from state.layout import RecordedLayouts
from state.lifecycle import (
    Head,
    LockOrder,
    LockOutcome,
    WriteContext,
    as_written,
    check_holder,
    check_release,
    check_size,
    claims_of,
    closed_by,
    closes,
    concluded,
    conclusion_replayed,
    decide_lock,
    extended,
    index_changes,
    lock_entry,
    may_lock,
    new_head,
    plan_write,
    previous_attempt,
    recorded,
    row_of,
    settled,
)
from state.model import RecordKey, Status
from state.rows import StateRow
from state.schemas import PreviousAttempt
from state.token import LockClaims, key_digest

# Writes of one call that meet another writer's change (then read again and re-decided) before giving up.
_MAX_ATTEMPTS = 4
# Sends of one head write: an index row or marker found gone, or an open answer read back as not applied,
# each cost one (as many as before the ServerBusy resends moved into the table clients' retry policy).
_WRITE_ATTEMPTS = 7


class StateStore:
    """Records of the built-in handler."""

    def __init__(
        self,
        tables: TableSource,
        *,
        hint_bytes: int = HINT_BYTES,
        layout: Layout | None = None,
        accounts: Sequence[TableSource] | None = None,
        layouts: LayoutBook | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._tables = tables
        # A fixed clock (a model test's) reads the same for now, earliest and latest; None: the host's.
        self._clock = clock
        # The state table's accounts: 0 is ``tables``; more from SETTLE_TABLES_{i} (ADR-0015).
        if accounts is None:
            accounts = [tables, *(Tables(s) for s in extra_accounts(tables.settings.prefix))]
        self._routed = RoutedTable(accounts) if len(accounts) > 1 else None
        # How a node definition's records spread over partitions (state/keys.py; docs/tables.md): the
        # layout recorded in storage (common/layouts.py), unless a fixed one is given (bench, tests).
        self._layouts = RecordedLayouts(layouts or LayoutBook(tables), len(accounts), fixed=layout)
        self.index = ExpiryIndex(tables, state_table=lambda: self.table)
        self._hints = Hints(max_bytes=hint_bytes)
        self._hinted: Layout | None = None  # the layout the hints were read under
        self._signer: Signer | None = None
        self._signer_lock = threading.Lock()

    @property
    def layout(self) -> Layout:
        """The layout records are created in and read from now (cached: no request per call). A hint never
        outlives the layout it was read under: a change of layout forgets them all."""
        layout = self._layouts.now()
        if layout is not self._hinted:
            self._hints.clear()
            self._hinted = layout
        return layout

    def fence_of(self, key: RecordKey) -> Fence | None:
        """What creating ``key``'s first version must fence (``common/fence.py``): None in a layout with no
        earlier partition for the key."""
        layout = self.layout
        earlier = layout.earlier_partitions(key)
        if not earlier:
            return None
        return Fence("state", layout.partition(key), tuple(earlier), layout.era, self._layouts.forget)

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

    def now(self) -> datetime:
        """Now by the storage clock, to the millisecond (every instant Settle stores has that precision)."""
        return to_ms(self._clock() if self._clock is not None else utcnow())

    def earliest(self) -> datetime:
        """The earliest the storage clock may read now (``common.clock.earliest_now``): what another
        holder's expiry is judged by (takeover, catch-up), so an uncertain clock waits, never steals."""
        return to_ms(self._clock() if self._clock is not None else earliest_now())

    def latest(self) -> datetime:
        """The latest the storage clock may read now: what a holder's own lock is judged by (the fence)."""
        return to_ms(self._clock() if self._clock is not None else latest_now())

    # -- reads -------------------------------------------------------------------------------------
    def read_head(self, key: RecordKey) -> Head | None:
        """The record's head wherever it lives: its partition now, else an earlier layout's. A claim
        (``common/fence.py``) is followed to the partition it names; claims are never heads."""
        check_key_size(key)
        layout = self.layout
        pk, rk = layout.partition(key), head_row_key(key)
        head = self._head_or_follow(pk, rk)
        if head is None:
            for earlier in layout.earlier_partitions(key):  # a record created under an earlier S
                head = self._head_or_follow(earlier, rk, skip={pk, *layout.earlier_partitions(key)})
                if head is not None:
                    break
        self._hints.put(pk, rk, head)
        return head

    def _head_or_follow(self, pk: str, rk: str, *, skip: set[str] | None = None) -> Head | None:
        """The head at (pk, rk), or where a claim there points (unless the caller reads it anyway)."""
        entity = self._row_at(pk, rk)
        if entity is None:
            return None
        if not is_claim(entity):
            return Head.read(entity, entity.metadata["etag"])
        target = moved_to(entity)
        if skip is not None and target in skip:
            return None
        return self.read_head_at(target, rk)

    def _row_at(self, pk: str, rk: str) -> Any:
        try:
            return self.table.get_entity(pk, rk)
        except ResourceNotFoundError:
            return None

    def read_head_at(self, pk: str, rk: str) -> Head | None:
        """Point-read a head by its Table keys (catch-up knows rows, not request keys); a claim is none."""
        entity = self._row_at(pk, rk)
        if entity is None or is_claim(entity):
            return None
        return Head.read(entity, entity.metadata["etag"])

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
                rows = [row for row in rows if not is_claim(row)]  # a claim: the record lives elsewhere
                if rows or token:  # a record lives in one layout: the first that has rows is it
                    return rows, token
            return [], None
        pk = self.layout.partition(key)
        if self.layout.earlier_partitions(key):  # a later page: continue where the record lives
            head = self.read_head(key)
            pk = head.row.partition_key if head is not None else pk
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
        """Take the lock (see ``lifecycle.decide_lock``). ``request_id``: a caller-chosen id; a call with the
        same id while that lock holds gets it back (``replayed``) instead of a refusal."""
        check_key_size(key)
        # A lock is only taken when its token can be issued. A process that has not read its signing key
        # yet reads it beside the lock's first requests (the preparation of its expiry minute), and the
        # lock's write waits for it (a cold instance's first lock); every answer waits for it.
        request = LockOrder(key, ctx, lock_seconds, request_id)
        if self._signer is not None:
            return self._lock(request, ready=_nothing)
        key_read = Beside(self.signer, name="settle-signing-key")
        try:
            outcome = self._lock(request, ready=key_read.result)
        except BaseException:
            key_read.wait()
            raise
        key_read.result()
        return outcome

    def _lock(self, request: LockOrder, *, ready: Callable[[], object]) -> LockOutcome:
        key = request.key
        pk, rk = self.layout.partition(key), head_row_key(key)
        known, current = self._hints.get(pk, rk)
        fence = self.fence_of(key)
        if not known and fence is not None:
            # Earlier layouts are listed: a key this instance does not know is read where it is created now
            # (one read; a key that is there costs nothing more), and fenced below only if it is not there.
            current = self._head_or_follow(pk, rk)
        elif known and current is not None and not may_lock(current, self.earliest()):
            current = self.read_head(key)  # refusals are always confirmed by storage
        for _ in range(_MAX_ATTEMPTS):
            if current is None and fence is not None:
                # A first version while earlier layouts are listed: fence the key in their partitions
                # (a record found in one is the key's record; decided on it instead of inserting a twin).
                found = fence.claim_earlier(self.table, rk)
                if found is not None:
                    current = Head.read(found, found.metadata["etag"])
            plan = decide_lock(current, request, partition=pk, now=self.now(), judged=self.earliest())
            if plan.new is None:
                assert current is not None  # a first version is always written
                telemetry.annotate({"settle.status_before": current.status.label})
                if plan.replay:
                    return self._acquired(key, current, replayed=True, previous=self._before(current))
                assert plan.refused is not None
                return plan.refused
            try:
                head = _noted(current, self._write(current, plan.new, ready=ready, fence=fence))
            except CreatedMeanwhile as created:
                current = created.head
                continue
            except Exception as exc:
                if refusal(exc) is None:
                    raise
                current = self.read_head(key)
                continue
            before = previous_attempt(current.row) if current is not None else None
            return self._acquired(key, head, takeover=plan.takeover, previous=before)
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
        if head.version <= 1:
            return None
        row = self._history_row(head, head.version - 1)
        return previous_attempt(StateRow.from_entity(row)) if row is not None else None

    def _history_row(self, head: Head, version: int) -> dict[str, Any] | None:
        pk, rk = head.row.partition_key, head.row.row_key
        try:
            return dict(self.table.get_entity(pk, history_row_key_of(rk, version)))
        except ResourceNotFoundError:
            return None

    def extend(self, key: RecordKey, ctx: WriteContext, token_text: str, lock_seconds: int) -> LockOutcome:
        """Move the lock's expiry. The head is rewritten in place (same version, lock id, substatus and
        note; ``UpdatedAt`` and ``LockedUntil`` move; If-Match its ETag, the new expiry minute's marker
        naming the lock in the same transaction, ADR-0021) and no history row is written: a lock held for
        hours leaves one history row, its start, when its outcome supersedes it. Fencing is unchanged: the
        lock id decides."""
        claims = self._check_token(key, token_text)

        def build(current: Head, now: datetime) -> StateRow:
            return extended(current, now, lock_seconds)

        return self._acquired(key, self._fenced(key, claims, build, in_place=True))

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

        def build(current: Head | None, now: datetime) -> StateRow:
            return recorded(
                key,
                ctx,
                current,
                now,
                partition=self.layout.partition(key),
                status=status,
                envelope_props=envelope_props,
                substatus=substatus,
                error=error,
            )

        if token_text is not None:
            claims = self._check_token(key, token_text)
            return self._fenced(key, claims, build, concludes=status, digest=digest)
        return self._unfenced(key, build, require_processing=require_processing)

    def _unfenced(self, key: RecordKey, build: Any, *, require_processing: bool) -> Head:
        fence = self.fence_of(key)
        if fence is None or require_processing:
            current = self.read_head(key)  # a release needs the lock wherever it is: never a creation
        else:
            # Earlier layouts are listed: the key is read where it is created now, and the fence below finds
            # a record of an earlier layout (the probes of read_head would only read them twice).
            current = self._head_or_follow(fence.home, head_row_key(key))
        for _ in range(_MAX_ATTEMPTS):
            if require_processing:
                check_release(current)
            if current is None and fence is not None:  # a first version: fenced as a lock's (above)
                found = fence.claim_earlier(self.table, head_row_key(key))
                if found is not None:
                    current = Head.read(found, found.metadata["etag"])
                    continue
            try:
                return _noted(current, self._write(current, build(current, self.now()), fence=fence))
            except CreatedMeanwhile as created:
                current = created.head
                continue
            except Exception as exc:
                if refusal(exc) is None:
                    raise
                current = self.read_head(key)
        raise Conflict("The record changed on every attempt to write it; retry.", field="key")

    def conclude(
        self, current: Head, status: Status, *, substatus: str, error: str | None, now: datetime
    ) -> Head:
        """Replace ``current`` by its successor in ``status`` (catch-up: lock expired, retention)."""
        return self._write(current, concluded(current, status, substatus=substatus, error=error, now=now))

    # -- fencing -------------------------------------------------------------------------------------
    def _check_token(self, key: RecordKey, token_text: str) -> LockClaims:
        check_key_size(key)
        claims = LockClaims.decode(token_text, self.signer())
        if claims.key_digest != key_digest(key):
            raise LockLost("The lock token belongs to another record.", field="lockToken")
        return claims

    def _fenced(
        self,
        key: RecordKey,
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
            current = Head(row_of(key, claims, self.layout.partition(key)), claims.etag)
        for _ in range(_MAX_ATTEMPTS):
            if current is None:
                head = self.read_head(key)
                if concludes is not None and head is not None:
                    done = self._concluded_by(head, claims)
                    if done is not None and conclusion_replayed(done, concludes, digest):
                        telemetry.current().set_outcome("replayed")
                        return done  # this very write was already applied
                current = check_holder(head, claims, self.latest())
            new = build(current, self.now())
            if concludes is not None:
                new = closes(new, claims, digest)
            try:
                return _noted(current, self._write(current, new, keep_history=not in_place))
            except Exception as exc:
                if refusal(exc) is None:
                    raise
                current = None
        raise Conflict("The record changed on every attempt to write it; retry.", field="key")

    def _concluded_by(self, head: Head, claims: LockClaims) -> Head | None:
        """The version that ended the token's lock, if one did: the head, or, when newer versions followed
        (another worker re-locked, retention expired, catch-up), a point read of the version the token's
        write created (``claims.version + 1``), as it was written (its recorded status, not Superseded)."""
        if closed_by(head, claims):
            return head
        if head.version <= claims.version + 1:
            return None
        row = self._history_row(head, claims.version + 1)
        return as_written(StateRow.from_entity(row), claims, head.row.row_key) if row is not None else None

    # -- the one write ---------------------------------------------------------------------------------
    def _write(
        self,
        current: Head | None,
        new: StateRow,
        *,
        keep_history: bool = True,
        ready: Callable[[], object] | None = None,
        fence: Fence | None = None,
    ) -> Head:
        """Insert the first version, or replace ``current`` (If-Match) and append its history row; in the
        same transaction delete the retention index rows ``current`` names and insert the ones ``new``
        names, and merge the markers: a lock's names it (``lifecycle.plan_write``, ``lock_entry``).
        ``keep_history=False``: ``new`` is the same version rewritten (an extension), no history row.
        ``ready``: waited for (what it raises is raised) after the index is
        prepared, before the write.

        The table clients send a write again only when storage refused it before receiving it (503
        ServerBusy: ``common.tables.SettleRetryPolicy``); an answer that leaves the outcome open is settled
        here by one read of the head."""
        check_size(new)
        pk, rk = new.partition_key, new.row_key
        deletes, inserts = index_changes(current, new)
        entry = lock_entry(current, new)
        read_back = False  # an answer that left the outcome open: the head is read back at most once
        for _ in range(_WRITE_ATTEMPTS):
            markers: list[dict[str, Any]] = []
            for row in inserts:
                kind, bucket, _ = parse_index_row_key(row)
                marker = self.index.marker(pk, kind, bucket)
                if marker not in markers:
                    markers.append(marker)
            if entry is not None:  # a lock's entry, in its minute's marker (ADR-0021): no index row
                markers.append(self.index.marker(pk, LOCK_KIND, bucket_of(entry.expiry_ms), (entry,)))
            plan = plan_write(
                current, new, keep_history=keep_history, deleting=deletes, inserts=inserts, markers=markers
            )
            if ready is not None:
                ready()
            try:
                if plan.single_insert:
                    etag = self.table.create_entity(plan.ops[0][1], **RESEND_UNRECEIVED_ONLY)["etag"]
                else:
                    etag = self.table.submit_transaction(plan.ops, **RESEND_UNRECEIVED_ONLY)[0]["etag"]
            except Exception as exc:
                if missing_table(exc):  # deleted by hand: storage cannot say what the record is (503)
                    raise StorageTableMissing(self._tables.settings.table_name(STATE_TABLE)) from exc
                refused = refusal(exc)
                if refused is not None:
                    gone_marker, gone_row = plan.gone_marker(refused), plan.gone_index_row(refused)
                    if gone_marker is not None:
                        self.index.forget(gone_marker)  # catch-up closed that minute: prepare again
                        continue
                    if gone_row is not None:
                        deletes = [row for row in deletes if row != gone_row]  # an older layout's: skip
                        continue
                    self._hints.forget(pk, rk)
                    first = current is None and refused.status == 409
                    if first and self._created_meanwhile(pk, rk, fence, exc):
                        continue  # an older layout's claim stood where the record goes: cleared
                    raise
                if is_refused_unreceived(exc):
                    raise  # storage stayed too busy to receive it (resent already): nothing was written
                self._hints.forget(pk, rk)
                if not is_transient_storage_fault(exc) or read_back:
                    raise
                # Applied or not? One point read says: our own version there (its Version, UpdatedAt and
                # lock are ours) is success; the head as it was means nothing was written, so ask once
                # more; anything else is another writer's change (a conflict: the caller re-decides).
                read_back = True
                found = self._read_back(pk, rk, current, new, exc)
                if found is None:
                    continue  # nothing was written: sent once more (a second open answer is raised)
                self._hints.put(pk, rk, found)
                return found
            head = Head(new, etag)
            self._hints.put(pk, rk, head)
            METER.count(pk, len(plan.ops))
            return head
        raise Conflict("The record's expiry index changed on every attempt to write it; retry.", field="key")

    def _created_meanwhile(self, pk: str, rk: str, fence: Fence | None, exc: Exception) -> bool:
        """A first version's insert met a row (one read says which): a record raises
        :class:`CreatedMeanwhile` (the caller decides on it); an older layout's claim is cleared
        (``Fence.clear_home``: True, insert again); a claim of this process's layout or a newer one means
        its copy of the layout is behind (503); gone again: False (the caller re-reads)."""
        found = self._row_at(pk, rk)
        if found is None:
            return False
        if not is_claim(found):
            raise CreatedMeanwhile(Head.read(found, found.metadata["etag"])) from exc
        if fence is None:
            fence = Fence("state", pk, (), self.layout.era, self._layouts.forget)
        fence.clear_home(self.table, found)
        return True

    def _read_back(
        self, pk: str, rk: str, current: Head | None, new: StateRow, exc: Exception
    ) -> Head | None:
        """After a write whose answer was lost: the head when it is the version ``new`` describes; None when
        nothing was written (ask again); else a conflict (``lifecycle.settled``)."""
        try:
            head = self.read_head_at(pk, rk)
        except Exception:
            raise exc from None  # storage cannot say: the original fault (503), never a guess
        outcome = settled(head, current, new)
        if outcome == "applied":
            return head
        if outcome == "not-applied":
            return None
        raise ResourceModifiedError("The record changed while the write's answer was lost.") from exc

    # -- building rows (the benchmark seeds records with it) ---------------------------------------------
    def _new_head(
        self,
        key: RecordKey,
        ctx: WriteContext,
        status: Status,
        now: datetime,
        *,
        version: int,
        created_at: datetime,
    ) -> StateRow:
        partition = self.layout.partition(key)
        return new_head(key, ctx, status, now, partition=partition, version=version, created_at=created_at)


class CreatedMeanwhile(Exception):
    """The insert of a first version met the record another writer created meanwhile (``head``)."""

    def __init__(self, head: Head) -> None:
        super().__init__("the record was created meanwhile")
        self.head = head


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
