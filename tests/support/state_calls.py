"""The state tests' calls and checks: a lock lost, the rows of a key, a catch-up backlog and its outcome, the
writes a state call made and the versions it left."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from common import runtime
from common.settings import TableSettings
from common.tables import Tables
from state.keys import STATE_TABLE, Layout, head_row_key, node_partition_range, partition_key
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope, Status
from state.schemas import KeyIn
from state.store import StateStore
from tests.state.conftest import State


def lock_lost(result) -> None:
    assert result.status == 409, (result.status, result.body)
    assert result.json["type"] == "urn:settle:problem:lock-lost" and result.json["field"] == "lockToken"


def rows_of(key: dict[str, Any]) -> list[dict[str, Any]]:
    rk = KeyIn.model_validate(key).record_key()
    pk = partition_key(rk.tenant_id, rk.scope, rk.entity_id)
    path = head_row_key(rk)[:-2]
    return [
        dict(e)
        for e in runtime.tables()
        .table(STATE_TABLE)
        .query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
            parameters={"pk": pk, "low": path + "|", "high": path + "}"},
        )
    ]


def _store(fresh: str, policies: list[Any] | None = None, shards: int = 8) -> StateStore:
    settings = TableSettings.from_env()
    assert settings.prefix == fresh
    return StateStore(Tables(settings, policies=policies or []), layout=Layout(shards))


def _backlog(store: StateStore, count: int, entity: int) -> datetime:
    ctx = WriteContext()
    untils = []
    for n in range(count):
        key = RecordKey(3, Scope(4), entity, "invoice", f"item-{n}")
        outcome = store.lock(key, ctx, 1)
        assert outcome.acquired and outcome.locked_until is not None
        untils.append(outcome.locked_until)
    return max(untils) + timedelta(milliseconds=1)


def _outcome(entity: int) -> tuple[int, int, int]:
    """(heads, heads Failed, heads still Processing: locks not caught up) of the node, read straight from
    storage (a lock has no index row of its own: its entry is in its minute's marker, ADR-0021)."""
    low, high = node_partition_range(3, 4, entity)
    rows = list(
        runtime.tables()
        .table(STATE_TABLE)
        .query_entities(
            "PartitionKey ge @low and PartitionKey lt @high", parameters={"low": low, "high": high}
        )
    )
    heads = [r for r in rows if str(r["RowKey"]).endswith("|c")]
    failed = [r for r in heads if int(r["Status"]) == int(Status.FAILED)]
    left = [r for r in heads if int(r["Status"]) == int(Status.PROCESSING)]
    return len(heads), len(failed), len(left)


def state_writes(http: Any) -> bool:
    """A write of a record's head: an insert or a transaction (POST) carrying a ``Status`` column (the
    expiry index's own writes carry none)."""
    body = http.body if isinstance(http.body, bytes | str) else b""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return http.method == "POST" and '"Status"' in text


def versions(state: State, key: dict[str, Any]) -> list[int]:
    page = state.history(key, pageSize=100)
    assert page.status == 200, page.body
    return [item["version"] for item in page.json["items"]]
