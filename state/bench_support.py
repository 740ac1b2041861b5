"""Loading many records fast, for the benchmark (not used by the functions; excluded from deployment).

Records are written in the real layout (heads built by the store itself) with 100-row transactions, so a
100,000-record table takes seconds instead of 100,000 lock+set calls.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from common.clock import utcnow
from state import service
from state.catchup import CatchupResult
from state.expiry import LOCK_KIND
from state.keys import STATE_TABLE
from state.model import RecordKey, Scope, Status
from state.store import WriteContext

BATCH = 100


@dataclass(frozen=True)
class Loaded:
    records: int
    expired_locks: list[RecordKey]


def bulk_records(
    count: int, *, expired_locks: int = 0, tenant_id: int = 9, entity_ids: int = 10, expired_ago_s: int = 60
) -> Loaded:
    """Write ``count`` Processed records spread over ``entity_ids`` partitions, plus ``expired_locks``
    Processing records whose lock expired ``expired_ago_s`` seconds ago (with their expiry-index rows)."""
    store = service.store()
    table = store._tables.table(STATE_TABLE)
    ctx = WriteContext()
    now = utcnow()
    run = uuid.uuid4().hex[:8]
    by_partition: dict[str, list[dict[str, object]]] = {}
    for i in range(count):
        key = RecordKey(tenant_id, Scope.ELEMENT, i % entity_ids, "bench", f"{run}-{i}")
        entity = store._new_head(key, ctx, Status.PROCESSED, now, version=1, created_at=now)
        by_partition.setdefault(str(entity["PartitionKey"]), []).append(entity)
    expired: list[RecordKey] = []
    until = now - timedelta(seconds=expired_ago_s)
    for i in range(expired_locks):
        key = RecordKey(tenant_id, Scope.ELEMENT, i % entity_ids, "bench-lock", f"{run}-{i}")
        entity = store._new_head(key, ctx, Status.PROCESSING, until, version=1, created_at=until)
        lock_id = uuid.uuid4().hex
        entity.update(LockId=lock_id, LockedAt=until - timedelta(seconds=1), LockedUntil=until)
        by_partition.setdefault(str(entity["PartitionKey"]), []).append(entity)
        store.expiry.track(LOCK_KIND, until, lock_id, str(entity["PartitionKey"]), str(entity["RowKey"]), 1)
        expired.append(key)
    for rows in by_partition.values():
        for start in range(0, len(rows), BATCH):
            table.submit_transaction([("create", row) for row in rows[start : start + BATCH]])
    store.expiry.flush()
    return Loaded(records=count + expired_locks, expired_locks=expired)


def run_catchup() -> CatchupResult:
    """One catch-up run, as the timer does it."""
    return service.catchup().run()
