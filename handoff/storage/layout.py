"""The hand-off layout a process routes by: the one recorded in storage (``common/layouts.py``, family
``handoff``), as S now and the earlier values of S still read (``handoff/storage/keys.py`` "Sharded
endpoints")."""

from __future__ import annotations

import threading

from common import layouts
from common.layouts import HANDOFF, InForce
from handoff.storage import keys


def configured() -> list[tuple[int, int]]:
    """The layouts the settings describe (``SETTLE_HANDOFF_SHARDS``, ``..._PREVIOUS``), oldest first."""
    earlier = [(s, 1) for s in keys.configured_previous_shard_counts()]
    return [*earlier, (keys.configured_shard_count(), 1)]


_lock = threading.Lock()
_last: tuple[InForce, tuple[int, tuple[int, ...]]] | None = None


def recorded_era() -> int:
    """The index of the recorded layout in force (how many came before it): a claim's ``Era``."""
    return len(layouts.book().in_force(HANDOFF, configured).earlier)


def forget() -> None:
    """Drop this process's copy of the recorded layouts (the next call reads them)."""
    layouts.book().invalidate()


def recorded_counts() -> tuple[int, tuple[int, ...]]:
    """(S, earlier values of S) of the recorded layout in force now (kept: no request per call)."""
    global _last
    in_force = layouts.book().in_force(HANDOFF, configured)
    last = _last
    if last is not None and last[0] == in_force:
        return last[1]
    current = in_force.current.shards
    earlier: list[int] = []
    for era in reversed(in_force.earlier):  # newest earlier layout first: the likeliest home of a miss
        if era.shards != current and era.shards not in earlier:
            earlier.append(era.shards)
    counts = (current, tuple(earlier))
    with _lock:
        _last = (in_force, counts)
    return counts
