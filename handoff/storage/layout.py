"""The hand-off layout a process routes by: the one recorded in storage (``common/layouts.py``, family
``handoff``), as a :class:`handoff.storage.keys.Layout`, kept from call to call (no request per call).

The composition root (``handoff/service.py``) builds one :class:`RecordedLayout` over the process's
layout book and hands it to the store; every key that depends on the layout is routed through the store.
A test or a tool routes by a layout of its own by handing the store a ``Layout`` (its own source) or any
object with the same two methods (:class:`LayoutSource`)."""

from __future__ import annotations

import threading
from typing import Protocol

from common.layouts import HANDOFF, InForce, LayoutBook
from handoff.storage.keys import Layout, configured_previous_shard_counts, configured_shard_count


class LayoutSource(Protocol):
    """Where a store reads the layout it routes by."""

    def now(self) -> Layout:
        """The layout in force now (503 ``layout-changing`` in the moment before a change takes effect)."""
        ...

    def forget(self) -> None:
        """Drop the process's copy of the layout: a claim of a newer one was met (``common/fence.py``)."""
        ...


def configured() -> list[tuple[int, int]]:
    """The layouts the settings describe (``SETTLE_HANDOFF_SHARDS``, ``..._PREVIOUS``), oldest first."""
    earlier = [(s, 1) for s in configured_previous_shard_counts()]
    return [*earlier, (configured_shard_count(), 1)]


def layout_of(in_force: InForce) -> Layout:
    """The hand-off layout of a recorded era and the earlier ones: S now, the earlier values of S newest
    first (the likeliest home of a miss), and the era's index."""
    current = in_force.current.shards
    earlier: list[int] = []
    for era in reversed(in_force.earlier):
        if era.shards != current and era.shards not in earlier:
            earlier.append(era.shards)
    return Layout(current, tuple(earlier), era=len(in_force.earlier))


class RecordedLayout:
    """``now()``: the recorded hand-off layout in force, read through ``book`` (recording the settings'
    layout first when none is); ``forget()`` drops the book's copy, so the next call reads it again."""

    def __init__(self, book: LayoutBook) -> None:
        self._book = book
        self._lock = threading.Lock()
        self._last: tuple[InForce, Layout] | None = None

    def now(self) -> Layout:
        in_force = self._book.in_force(HANDOFF, configured)
        last = self._last
        if last is not None and last[0] == in_force:
            return last[1]
        layout = layout_of(in_force)
        with self._lock:
            self._last = (in_force, layout)
        return layout

    def forget(self) -> None:
        self._book.invalidate()
