"""The state layout a process routes by: the one recorded in storage (``common/layouts.py``, family
``state``), as a :class:`state.keys.Layout`, kept from call to call (no request per call)."""

from __future__ import annotations

import threading

from common.layouts import STATE, InForce, LayoutBook, LayoutUnavailable
from state.keys import Layout


class RecordedLayouts:
    """``now()``: the recorded state layout in force, over ``accounts`` configured storage accounts."""

    def __init__(self, book: LayoutBook, accounts: int, *, fixed: Layout | None = None) -> None:
        self._book = book
        self._fixed = fixed  # a layout given by the caller (bench, tests): storage is not asked
        self._accounts = accounts
        self._lock = threading.Lock()
        self._last: tuple[InForce, Layout] | None = None

    def configured(self) -> list[tuple[int, int]]:
        """The layouts the settings describe (``SETTLE_STATE_SHARDS``, ``..._PREVIOUS``), oldest first."""
        return Layout.from_env(accounts=self._accounts).eras()

    def forget(self) -> None:
        """Drop this process's copy of the recorded layouts: the next call reads them (``common/fence.py``:
        a claim of a newer layout was met)."""
        if self._fixed is None:
            self._book.invalidate()

    def now(self) -> Layout:
        if self._fixed is not None:
            return self._fixed
        in_force = self._book.in_force(STATE, self.configured)
        last = self._last
        if last is not None and last[0] == in_force:
            return last[1]
        layout = self._layout_of(in_force)
        with self._lock:
            self._last = (in_force, layout)
        return layout

    def _layout_of(self, in_force: InForce) -> Layout:
        eras = [*in_force.earlier, in_force.current]
        needed = max((e.accounts for e in eras if e.shards > 1), default=1)
        if needed > self._accounts:
            # Records of the layout live in accounts this instance cannot reach: answering would hide them.
            raise LayoutUnavailable(
                f"The recorded state layout spreads records over {needed} storage accounts; this instance "
                f"has {self._accounts} (SETTLE_TABLES_{self._accounts} is missing). Nothing is answered "
                "from a layout that hides records.",
                setting=f"SETTLE_TABLES_{self._accounts}",
                recordedAccounts=needed,
            )
        current = in_force.current
        return Layout.of_eras(
            (current.shards, current.accounts), [(e.shards, e.accounts) for e in in_force.earlier]
        )
