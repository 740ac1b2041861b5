"""One scenario through the real ``StateStore`` on the in-memory table, with a fixed clock and fixed ids:
the entities it sends to the state table, each property as (type, value, Edm type). The same figures
recorded by the code before rows were typed are kept in ``entities_before_typed_rows.json``."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from state import envelope
from state.catchup import Catchup
from state.keys import Layout
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope, Status
from state.store import StateStore
from tests.support.memory_table import MemoryTables

KEY = RecordKey(7, Scope.ELEMENT, 3, "invoice", "INV-rows", entity_execution_id=11)
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _property(value: Any) -> list[str]:
    inner, edm = getattr(value, "value", value), getattr(value, "edm_type", None)
    return [type(value).__name__, repr(inner), repr(edm)]


def written_entities() -> list[list[Any]]:
    """Lock, extend, record with data (fenced), retention expiry, re-lock, takeover, release without a
    token, lock, lock expiry: every operation sent to the state table, in order, as [kind, properties]."""
    ids = itertools.count(1)
    now = [T0]
    tables = MemoryTables()
    written: list[list[Any]] = []

    def gate(call: str, args: tuple[Any, ...]) -> None:
        if args[0] != "state":
            return
        if call == "submit_transaction":
            written.extend([op[0], sorted([n, _property(v)] for n, v in op[1].items())] for op in args[1])
        elif call in ("create_entity", "update_entity", "upsert_entity"):
            written.append([call, sorted([n, _property(v)] for n, v in args[1].items())])

    def clock() -> datetime:
        return now[0]

    tables.gate = gate
    with (
        mock.patch("uuid.uuid4", lambda: uuid.UUID(int=next(ids))),
        mock.patch.multiple("state.store", utcnow=clock, earliest_now=clock, latest_now=clock),
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
        Catchup(store).run(now=now[0])
        store.lock(KEY, ctx, 1)
        now[0] += timedelta(seconds=5)
        store.lock(KEY, ctx, 30)
        store.record(
            KEY, ctx, status=Status.FAILED, envelope_props=None, substatus=None, error="boom",
            token_text=None, require_processing=True,
        )  # fmt: skip
        store.lock(KEY, WriteContext(), 2)
        now[0] += timedelta(seconds=40)
        Catchup(store).run(now=now[0])
    return written
