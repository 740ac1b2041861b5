"""Helpers for tests that change a recorded shard layout (common/layouts.py) the explicit way."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from common import layouts, runtime
from common.clock import earliest_now


def fast_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layouts recorded from now on refresh every 0.2 s, so a change takes effect within about a second
    (the guard and margin shrink with it: one process, one clock)."""
    monkeypatch.setenv(layouts.REFRESH_SETTING, "0.2")
    monkeypatch.setattr(layouts, "GUARD_S", 0.3)
    monkeypatch.setattr(layouts, "MARGIN_S", 0.2)


def reshard(family: str, shards: int, *, accounts: int = 1, wait: bool = True) -> layouts.Recorded:
    """Change ``family``'s recorded layout as an operator does, and (``wait``) until it is in force."""
    changed = layouts.change(
        runtime.tables(), family, shards, accounts=accounts, actor="test", reason="a test's layout change"
    )
    if wait:
        wait_in_force(changed)
    return changed


def wait_in_force(changed: layouts.Recorded) -> None:
    """Wait until ``changed``'s newest era has started by this process's storage clock. A new instance
    (runtime.reset) calibrates its clock afresh, and its earliest bound may lie before the last one's: so
    wait again after starting one, or its first call may still fall in the guard before the change. The
    half second beyond the start absorbs a bound that a later reading of the storage clock moves back."""
    while earliest_now() < changed.eras[-1].since + timedelta(seconds=0.5):
        time.sleep(0.05)
    layouts.book().invalidate()
