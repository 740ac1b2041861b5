"""Helpers for the state suites: unique keys and calling the state functions by operation name."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.conftest import Caller, HttpResult


def new_key(**overrides: Any) -> dict[str, Any]:
    key: dict[str, Any] = {
        "tenantId": 1,
        "scopeId": 4,
        "entityId": 42,
        "itemKey": f"INV-{uuid.uuid4().hex[:10]}",
        "itemEntityKey": "invoice",
    }
    key.update(overrides)
    return key


class State:
    """``state.lock(key, ...)`` calls the ``state_lock`` function the way the worker does."""

    def __init__(self, call: Caller) -> None:
        self._call = call

    def __getattr__(self, operation: str) -> Any:
        name = "state_lock_extend" if operation == "extend" else f"state_{operation}"

        def invoke(key: dict[str, Any] | None = None, **body: Any) -> HttpResult:
            if key is not None:
                body["key"] = key
            return self._call(name, body)

        return invoke


@pytest.fixture
def state(call: Caller) -> State:
    return State(call)


@pytest.fixture
def key() -> dict[str, Any]:
    return new_key()
