"""The shard layout in force is the one recorded in storage (common/layouts.py), not each instance's
setting: an instance whose ``SETTLE_STATE_SHARDS`` disagrees never answers from a layout that hides
records (a settled key answers ``exists: true`` and refuses a lock), and a change is one explicit step."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from common import layouts, runtime
from state import service
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
