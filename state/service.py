"""Wiring: the process-wide state objects, built on first use and dropped on ``runtime.reset()``.

The store, its handlers and catch-up are imported on first use, not when the function app is indexed
(a shorter cold start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common import runtime

if TYPE_CHECKING:
    from state.catchup import Catchup
    from state.handlers import StateHandler
    from state.schemas import HandlerIn
    from state.store import StateStore


def _new_store() -> StateStore:
    from common import layouts
    from state.store import StateStore

    return StateStore(runtime.tables(), layouts=layouts.book())


store = runtime.Lazy(_new_store)


def handler(config: HandlerIn) -> StateHandler:
    """The handler a request's ``handler.key`` selects."""
    from state.handlers import BuiltInHandler, NullHandler

    if config.key == "null":
        return NullHandler()
    return BuiltInHandler(store())


def catchup() -> Catchup:
    from state.catchup import Catchup

    return Catchup(store())
