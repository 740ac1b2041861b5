"""Two instances of one deployment with different shard settings, at once, as two OS processes against
the same Azurite tables (the rollout window of an app-settings change, or two slots set differently):
they follow the one recorded layout (common/layouts.py), so no key is locked twice and no parked hand-off
is handed out twice."""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common import layouts, runtime
from state.keys import STATE_TABLE, node_partition_range
from tests.state.conftest import State, new_key
from tests.support import children


def run_children(args_list: list[dict[str, Any]], timeout: float = 240) -> list[list[dict[str, Any]]]:
    return children.run_children(args_list, timeout, children.LAYOUT_CHILD)


@pytest.mark.parametrize("recorded_first", [False, True], ids=["first-deployment", "recorded"])
def test_two_processes_with_different_state_shards_never_both_lock_one_key(
    fresh_tables: str, call: Any, recorded_first: bool
) -> None:
    entity = 7000 + uuid.uuid4().int % 1000
    if recorded_first:
        # Given a deployment that already recorded S = 1 (its first instance wrote a record)
        assert State(call).lock(new_key(entityId=entity)).json["acquired"]
        runtime.reset()
    keys = [new_key(entityId=entity, itemKey=f"twin-{n:02d}") for n in range(30)]
    # When an instance with SETTLE_STATE_SHARDS=1 and one with 4 lock the same 30 keys at once
    start_at = time.time() + 6.0
    done = run_children(
        [{"mode": "state", "state_shards": s, "keys": keys, "start_at": start_at} for s in (1, 4)]
    )
    # Then every answer is an answer, and each key is locked by exactly one of them
    assert all(a["status"] == 200 for answers in done for a in answers), done
    acquired = Counter(a["itemKey"] for answers in done for a in answers if a["acquired"])
    assert acquired == Counter({k["itemKey"]: 1 for k in keys}), acquired


def test_two_processes_with_different_handoff_shards_never_hand_out_one_hand_off_twice(
    fresh_tables: str,
) -> None:
    # Given 12 hand-offs whose messages both instances deliver (each projects them in its own process)
    endpoint = "Twin-" + uuid.uuid4().hex[:8]
    base = datetime.now(UTC) - timedelta(hours=1)
    events = [
        {"eventId": f"ev-{n:02d}", "parkedAt": (base + timedelta(seconds=n)).isoformat()} for n in range(12)
    ]
    # When an instance with SETTLE_HANDOFF_SHARDS=1 and one with 4 project them and receive at once
    start_at = time.time() + 6.0
    common = {"mode": "handoff", "endpoint": endpoint, "events": events, "start_at": start_at}
    done = run_children([{**common, "handoff_shards": s, "receive_at": start_at + 8.0} for s in (1, 4)])
    # Then each parked hand-off is handed out exactly once, by one of them
    received = Counter(a["eventId"] for answers in done for a in answers)
    assert received == Counter({e["eventId"]: 1 for e in events}), received


def test_an_instance_paused_across_every_switch_never_makes_a_second_record_of_a_key(
    fresh_tables: str, call: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a deployment whose layout changes within a second of being written (both instances and this
    # process agree on the timings), recorded at S = 1 by a first lock
    timings = {"refresh": 0.3, "guard": 0.3, "margin": 0.2}
    monkeypatch.setenv(layouts.REFRESH_SETTING, "0.3")
    runtime.reset()
    entity = 8000 + uuid.uuid4().int % 1000
    assert State(call).lock(new_key(entityId=entity, itemKey="first")).json["acquired"]
    keys = [new_key(entityId=entity, itemKey=f"race-{n:04d}") for n in range(960)]
    # When two instances lock the same keys in the same order, 8 threads each, and the layout goes
    # 1 -> 4 -> 1 -> 2 -> 4 while instance B is paused (SIGSTOP) from just before each switch to after it
    race = {"mode": "race", "keys": keys, "threads": 8, "pace": 0.05, **timings}
    a, b = children.start(children.LAYOUT_CHILD, [{**race, "start_at": time.time() + 4.0}] * 2)
    time.sleep(5.5)
    paused = []
    for shards in (4, 1, 2, 4):
        changed = layouts.change(runtime.tables(), "state", shards, actor="test", reason="paused")
        since = changed.eras[-1].since.timestamp()
        time.sleep(max(0.0, since - 0.6 - time.time()))
        b.send_signal(signal.SIGSTOP)
        time.sleep(max(0.0, since + 1.0 - time.time()))
        b.send_signal(signal.SIGCONT)
        paused.append(shards)
    done = children.lines_of(children.finish([a, b], timeout=240))
    # Then every key was answered, locked by exactly one instance, and has one head in storage
    assert paused == [4, 1, 2, 4]
    failed = [x for answers in done for x in answers if x["status"] != 200]
    assert failed == []
    acquired = Counter(x["itemKey"] for answers in done for x in answers if x["acquired"])
    assert acquired == Counter({k["itemKey"]: 1 for k in keys}), {k: n for k, n in acquired.items() if n != 1}
    heads = Counter(
        str(r["RowKey"]).split("|")[1]
        for r in _node_rows(entity)
        if str(r["RowKey"]).endswith("|c") and "MovedTo" not in r
    )
    twins = {k["itemKey"]: heads[k["itemKey"]] for k in keys if heads[k["itemKey"]] != 1}
    assert twins == {}


def _node_rows(entity: int) -> list[dict[str, Any]]:
    low, high = node_partition_range(1, 4, entity)
    table = runtime.tables().table(STATE_TABLE)
    query = "PartitionKey ge @low and PartitionKey lt @high"
    return [dict(r) for r in table.query_entities(query, parameters={"low": low, "high": high})]
