"""Wiring: the process-wide state objects, built on first use and dropped on ``runtime.reset()``."""

from __future__ import annotations

import threading

from common import runtime
from state.catchup import Catchup
from state.expiry import ExpiryIndex
from state.handlers import BuiltInHandler, NullHandler, StateHandler
from state.schemas import HandlerIn
from state.store import StateStore

_lock = threading.Lock()
_store: StateStore | None = None
_NULL = NullHandler()


def store() -> StateStore:
    global _store
    if _store is None:
        with _lock:
            if _store is None:
                tables = runtime.tables()
                _store = StateStore(tables, ExpiryIndex(tables))
    return _store


def handler(config: HandlerIn) -> StateHandler:
    """The handler a request's ``handler.key`` selects."""
    if config.key == "null":
        return _NULL
    return BuiltInHandler(store())


def catchup() -> Catchup:
    s = store()
    return Catchup(s, s.expiry)


def _reset() -> None:
    global _store
    with _lock:
        if _store is not None:
            _store.expiry.close()
        _store = None


runtime.on_reset(_reset)
