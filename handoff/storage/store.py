"""Table Storage I/O of the hand-off tables. Speaks only to the database; the decisions are elsewhere.

Every write is insert-only or conditional (``If-Match`` an ETag, or ``*`` where the row must still exist
and a concurrent change of it is harmless); rows of one endpoint partition that change together are
submitted as one entity-group transaction (``submit``).

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from common.errors import KeyTooLong, is_transient_storage_fault
from common.fence import MOVED_TO, Fence, is_claim, moved_to
from common.partition_meter import METER
from common.table_protocol import TableSource
from common.tables import before_ms, datetime_literal, first_rows, quoted

# The operation builders live in ``common.transactions``; the operator modules still import them from here.
from common.transactions import MAX_TRANSACTION_OPS, Operation, insert, merge_if_unchanged
from handoff.receive.leases import CLAIMED
from handoff.storage import keys
from handoff.storage.counts import POISON, column
from handoff.storage.keys import Layout
from handoff.storage.records import (
    AuditRow,
    ClaimRow,
    EndpointRow,
    EventRow,
    HistoryRow,
    JobRow,
    PoisonRow,
    QueueRow,
    ReconcileRow,
    UnconfirmedRow,
)

if TYPE_CHECKING:
    from azure.data.tables import TableClient

    from handoff.storage.layout import LayoutSource

log = logging.getLogger("settle.handoff.store")


class HandoffStore:
    """The hand-off tables of one storage account (see :mod:`handoff.storage.keys` for the layout).

    ``layouts`` is where the store reads the layout its keys route by: the composition root's
    (``handoff/service.py``: the one recorded in storage), or a :class:`~handoff.storage.keys.Layout` given
    as it is (tests, tools)."""

    def __init__(self, tables: TableSource, layouts: LayoutSource) -> None:
        self._tables = tables
        self._layouts = layouts

    def _events(self) -> TableClient:
        return self.table(keys.EVENTS_TABLE)

    def table(self, name: str) -> TableClient:
        """The client of one hand-off table (``keys.*_TABLE``, or the operators' ``hoaudit``): Azure's, or
        the in-memory table of the tests, which meets the same protocol (``common/table_protocol.py``)."""
        client: TableClient = self._tables.table(name)
        return client

    # -- events partition ---------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        """The layout keys route by now (the recorded one is kept: no request per call)."""
        return self._layouts.now()

    def event_partition(self, endpoint_id: str, event_id: str) -> str:
        """The partition of every row of one event (``keys`` "Sharded endpoints").

        Computed, without a read, unless earlier layouts are listed: then the event row is looked for
        (:meth:`locate_event`), because an event keeps the partition it was created in. Not found
        anywhere: the current one.
        """
        layout = self.layout
        if not layout.earlier_event_partitions(endpoint_id, event_id):
            return layout.event_partition(endpoint_id, event_id)
        return self.locate_event(endpoint_id, event_id, select=["RowKey"])[0]

    def locate_event(
        self, endpoint_id: str, event_id: str, select: list[str] | None = None
    ) -> tuple[str, Any | None]:
        """(partition, event row) of one event wherever it lives: its partition now (a claim there,
        ``common/fence.py``, is followed to the partition it names), else an earlier layout's (one point
        read each, only on a miss; claims are never events). Not found: (the partition now, None)."""
        layout = self.layout
        current = layout.event_partition(endpoint_id, event_id)
        wanted = None if select is None else [*select, MOVED_TO]
        entity = self._event_entity(current, event_id, wanted)
        if entity is not None and not is_claim(entity):
            return current, entity
        if entity is not None:  # also in a copy of the layout that is behind: the claim says where
            target = moved_to(entity)
            found = self._event_entity(target, event_id, wanted)
            if found is not None and not is_claim(found):
                return target, found
        for pk in layout.earlier_event_partitions(endpoint_id, event_id):
            found = self._event_entity(pk, event_id, wanted)
            if found is not None and not is_claim(found):
                return pk, found
        return current, None

    def event_fence(self, endpoint_id: str, event_id: str) -> Fence | None:
        """What creating the event's row must fence (``common/fence.py``): None with no earlier layout."""
        layout = self.layout
        earlier = layout.earlier_event_partitions(endpoint_id, event_id)
        if not earlier:
            return None
        home = layout.event_partition(endpoint_id, event_id)
        return Fence("handoff", home, tuple(earlier), layout.era, self._layouts.forget)

    def claim_earlier(self, fence: Fence, event_id: str) -> bool:
        """Fence the event row's key in the earlier layouts; True when one of them holds the event."""
        return fence.claim_earlier(self._events(), keys.event_row(event_id)) is not None

    def clear_claim_at_home(self, endpoint_id: str, event_id: str, fence: Fence | None) -> None:
        """An event row's insert was refused: when a claim stands where the event goes, clear it (an older
        layout's, ``Fence.clear_home``) or refuse as behind (503); a real row is left to the re-read."""
        layout = self.layout
        home = layout.event_partition(endpoint_id, event_id)
        found = self._event_entity(home, event_id, ["RowKey", "PartitionKey", MOVED_TO, "Era"])
        if not is_claim(found):
            return
        if fence is None:
            fence = Fence("handoff", home, (), layout.era, self._layouts.forget)
        fence.clear_home(self._events(), found)

    def _event_entity(self, pk: str, event_id: str, select: list[str] | None = None) -> Any:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self._events().get_entity(pk, keys.event_row(event_id), select=select)
        except ResourceNotFoundError:
            return None

    def endpoint_partitions(self, endpoint_id: str) -> list[str]:
        """Every partition of the endpoint (its shards, current and earlier layouts); one with S = 1."""
        return self.layout.endpoint_partitions(endpoint_id)

    def get_event(self, endpoint_id: str, event_id: str) -> EventRow | None:
        """Point read of the event row (one round trip; +1 per earlier layout on a miss)."""
        entity = self.locate_event(endpoint_id, event_id)[1]
        if entity is None:
            return None
        row: EventRow = EventRow.from_entity(entity)
        return row

    def event_rows(self, endpoint_id: str, event_id: str) -> Iterator[Any]:
        """Every row of one event (event row, history, audits, claims): one range query."""
        low, high = keys.event_range(event_id)
        pk = self.event_partition(endpoint_id, event_id)
        keys.checked(high, field="eventId")
        query = f"PartitionKey eq {quoted(pk)} and RowKey ge {quoted(low)} and RowKey lt {quoted(high)}"
        return iter(self._events().query_entities(query))

    def point_rows(self, endpoint_id: str, event_id: str, row_keys: list[str]) -> list[Any]:
        """Rows of one event's partition by key (one point read each; missing ones are left out)."""
        from azure.core.exceptions import ResourceNotFoundError

        pk = self.event_partition(endpoint_id, event_id)
        found = []
        for row_key in row_keys:
            try:
                found.append(self._events().get_entity(pk, row_key))
            except ResourceNotFoundError:
                continue
        return found

    def get_claim(self, endpoint_id: str, event_id: str, parked_message_id: str) -> ClaimRow | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            entity = self._events().get_entity(
                self.event_partition(endpoint_id, event_id), keys.claim_row(event_id, parked_message_id)
            )
        except ResourceNotFoundError:
            return None
        row: ClaimRow = ClaimRow.from_entity(entity)
        return row

    def claims(self, endpoint_id: str, event_id: str) -> list[ClaimRow]:
        """Every claim of one event (one per parked message it ever had): one short range read."""
        low, high = keys.claim_range(event_id)
        keys.checked(high, field="eventId")
        pk = self.event_partition(endpoint_id, event_id)
        return [ClaimRow.from_entity(e) for e in self._range(pk, low, high)]

    def has_history(self, endpoint_id: str, event_id: str, message_id: str) -> bool:
        """Whether the resolver projected this message for this event (point read of its history row)."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._events().get_entity(
                self.event_partition(endpoint_id, event_id),
                keys.history_row(event_id, message_id),
                select=["RowKey"],
            )
        except ResourceNotFoundError:
            return False
        return True

    def _merged(
        self,
        endpoint_id: str,
        low: str,
        high: str,
        *,
        limit: int,
        after: dict[str, str] | None = None,
        where: str | None = None,
    ) -> list[Any]:
        """The first ``limit`` rows of ``[low, high)`` over every shard of the endpoint, in RowKey order
        (each shard read up to ``limit`` rows, then merged; ``after``: per shard, start behind that key;
        ``where``: a filter on the rows' columns, applied by storage)."""
        rows: list[Any] = []
        for pk in self.endpoint_partitions(endpoint_id):
            start = (after or {}).get(pk)
            rows.extend(self._range(pk, start or low, high, after=bool(start), limit=limit, where=where))
        rows.sort(key=lambda e: str(e["RowKey"]))
        return rows[:limit]

    def _range(
        self,
        pk: str,
        low: str,
        high: str,
        *,
        after: bool = False,
        limit: int | None = None,
        where: str | None = None,
    ) -> Iterator[Any]:
        """Rows of ``[low, high)`` (``(low, high)`` with ``after``) of one partition in key order, following
        continuations; ``where``: only the rows it holds for (a filter storage applies)."""
        op = "gt" if after else "ge"
        query = f"PartitionKey eq {quoted(pk)} and RowKey {op} {quoted(low)} and RowKey lt {quoted(high)}"
        if where:
            query += f" and {where}"
        page = min(limit, 1000) if limit else None
        for count, entity in enumerate(self._events().query_entities(query, results_per_page=page), 1):
            yield entity
            if limit is not None and count >= limit:
                return

    def submit(self, operations: Sequence[Operation]) -> list[dict[str, Any]]:
        """One entity-group transaction (all operations in one partition, at most 100)."""
        if not operations:
            return []
        if len(operations) > MAX_TRANSACTION_OPS:
            raise ValueError(f"A transaction holds at most {MAX_TRANSACTION_OPS} operations.")
        answers = [dict(r) for r in self._events().submit_transaction(list(operations))]
        METER.count(str(operations[0][1]["PartitionKey"]), len(operations))  # a partition near its budget?
        return answers

    def queued(
        self, endpoint_id: str, *, claimed_before: str, event_type_ids: Sequence[str] = (), limit: int = 5
    ) -> list[QueueRow]:
        """The oldest parked events not claimed at ``claimed_before`` (first page only: never a scan)."""
        low, high = keys.QUEUE_RANGE
        found: list[Any] = []
        for pk in self.endpoint_partitions(endpoint_id):  # each shard's first page, merged oldest first
            clauses = [
                f"PartitionKey eq {quoted(pk)}",
                f"RowKey ge {quoted(low)}",
                f"RowKey lt {quoted(high)}",
                f"ClaimedUntil lt {quoted(claimed_before)}",
            ]
            if event_type_ids:
                clauses.append("(" + " or ".join(f"EventTypeId eq {quoted(t)}" for t in event_type_ids) + ")")
            found.extend(
                first_rows(
                    self._events().query_entities(" and ".join(clauses), results_per_page=limit), limit
                )
            )
        found.sort(key=lambda e: str(e["RowKey"]))
        return [QueueRow.from_entity(e) for e in found[:limit]]

    def get_queue_row(self, endpoint_id: str, event_id: str, queue_key: str) -> QueueRow | None:
        """Point read of one agent queue row (leases live on it)."""
        rows = self.point_rows(endpoint_id, event_id, [queue_key])
        return QueueRow.from_entity(rows[0]) if rows else None

    def job_events(self, endpoint_id: str, external_job_id: str) -> list[str]:
        """The events of ``endpoint_id`` that carried ``external_job_id``, from the lookup index (``hoids``:
        one partition per id, whatever the shards), in event id order. The index is insert-only: a caller
        checks the event row (is it parked with that job now?)."""
        low, high = keys.exact_kind_range("externalJobId")
        query = (
            f"PartitionKey eq {quoted(keys.exact_id_partition(external_job_id))} and RowKey ge {quoted(low)}"
            f" and RowKey lt {quoted(high)} and EndpointId eq {quoted(endpoint_id)}"
            f" and Value eq {quoted(external_job_id)}"
        )
        found = self.table(keys.IDS_TABLE).query_entities(query, select=["EventId"])
        return sorted({str(e["EventId"]) for e in found})

    def legacy_jobs(self, endpoint_id: str, external_job_id: str, *, limit: int = 5) -> list[JobRow]:
        """Job rows ``jb|`` of parks written before ADR-0022 (deleted when such a park ends; no longer
        written): read only when the lookup index names no event. An id too long for a key had none."""
        try:
            low, high = keys.job_range(external_job_id)
        except KeyTooLong:
            return []
        found: list[Any] = []
        for pk in self.endpoint_partitions(endpoint_id):  # the job's rows may be in any shard
            query = f"PartitionKey eq {quoted(pk)} and RowKey ge {quoted(low)} and RowKey lt {quoted(high)}"
            found.extend(first_rows(self._events().query_entities(query, results_per_page=limit), limit))
        found.sort(key=lambda e: str(e["RowKey"]))
        return [JobRow.from_entity(e) for e in found[:limit]]

    def expired(
        self, endpoint_id: str, now: datetime, *, after: dict[str, str] | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The parks due at ``now`` (ADR-0022 change 5), over every shard, at most ``limit``, in key order:
        the ``ex|`` rows of parks from before (by ExpectedBy), then the ``hq|`` queue rows (by when each
        event parked, oldest first); in each shard behind the key ``after[shard]`` (the sweeper's cursor is
        per shard). One range, ``keys.OVERDUE_RANGE``, filtered by storage on ``ExpectedBy`` (see
        :func:`due_filter`). Each row carries its ``PartitionKey``, ``RowKey``, ``EventId`` and
        ``ExpectedBy``.

        Linear in the endpoint's **parked** hand-offs, not in its table: storage examines every queue row
        (and every ``ex|`` row left) of the shard to answer, in pages of at most 1,000 rows. Follows
        continuation tokens: a page of rows that cannot be swept never hides the ones behind it.
        """
        low, high = keys.OVERDUE_RANGE
        rows = self._merged(endpoint_id, low, high, limit=limit, after=after, where=due_filter(now))
        return [dict(e) for e in rows]

    def count_due(self, endpoint_id: str, now: datetime, *, cap: int) -> int:
        """The parks due at ``now`` (the rows :meth:`expired` reads), counted up to ``cap`` (keys only, one
        filtered range per shard: linear in the endpoint's parked hand-offs)."""
        low, high = keys.OVERDUE_RANGE
        return self.count_range(endpoint_id, low, high, cap=cap, where=due_filter(now))

    def count_range(
        self, endpoint_id: str, low: str, high: str, *, cap: int, where: str | None = None
    ) -> int:
        """Rows of ``[low, high)`` in the endpoint's partition, counted up to ``cap`` (keys only; ``where``:
        only the rows it holds for, filtered by storage)."""
        count = 0
        for pk in self.endpoint_partitions(endpoint_id):  # summed over the shards
            query = f"PartitionKey eq {quoted(pk)} and RowKey ge {quoted(low)} and RowKey lt {quoted(high)}"
            if where:
                query += f" and {where}"
            for _ in self._events().query_entities(query, select=["RowKey"], results_per_page=1000):
                count += 1
                if count >= cap:
                    return count
        return count

    def due_reconcile(self, endpoint_id: str, now: datetime, *, limit: int = 200) -> list[ReconcileRow]:
        """Open claims to look at now, oldest due first."""
        low, high = keys.reconcile_range_until(now)
        return [ReconcileRow.from_entity(e) for e in self._merged(endpoint_id, low, high, limit=limit)]

    def due_queue_claims(self, endpoint_id: str, now: datetime, *, limit: int = 200) -> list[QueueRow]:
        """Queue rows marked by a settlement's claim whose first look is due at ``now`` (ADR-0022 change 9),
        oldest park first; each keeps its ``row_key`` and ``etag``. One range per shard, filtered by storage
        (:func:`claim_due_filter`): linear in the endpoint's **parked** hand-offs, like overdue."""
        low, high = keys.QUEUE_RANGE
        rows = self._merged(endpoint_id, low, high, limit=limit, where=claim_due_filter(now))
        return [QueueRow.from_entity(e) for e in rows]

    def unconfirmed(
        self, endpoint_id: str, *, after: str | None = None, limit: int = 1000
    ) -> list[UnconfirmedRow]:
        """Claims that could neither be confirmed nor safely re-sent (usually none), in key order over every
        shard, behind the key ``after``; each row keeps its ``row_key``."""
        low, high = keys.UNCONFIRMED_RANGE
        behind = dict.fromkeys(self.endpoint_partitions(endpoint_id), after) if after else None
        rows = self._merged(endpoint_id, low, high, limit=limit, after=behind)
        return [UnconfirmedRow.from_entity(e) for e in rows]

    # -- endpoints and poison -----------------------------------------------------------------------

    def register_endpoint(self, endpoint_id: str) -> None:
        """Insert-only; an endpoint already listed is fine."""
        from azure.core.exceptions import ResourceExistsError

        row = EndpointRow(endpoint_id=endpoint_id)
        with contextlib.suppress(ResourceExistsError):
            self._tables.table(keys.ENDPOINTS_TABLE).create_entity(
                row.to_entity(keys.ENDPOINTS_PARTITION, keys.partition(endpoint_id))
            )

    def endpoints(self) -> list[str]:
        return [row.endpoint_id for row in self.endpoint_rows()]

    def endpoint_rows(self) -> list[EndpointRow]:
        query = f"PartitionKey eq {quoted(keys.ENDPOINTS_PARTITION)}"
        table = self._tables.table(keys.ENDPOINTS_TABLE)
        return [EndpointRow.from_entity(e) for e in table.query_entities(query)]

    def save_sweep_cursor(self, row: EndpointRow, cursor: str | None) -> bool:
        """Merge ``SweepCursor``, ``If-Match`` the row's ETag; False when another run changed it first."""
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        entity: dict[str, Any] = {
            "PartitionKey": keys.ENDPOINTS_PARTITION,
            "RowKey": keys.partition(row.endpoint_id),
            "SweepCursor": cursor or "",
        }
        try:
            merge_if_unchanged(self._tables.table(keys.ENDPOINTS_TABLE), entity, row.etag or "*")
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        return True

    def store_poison(
        self, row: PoisonRow, message_id: str | None, *, count_or_raise: bool = True
    ) -> tuple[str, str]:
        """Insert-only (a redelivered poison message lands on the same key), then count it.

        The count is an index row in the endpoint's partition (``pz|``, or the unattributed partition)
        inserted with its ``+1 Poison`` delta in one transaction; a redelivery finds both or inserts both,
        so a crash between the two writes is repaired by the broker's redelivery. Returns the row's keys.
        ``count_or_raise=False`` (the message's retry budget is spent: no redelivery will come) logs a
        transient failure of the count instead of raising it.
        """
        from azure.core.exceptions import HttpResponseError, ResourceExistsError
        from azure.data.tables import TableTransactionError

        pk, rk = keys.poison_keys(row.enqueued_time_utc, message_id)
        with contextlib.suppress(ResourceExistsError):
            self._tables.table(keys.POISON_TABLE).create_entity(row.to_entity(pk, rk))
        endpoint_pk = self.poison_partition(row.endpoint_id)
        index = {"PartitionKey": endpoint_pk, "RowKey": keys.poison_index_row(pk, rk), "Day": pk, "Id": rk}
        delta = {
            "PartitionKey": endpoint_pk,
            "RowKey": keys.delta_row(row.recorded_at, uuid.uuid4().hex),
            column(POISON): 1,
        }
        try:
            if endpoint_pk != keys.UNATTRIBUTED_PARTITION and row.endpoint_id:
                # The overview walks the listed endpoints: poison is often the first thing an endpoint
                # ever sends (a misnamed MessageType), and its count must not sit where nobody looks.
                self.register_endpoint(row.endpoint_id)
            self.submit([insert(index), insert(delta)])
        except TableTransactionError:
            pass  # the index row exists: counted before
        except HttpResponseError as exc:
            transient = is_transient_storage_fault(exc)
            if transient and count_or_raise:
                raise  # the resolver retries the message, which lands here again
            log.warning("poison %s/%s stored but not counted: %s", pk, rk, exc)
        return pk, rk

    @staticmethod
    def poison_partition(endpoint_id: str | None) -> str:
        """The partition that counts a poison message: its endpoint's, else the unattributed one."""
        if endpoint_id:
            with contextlib.suppress(KeyTooLong):
                return keys.partition(endpoint_id)
        return keys.UNATTRIBUTED_PARTITION

    def get_poison(self, day: str, row_key: str) -> PoisonRow | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            entity = self._tables.table(keys.POISON_TABLE).get_entity(day, row_key)
        except ResourceNotFoundError:
            return None
        row: PoisonRow = PoisonRow.from_entity(entity)
        return row

    def poison_page(self, day: str, *, after: str | None, limit: int) -> tuple[list[PoisonRow], str | None]:
        """One day's poison rows in key order (enqueue time), at most ``limit`` after the key ``after``."""
        query = f"PartitionKey eq {quoted(day)}"
        if after:
            query += f" and RowKey gt {quoted(after)}"
        rows: list[PoisonRow] = []
        table = self._tables.table(keys.POISON_TABLE)
        for entity in table.query_entities(query, results_per_page=min(limit + 1, 1000)):
            if len(rows) == limit:
                return rows, rows[-1].row_key
            rows.append(PoisonRow.from_entity(entity))
        return rows, None

    def poison_rows(self, day: str) -> list[PoisonRow]:
        return self.poison_page(day, after=None, limit=10_000)[0]


def due_filter(now: datetime) -> str:
    """The filter of the parks due at ``now``: ``ExpectedBy`` before ``now``'s millisecond (a row without
    the column never matches). Cut to the millisecond and compared with ``lt`` because that is how Azure,
    Azurite (which compares DateTime values at millisecond precision) and the in-memory table answer alike
    (``common.tables.datetime_literal``); a park comes due at most 1 ms later than its ExpectedBy."""
    return f"ExpectedBy lt {datetime_literal(before_ms(now))}"


def claim_due_filter(now: datetime) -> str:
    """The filter of the queue rows whose settlement claim is due for its first look at ``now``: marked
    claimed (``ClaimedUntil`` is ``leases.CLAIMED``, which sorts after every lease's end) and ``ReconcileAt``
    before ``now``'s millisecond (as :func:`due_filter`; a row without the column never matches)."""
    return f"ClaimedUntil ge {quoted(CLAIMED[:4])} and ReconcileAt lt {datetime_literal(before_ms(now))}"


def classify_event_rows(entities: Iterator[Any]) -> tuple[EventRow | None, list[HistoryRow], list[AuditRow]]:
    """Split one event's range query into its event row, history (projection order) and audits (by time).

    The audits are the audit rows and the entries rendered from the event's claims (every ``ev|…|c|`` row:
    a claim is the audit of the control message it holds, ADR-0022 change 3), merged by time. A claim
    written before that names its own audit row (``AuditKey``), which is the entry: it is never shown twice.
    A released claim is gone, and with it its audit."""
    event: EventRow | None = None
    history: list[HistoryRow] = []
    audits: list[AuditRow] = []
    claims: list[ClaimRow] = []
    for entity in entities:
        row_key = str(entity["RowKey"])
        parts = row_key.split("|")
        kind = parts[2] if len(parts) > 2 else None
        if kind == "e":
            event = EventRow.from_entity(entity)
        elif kind == "m":
            history.append(HistoryRow.from_entity(entity))
        elif kind == "a":
            audits.append(AuditRow.from_entity(entity))
        elif kind == "c":
            claims.append(ClaimRow.from_entity(entity))
    history.sort(key=lambda h: (h.sequence or 0, h.enqueued_time_utc))
    return event, history, with_claim_audits(audits, claims)


def with_claim_audits(audits: list[AuditRow], claims: list[ClaimRow]) -> list[AuditRow]:
    """``audits`` (audit rows, by time) with the entries rendered from ``claims`` merged in by time. A claim
    that names its audit row (``AuditKey``: written before the audit was rendered) renders nothing."""
    rendered = [audit for claim in claims if (audit := claim.audit()) is not None]
    if not rendered:
        return audits
    return sorted([*audits, *rendered], key=lambda audit: audit.audit_timestamp)
