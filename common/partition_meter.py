"""How fast this process writes each partition, so that a node or endpoint running near one partition's
budget is said out loud (``GET /api/v1/health``, ``GET /api/v1/layout``) instead of found by throttling.

One partition of Table Storage takes about ``PARTITION_ENTITIES_S`` entity writes a second (Azure's
published target; shared/reference/scale-targets.md); a lock + set writes ~6-8, so one partition carries
~250 items/s of one node (bench ``scaleout``). A layout of 1 shard is the default (ADR-0019): this meter is
how a deployment learns it needs more. It counts in memory (no I/O, a lock and a dict increment per write)
over windows of ``WINDOW_S``; it sees this instance's writes only, so several instances each below the
mark may together be above it (the figure is a floor).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PARTITION_ENTITIES_S = 2000
NEAR = 0.8  # warn from 80 % of the budget
WINDOW_S = 10.0


class PartitionMeter:
    """Entity writes per partition over the last full window (and the current one)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S) -> None:
        self._clock = clock
        self._window_s = window_s
        self._lock = threading.Lock()
        self._start = clock()
        self._counts: dict[str, int] = {}
        self._hot: dict[str, float] = {}  # partitions of the last full window at or above the mark

    def count(self, partition: str, entities: int) -> None:
        now = self._clock()
        with self._lock:
            if now - self._start >= self._window_s:
                self._roll(now)
            self._counts[partition] = self._counts.get(partition, 0) + entities

    def near_budget(self) -> dict[str, float]:
        """Partitions written at or above ``NEAR`` of the budget: entity writes per second."""
        now = self._clock()
        with self._lock:
            if now - self._start >= self._window_s:
                self._roll(now)
            elapsed = max(now - self._start, 1.0)
            current = {pk: n / elapsed for pk, n in self._counts.items()}
            hot = dict(self._hot)
        for pk, rate in current.items():
            if rate >= NEAR * PARTITION_ENTITIES_S:
                hot[pk] = max(rate, hot.get(pk, 0.0))
        return hot

    def _roll(self, now: float) -> None:
        elapsed = now - self._start
        mark = NEAR * PARTITION_ENTITIES_S
        self._hot = {pk: n / elapsed for pk, n in self._counts.items() if n / elapsed >= mark}
        self._counts = {}
        self._start = now


METER = PartitionMeter()


def warnings() -> list[str]:
    """What health says about partitions near their budget (no partition names: health is anonymous)."""
    hot = METER.near_budget()
    if not hot:
        return []
    top = max(hot.values())
    return [
        f"{len(hot)} partition(s) written near one partition's budget by this instance (up to ~{top:,.0f} "
        f"entity writes/s of ~{PARTITION_ENTITIES_S:,}): a node or endpoint needs more shards. See "
        "GET /api/v1/layout (hotPartitions) and docs/tables.md, 'Changing the layout'."
    ]
