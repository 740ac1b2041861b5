"""Loading many records fast, for the benchmark (never deployed: it lives in ``bench/``).

Records are written in the real layout (heads built by the store itself) with 100-row transactions, so a
100,000-record table takes seconds instead of 100,000 lock+set calls. Expired locks get their expiry
index rows (level 2 beside the head, level 1 in ``statelocks``), exactly what a lock would have written.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from common.clock import epoch_ms
from state import service
from state.catchup import CatchupResult
from state.expiry import level1_entity
from state.keys import (
    EXPIRY_TABLE,
    LOCK_KIND,
    STATE_TABLE,
    bucket_of,
    index_row_key,
    marker_row_key,
    parse_index_row_key,
)
from state.lifecycle import WriteContext, lock_fields
from state.model import RecordKey, Scope, Status

BATCH = 100
# Transactions sent at once while loading: Azurite and this process overlap (2 cores), and a busy machine
# gives the load more of its time (make bench must stay under 10 minutes).
LOAD_WORKERS = 4


@dataclass(frozen=True)
class Loaded:
    records: int
    expired_locks: list[RecordKey]


def index_entity(partition: str, kind: str, due: datetime, ident: str, state_row: str) -> dict[str, Any]:
    """A level-2 row (``state/expiry.py``): ``ident`` of the head ``state_row`` falls due at ``due``."""
    return {
        "PartitionKey": partition,
        "RowKey": index_row_key(kind, epoch_ms(due), ident),
        "StateRK": state_row,
    }


def bulk_records(
    count: int,
    *,
    expired_locks: int = 0,
    live_locks: int = 0,
    tenant_id: int = 9,
    entity_ids: int = 10,
    expired_ago_s: int = 60,
    live_from_s: int = 600,
    live_spread_s: int = 1800,
) -> Loaded:
    """Write ``count`` Processed records spread over ``entity_ids`` partitions, plus ``expired_locks``
    Processing records whose lock expired ``expired_ago_s`` seconds ago, plus ``live_locks`` Processing
    records whose locks fall due between ``live_from_s`` and ``live_from_s + live_spread_s`` seconds from
    now (the spread of default 30-minute locks taken over the last half hour). Every lock gets the index
    rows a lock would have written: its level-2 row beside the head, a marker per partition and minute
    for the live ones, and the level-1 row of its (minute, partition)."""
    store = service.store()
    tables = store._tables
    ctx = WriteContext()
    now = store.now()
    run = uuid.uuid4().hex[:8]
    by_partition: dict[str, list[dict[str, Any]]] = {}
    for i in range(count):
        key = RecordKey(tenant_id, Scope.ELEMENT, i % entity_ids, "bench", f"{run}-{i}")
        entity = store._new_head(key, ctx, Status.PROCESSED, now, version=1, created_at=now).to_entity()
        by_partition.setdefault(str(entity["PartitionKey"]), []).append(entity)
    expired: list[RecordKey] = []
    pointers: set[tuple[int, str]] = set()
    until = now - timedelta(seconds=expired_ago_s)
    for i in range(expired_locks):
        key = RecordKey(tenant_id, Scope.ELEMENT, i % entity_ids, "bench-lock", f"{run}-{i}")
        head = store._new_head(key, ctx, Status.PROCESSING, until, version=1, created_at=until)
        lock_id = uuid.uuid4().hex
        entity = lock_fields(head, lock_id, until - timedelta(seconds=1), until).to_entity()
        pk, rk = str(entity["PartitionKey"]), str(entity["RowKey"])
        by_partition.setdefault(pk, []).extend([entity, index_entity(pk, LOCK_KIND, until, lock_id, rk)])
        pointers.add((bucket_of(parse_index_row_key(str(entity["LockIndexKey"]))[2]), pk))
        expired.append(key)
    markers: set[tuple[str, int]] = set()
    for i in range(live_locks):
        key = RecordKey(tenant_id, Scope.ELEMENT, i % entity_ids, "bench-live", f"{run}-{i}")
        due = now + timedelta(milliseconds=live_from_s * 1000 + (i * 7919) % (live_spread_s * 1000))
        head = store._new_head(key, ctx, Status.PROCESSING, now, version=1, created_at=now)
        lock_id = uuid.uuid4().hex
        entity = lock_fields(head, lock_id, now, due).to_entity()
        pk, rk = str(entity["PartitionKey"]), str(entity["RowKey"])
        bucket = bucket_of(parse_index_row_key(str(entity["LockIndexKey"]))[2])
        rows = by_partition.setdefault(pk, [])
        rows.extend([entity, index_entity(pk, LOCK_KIND, due, lock_id, rk)])
        if (pk, bucket) not in markers:
            markers.add((pk, bucket))
            rows.append({"PartitionKey": pk, "RowKey": marker_row_key(LOCK_KIND, bucket, uuid.uuid4().hex)})
        pointers.add((bucket, pk))
    state_table = tables.table(STATE_TABLE)
    batches = [rows[i : i + BATCH] for rows in by_partition.values() for i in range(0, len(rows), BATCH)]
    level1 = tables.table(EXPIRY_TABLE)
    with ThreadPoolExecutor(max_workers=LOAD_WORKERS) as pool:
        # list(): a failed transaction raises here instead of being dropped.
        list(pool.map(lambda b: state_table.submit_transaction([("create", row) for row in b]), batches))
        list(pool.map(lambda p: level1.upsert_entity(level1_entity(LOCK_KIND, p[0], p[1])), pointers))
    return Loaded(records=count + expired_locks + live_locks, expired_locks=expired)


def run_catchup() -> CatchupResult:
    """One catch-up run, as the timer does it."""
    return service.catchup().run()
