"""Writers on threads of their own, one storage call at a time in an order a test draws: the timing tests'
harness over the in-memory table's gate (``tests/support/memory_table.py``).

Each writer runs on a thread named ``writer-<n>``; before each of its calls the table's gate holds it until
``Turns`` grants it the next step, so a drawn schedule decides which call lands first and every interleaving
of the writers' reads and writes is reachable, deterministically and without sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tests.support.memory_table import MemoryTables


class Turns:
    """Lets one writer thread make one storage call at a time, in the order ``schedule`` draws: at each step
    the writers still running are all waiting at the table's gate, and the drawn one goes."""

    def __init__(self, schedule: list[int], writers: int) -> None:
        self._schedule = list(schedule)
        self._cv = threading.Condition()
        self._waiting: set[int] = set()
        self._finished: set[int] = set()
        self._turn: int | None = None
        self._writers = writers
        self.steps: list[tuple[int, str]] = []

    def gate(self, call: str, args: tuple[Any, ...]) -> None:
        name = threading.current_thread().name
        if not name.startswith("writer-"):
            return  # the test's own reads
        me = int(name.split("-")[1])
        with self._cv:
            self._waiting.add(me)
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn == me)
            self._turn = None
            self._waiting.discard(me)
            self.steps.append((me, call))

    def finished(self, me: int) -> None:
        with self._cv:
            self._finished.add(me)
            self._cv.notify_all()

    def _ready(self) -> bool:
        """No call under way: every writer is at the gate or finished."""
        return self._turn is None and len(self._waiting) + len(self._finished) == self._writers

    def run(self) -> None:
        """Grant turns until every writer has finished."""
        with self._cv:
            while len(self._finished) < self._writers:
                assert self._cv.wait_for(self._ready, timeout=10), (
                    "a writer neither called storage nor finished"
                )
                if len(self._finished) == self._writers:
                    break
                waiting = sorted(self._waiting)
                drawn = self._schedule.pop(0) if self._schedule else 0
                self._turn = waiting[drawn % len(waiting)]
                self._cv.notify_all()


def interleave(
    tables: MemoryTables, writers: int, writer: Callable[[int], None], schedule: list[int]
) -> Turns:
    """Run ``writer(0)`` to ``writer(writers - 1)`` at once, each on a thread of its own, one storage call per
    step of ``schedule``; return when all have finished (a writer keeps its own outcome, errors included)."""
    turns = Turns(schedule, writers)
    tables.gate = turns.gate

    def run(n: int) -> None:
        try:
            writer(n)
        finally:
            turns.finished(n)

    threads = [threading.Thread(target=run, args=(n,), name=f"writer-{n}") for n in range(writers)]
    for t in threads:
        t.start()
    turns.run()
    for t in threads:
        t.join(10)
    tables.gate = None
    return turns
