"""One scenario through the real ``StateStore`` on the in-memory table, with a fixed clock and fixed ids:
the entities it sends to the state table, each property as (type, value, Edm type). The same figures
recorded by the code before rows were typed are kept in ``entities_before_typed_rows.json``; the calls of
the expiry index (its markers, its level-1 rows, their leases and deletes) recorded before they were typed
are kept in ``expiry_index_before_typed_rows.json``."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from state import catchup, envelope
from state.catchup import Catchup
from state.keys import EXPIRY_TABLE, INDEX_MARK, LOCK_KIND, RETENTION_KIND, STATE_TABLE, Layout
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope, Status
from state.store import StateStore
from tests.support.memory_table import MemoryTables

KEY = RecordKey(7, Scope.ELEMENT, 3, "invoice", "INV-rows", entity_execution_id=11)
T0 = datetime(2026, 3, 1, tzinfo=UTC)
OWNER = "catch-up-owner"

Gate = Callable[[str, tuple[Any, ...]], None]


def _property(value: Any) -> list[str]:
    inner, edm = getattr(value, "value", value), getattr(value, "edm_type", None)
    return [type(value).__name__, repr(inner), repr(edm)]


def _properties(entity: Any) -> list[Any]:
    return sorted([n, _property(v)] for n, v in entity.items())


def _scenario(gate: Gate) -> None:
    """Lock, extend, record with data (fenced), retention expiry, re-lock, takeover, release without a
    token, lock, lock expiry, each storage call shown to ``gate`` first."""
    ids = itertools.count(1)
    now = [T0]
    tables = MemoryTables()

    def clock() -> datetime:
        return now[0]

    tables.gate = gate
    with (
        mock.patch("uuid.uuid4", lambda: uuid.UUID(int=next(ids))),
        mock.patch.multiple("state.store", utcnow=clock, earliest_now=clock, latest_now=clock),
        # The scenario's lock ids are fixed: a run must not find them among the locks an earlier run saw end
        # (catch-up's process-wide memory), or its catch-up passes them by and writes less.
        mock.patch.object(catchup, "ENDED", type(catchup.ENDED)(1_000)),
    ):
        store = StateStore(tables, layout=Layout(1))
        ctx = WriteContext(source_app_id=5, retention_seconds=60)
        first = store.lock(KEY, ctx, 30, request_id="req-1")
        assert first.token is not None
        store.extend(KEY, ctx, first.token, 45)
        props = envelope.encode({"data": {"invoice": "INV-rows", "text": "é" * 10}})
        store.record(
            KEY, ctx, status=Status.PROCESSED, envelope_props=props, substatus="s", error=None,
            token_text=first.token, digest="d1",
        )  # fmt: skip
        now[0] += timedelta(seconds=61)
        Catchup(store, owner=OWNER).run(now=now[0])
        store.lock(KEY, ctx, 1)
        now[0] += timedelta(seconds=5)
        store.lock(KEY, ctx, 30)
        store.record(
            KEY, ctx, status=Status.FAILED, envelope_props=None, substatus=None, error="boom",
            token_text=None, require_processing=True,
        )  # fmt: skip
        store.lock(KEY, WriteContext(), 2)
        now[0] += timedelta(seconds=40)
        Catchup(store, owner=OWNER).run(now=now[0])


def written_entities() -> list[list[Any]]:
    """Every operation the scenario sent to the state table, in order, as [kind, properties]."""
    written: list[list[Any]] = []

    def gate(call: str, args: tuple[Any, ...]) -> None:
        if args[0] != STATE_TABLE:
            return
        if call == "submit_transaction":
            written.extend([op[0], _properties(op[1])] for op in args[1])
        elif call in ("create_entity", "update_entity", "upsert_entity"):
            written.append([call, _properties(args[1])])

    _scenario(gate)
    return written


def expiry_index_calls() -> list[list[Any]]:
    """Every write of the expiry index the scenario sent, in order: each call to the level-1 table, and each
    operation on the state table's index rows and markers (RowKeys starting with ``~``), as [call, table,
    properties] or, for a delete, [call, table, PartitionKey, RowKey]."""
    calls: list[list[Any]] = []

    def index(table: str, pk: Any, rk: Any) -> bool:
        """A row of the expiry index: level 1 (not the signing key beside it), or level 2 and markers."""
        if table == EXPIRY_TABLE:
            return str(pk)[:1] in (LOCK_KIND, RETENTION_KIND)
        return table == STATE_TABLE and str(rk).startswith(INDEX_MARK)

    def gate(call: str, args: tuple[Any, ...]) -> None:
        table = args[0]
        if call == "submit_transaction":
            for kind, entity, *_ in args[1]:
                if index(table, entity["PartitionKey"], entity["RowKey"]):
                    calls.append([kind, table, _properties(entity)])
        elif call in ("create_entity", "update_entity", "upsert_entity"):
            if index(table, args[1]["PartitionKey"], args[1]["RowKey"]):
                calls.append([call, table, _properties(args[1])])
        elif call == "delete_entity" and index(table, args[1], args[2]):
            calls.append([call, table, args[1], args[2]])

    _scenario(gate)
    return calls
