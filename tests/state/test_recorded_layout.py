"""The shard layout in force is the one recorded in storage (common/layouts.py), not each instance's
setting: an instance whose ``SETTLE_STATE_SHARDS`` disagrees never answers from a layout that hides
records (a settled key answers ``exists: true`` and refuses a lock), and a change is one explicit step."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from common import layouts, runtime
from state import service
from tests.layouts import reshard, wait_in_force
from tests.state.conftest import State, new_key


@pytest.fixture
def deployment(monkeypatch: pytest.MonkeyPatch, fresh_tables: str) -> Iterator[Any]:
    """``deployment(S, previous)``: a new instance (process) of one deployment with those app settings."""
    monkeypatch.setenv(layouts.REFRESH_SETTING, "0.2")
    monkeypatch.setattr(layouts, "GUARD_S", 0.3)
    monkeypatch.setattr(layouts, "MARGIN_S", 0.2)

    def start(shards: int, previous: str = "") -> None:
        monkeypatch.setenv("SETTLE_STATE_SHARDS", str(shards))
        monkeypatch.setenv("SETTLE_STATE_SHARDS_PREVIOUS", previous)
        runtime.reset()

    yield start
    monkeypatch.delenv("SETTLE_STATE_SHARDS")
    monkeypatch.delenv("SETTLE_STATE_SHARDS_PREVIOUS")
    runtime.reset()


def settle(state: State, count: int, entity: int) -> list[dict[str, Any]]:
    keys = [new_key(entityId=entity, itemKey=f"INV-{entity}-{n:02d}") for n in range(count)]
    for k in keys:
        token = state.lock(k).json["lockToken"]
        assert state.set(k, status="Processed", lockToken=token).status == 200
    return keys


@pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 1), (4, 16), (16, 3)])
def test_a_settled_key_answers_exists_and_refuses_a_lock_whatever_the_setting_says(
    state: State, deployment: Any, before: int, after: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Given 20 keys written and settled under SETTLE_STATE_SHARDS=before
    deployment(before)
    keys = settle(state, 20, entity=500 + before)
    # When an instance starts with SETTLE_STATE_SHARDS=after and no SETTLE_STATE_SHARDS_PREVIOUS
    deployment(after)
    with caplog.at_level(logging.WARNING, logger="settle.layouts"):
        answers = [(state.exists(k), state.lock(k)) for k in keys]
    # Then every key exists and no second lock is handed out
    for exists, lock in answers:
        assert exists.status == 200 and exists.json["exists"] is True, exists.json
        assert lock.status == 200 and lock.json["acquired"] is False, lock.json
        assert lock.json["status"] == "Processed"
    # And the disagreement is logged, naming the setting and the recorded value
    assert any(
        "SETTLE_STATE_SHARDS" in r.getMessage() and f"({before} shards" in r.getMessage()
        for r in caplog.records
    )
    # And a new key goes where the recorded layout says (the instance follows it)
    assert service.store().layout.shards == before


def test_instances_whose_copies_predate_a_change_never_lock_one_key_twice_across_its_start(
    state: State, deployment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two instances (stores with their own copy of the recorded layouts) lock the same new keys at the
    same moments, from before a change to 4 shards until after it took effect: each key is locked once
    (an instance's copy is refreshed before the change starts; in the guard before it, nothing routes)."""
    from common.layouts import LayoutBook, LayoutChanging
    from state.lifecycle import WriteContext
    from state.schemas import KeyIn
    from state.store import StateStore

    monkeypatch.setenv(layouts.REFRESH_SETTING, "1")  # copies a second old: the change starts 2.5 s on
    deployment(1)
    tables = runtime.tables()
    stores = []
    for _ in range(2):  # each instance reads (and keeps) the recorded layout, half a second apart
        stores.append(StateStore(tables, layouts=LayoutBook(tables)))
        assert stores[-1].layout.shards == 1
        time.sleep(0.5)
    keys = [
        KeyIn.model_validate(new_key(entityId=880, itemKey=f"edge-{n:03d}")).record_key() for n in range(150)
    ]
    barrier = threading.Barrier(2)
    acquired: Counter[str] = Counter()
    refused_while_changing = Counter[int]()
    lock = threading.Lock()

    def instance(n: int) -> None:
        store = stores[n]
        for key in keys:
            barrier.wait(30)
            while True:
                try:
                    outcome = store.lock(key, WriteContext(), 60)
                    break
                except LayoutChanging:
                    with lock:
                        refused_while_changing[n] += 1
                    time.sleep(0.05)
            if outcome.acquired:
                with lock:
                    acquired[key.item_key] += 1
            time.sleep(0.03)

    threads = [threading.Thread(target=instance, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    changed = reshard(layouts.STATE, 4, wait=False)  # an operator's change, while both are locking
    for t in threads:
        t.join(120)
    assert acquired == Counter({k.item_key: 1 for k in keys}), acquired
    # and the change did take effect while they worked: later keys went to the new layout
    assert all(s.layout.shards == 4 for s in stores), changed
    assert sum(refused_while_changing.values()) >= 1


def test_a_recorded_layout_over_accounts_this_instance_lacks_is_refused_not_answered(
    state: State, deployment: Any
) -> None:
    # Given records under 4 shards, then a layout over 2 storage accounts recorded by an operator
    deployment(4)
    [key] = settle(state, 1, entity=990)
    changed = reshard(layouts.STATE, 4, accounts=2)
    # When an instance with one account (no SETTLE_TABLES_1) is asked about a key, once the change is in
    # force by its own clock
    deployment(4)
    wait_in_force(changed)
    answers = [state.exists(key), state.lock(new_key(entityId=990))]
    # Then it refuses with a 503 naming the missing setting, rather than answer from half the records
    for answer in answers:
        assert answer.status == 503, answer.json
        assert answer.json["type"] == "urn:settle:problem:layout-unavailable"
        assert answer.json["setting"] == "SETTLE_TABLES_1" and answer.json["recordedAccounts"] == 2
