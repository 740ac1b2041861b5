"""The process-wide objects the Functions share, built lazily on first use (never at import).

Tests and the benchmark call :func:`reset` to rebuild them from a changed environment, optionally with
extra azure-core policies (fault injection).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from common.settings import TableSettings
from common.tables import Tables

_lock = threading.Lock()
_tables: Tables | None = None
_policies: list[Any] = []


def tables() -> Tables:
    global _tables
    if _tables is None:
        with _lock:
            if _tables is None:
                _tables = Tables(TableSettings.from_env(), policies=_policies)
    return _tables


def reset(*, policies: Sequence[Any] = ()) -> None:
    """Forget every cached client; the next use re-reads settings (and uses ``policies``)."""
    global _tables, _policies
    with _lock:
        if _tables is not None:
            _tables.close()
        _tables = None
        _policies = list(policies)
    for hook in list(_reset_hooks):
        hook()


_reset_hooks: list[Any] = []


def on_reset(hook: Any) -> None:
    """Let a package drop its own cached services when :func:`reset` runs."""
    _reset_hooks.append(hook)
