"""Two instances of one deployment with different shard settings, at once, as two OS processes against
the same Azurite tables (the rollout window of an app-settings change, or two slots set differently):
they follow the one recorded layout (common/layouts.py), so no key is locked twice and no parked hand-off
is handed out twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from common import runtime
from tests.state.conftest import State, new_key

ROOT = Path(__file__).resolve().parents[2]


def run_children(args_list: list[dict[str, Any]], timeout: float = 240) -> list[list[dict[str, Any]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.layout_child", json.dumps(args)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in args_list
    ]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        answers.append([json.loads(line) for line in out.splitlines()])
    return answers


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
