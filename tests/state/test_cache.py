"""The per-process head cache (hints) is bounded by bytes, not by a number of entries."""

from __future__ import annotations

from common import runtime
from common.limits import entity_size
from state import service
from state.store import StateStore
from tests.state.conftest import new_key


def test_the_head_cache_never_holds_more_bytes_than_its_budget(state, monkeypatch):
    # given a store whose cache may hold 4 MiB (a head larger than 1/64 of it is never kept)
    budget = 4 * 1024 * 1024
    store = StateStore(runtime.tables(), hint_bytes=budget)
    monkeypatch.setattr(service.store, "_value", store)
    # when 80 records of ~60 KB each (about 5 MB) are written and read through it
    keys = [new_key() for _ in range(80)]
    for k in keys:
        assert state.set(k, status="Processed", data={"blob": "x" * 60_000}).status == 200
    for k in keys[:10]:
        assert state.get(k).status == 200
    # then the cache counts what it holds, holds at most its budget, and dropped the oldest heads
    hints = store._hints
    held = sum(size for _, size in hints.entries.values())
    assert hints.bytes == held <= budget
    assert sum(entity_size(h.entity) for h, _ in hints.entries.values() if h is not None) <= budget
    assert 0 < len(hints.entries) < len(keys)
    # a head too large to be worth keeping is not kept at all
    big = new_key()
    assert state.set(big, status="Processed", data={"blob": "y" * 200_000}).status == 200
    from state.keys import head_row_key, partition_key
    from state.schemas import KeyIn

    rk = KeyIn.model_validate(big).record_key()
    assert hints.get(partition_key(rk.tenant_id, rk.scope, rk.entity_id), head_row_key(rk)) == (False, None)
