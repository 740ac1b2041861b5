"""Wiring: the process-wide state objects, built on first use and dropped on ``runtime.reset()``.

The store, its handlers and catch-up are imported on first use, not when the function app is indexed
(a shorter cold start).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from common import runtime

if TYPE_CHECKING:
    from state.catchup import Catchup
    from state.handlers import StateHandler
    from state.schemas import HandlerIn
    from state.store import StateStore

_lock = threading.Lock()
_store: StateStore | None = None


def store() -> StateStore:
    global _store
    if _store is None:
        with _lock:
            if _store is None:
                from common import layouts
                from state.store import StateStore

                _store = StateStore(runtime.tables(), layouts=layouts.book())
    return _store


def handler(config: HandlerIn) -> StateHandler:
    """The handler a request's ``handler.key`` selects."""
    from state.handlers import BuiltInHandler, NullHandler

    if config.key == "null":
        return NullHandler()
    return BuiltInHandler(store())


def catchup() -> Catchup:
    from state.catchup import Catchup

    return Catchup(store())


def _reset() -> None:
    global _store
    with _lock:
        _store = None


runtime.on_reset(_reset)
