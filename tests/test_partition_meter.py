"""A partition written near its budget is said out loud (common/partition_meter.py): health warns without
naming it (health is anonymous), the operators' layout view names it; a quiet partition says nothing."""

from __future__ import annotations

from typing import Any

import pytest

from common import partition_meter
from common.partition_meter import PARTITION_ENTITIES_S, PartitionMeter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_partition_near_its_budget_is_reported_and_a_quiet_one_is_not() -> None:
    clock = Clock()
    meter = PartitionMeter(clock=clock, window_s=10)
    for second in range(10):  # 10 s: a hot partition at 1,700 entities/s, a quiet one at 100
        clock.now = second
        meter.count("1|4|42", 1700)
        meter.count("1|4|7", 100)
    clock.now = 10.5
    assert meter.near_budget() == {"1|4|42": pytest.approx(1700, rel=0.06)}
    clock.now = 30  # two quiet windows later it is no longer reported
    meter.count("1|4|42", 1)
    clock.now = 41
    assert meter.near_budget() == {}


def test_health_warns_without_naming_the_partition(call: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert call("health", method="GET").json["warnings"] == []
    clock = Clock()
    meter = PartitionMeter(clock=clock, window_s=10)
    meter.count("1|4|42.004-001", int(PARTITION_ENTITIES_S * 0.9 * 10))
    clock.now = 10
    monkeypatch.setattr(partition_meter, "METER", meter)
    [warning] = call("health", method="GET").json["warnings"]
    assert "near one partition's budget" in warning and "1|4|42" not in warning


def test_the_operators_overview_warns_too(call: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    meter = PartitionMeter(clock=clock, window_s=10)
    meter.count("Billing~004-002", int(PARTITION_ENTITIES_S * 0.85 * 10))
    clock.now = 10
    monkeypatch.setattr(partition_meter, "METER", meter)
    overview = call("endpoints_overview", method="GET")
    assert overview.status == 200, overview.body
    assert any("near one partition's budget" in w for w in overview.json["warnings"])
