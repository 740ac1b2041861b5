"""A state row read from the entity the store writes maps back to that entity, property for property and
type for type (``state/rows.py`` is the one place that names the columns). The entities come from the
store itself, on the in-memory table: a first lock, a takeover, an outcome with data and retention, an
extension, catch-up's Failed and Expired, and the history and expiry-index rows those writes leave."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from common.limits import int64
from state import envelope
from state.catchup import Catchup
from state.keys import Layout
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope, Status
from state.rows import IndexRow, StateRow
from state.store import StateStore
from tests.state.written_entities import expiry_index_calls, written_entities
from tests.support.memory_table import MemoryTables

KEY = RecordKey(7, Scope.ELEMENT, 3, "invoice", "INV-rows", entity_execution_id=11)
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _typed(entity: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    return {name: (type(value), value) for name, value in entity.items()}


def _written_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The entities the store sent to the state table (as written), and the rows it holds after (as read)."""
    now = [T0]
    tables = MemoryTables()
    written: list[dict[str, Any]] = []

    def gate(call: str, args: tuple[Any, ...]) -> None:
        if args[0] != "state":
            return
        if call == "submit_transaction":
            written.extend(dict(op[1]) for op in args[1] if op[0] != "delete")
        elif call in ("create_entity", "update_entity", "upsert_entity"):
            written.append(dict(args[1]))

    tables.gate = gate
    store = StateStore(tables, layout=Layout(1), clock=lambda: now[0])
    ctx = WriteContext(source_app_id=5, retention_seconds=60)
    first = store.lock(KEY, ctx, 30, request_id="req-1")
    assert first.token is not None
    store.extend(KEY, ctx, first.token, 45)
    props = envelope.encode({"data": {"invoice": "INV-rows", "text": "é" * 40_000}})
    store.record(
        KEY,
        ctx,
        status=Status.PROCESSED,
        envelope_props=props,
        substatus=None,
        error=None,
        token_text=first.token,
    )
    now[0] += timedelta(seconds=61)
    Catchup(store).run(now=now[0])  # retention over: Expired, data kept
    again = store.lock(KEY, ctx, 1)
    assert again.acquired
    now[0] += timedelta(seconds=5)
    taken = store.lock(KEY, ctx, 30)  # takes the expired lock over
    assert taken.takeover
    now[0] += timedelta(seconds=40)
    Catchup(store).run(now=now[0])  # the lock expired: Failed
    read = [dict(row) for row in tables.table("state").list_entities()]
    assert len(read) > 6 and len(written) > 10
    return written, read


def test_every_row_the_store_writes_and_reads_maps_back_to_the_same_entity() -> None:
    written, read = _written_rows()
    for entity in written + read:
        if "StateRK" in entity:
            row: StateRow | IndexRow = IndexRow.from_entity(entity)
        elif "Status" in entity:
            row = StateRow.from_entity(entity)
        else:
            continue  # a minute's marker of the expiry index, no row of the record
        assert _typed(row.to_entity()) == _typed(entity)


def test_a_head_reads_as_typed_columns() -> None:
    entity = {
        "PartitionKey": "7|4|3",
        "RowKey": "h",
        "TenantId": 7,
        "ScopeId": 4,
        "Status": int(Status.PROCESSING),
        "Version": 2,
        "RetentionSeconds": int64(60),
        "LockedUntil": T0,
        "Data0": b"{}",
        "DataChunks": 1,
        "Unnamed": "kept",
    }
    row = StateRow.from_entity(entity)
    assert row.status is Status.PROCESSING and row.version == 2 and row.retention_seconds == 60
    assert row.locked_until == T0 and row.data == {"Data0": b"{}"} and row.other == {"Unnamed": "kept"}
    assert not row.is_history
    assert _typed(row.to_entity()) == _typed(entity)


def test_a_history_row_keeps_the_status_it_was_recorded_with() -> None:
    row = StateRow.from_entity(
        {"PartitionKey": "p", "RowKey": "r", "Status": int(Status.SUPERSEDED), "RecordedStatus": 2}
    )
    assert row.is_history and row.status is Status.SUPERSEDED and row.recorded_status is Status(2)


def test_the_store_writes_the_entities_it_wrote_before_rows_were_typed() -> None:
    """The same operations, properties, types and values as the code at 5c06c05 sent (recorded there), as
    ADR-0021 changed them (re-recorded with it, the only differences: no level-2 lock row inserted or
    deleted, the lock marker's mark ``n``, and each lock's merge carrying its ``L{lockId}`` entry)."""
    before = json.loads((Path(__file__).parent / "entities_before_typed_rows.json").read_text())
    assert written_entities() == before


def test_the_expiry_index_writes_the_markers_and_level_one_rows_it_wrote_before_they_were_typed() -> None:
    """The markers, level-1 rows, their leases and deletes the scenario sends, as the code at f4ce423 sent
    them (recorded there, before the expiry index's rows were typed), as ADR-0021 changed them (re-recorded:
    no level-2 lock row, the lock marker's mark ``n`` and its entries, markers deleted ``If-Match``)."""
    before = json.loads((Path(__file__).parent / "expiry_index_before_typed_rows.json").read_text())
    assert expiry_index_calls() == before
