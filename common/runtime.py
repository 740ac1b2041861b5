"""The process-wide objects the Functions share, built lazily on first use (never at import).

Tests and the benchmark call :func:`reset` to rebuild them from a changed environment, optionally with
extra azure-core policies (fault injection).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common.settings import TableSettings
from common.tables import Tables

_lock = threading.Lock()
_tables: Tables | None = None
_policies: list[Any] = []
_client_options: dict[str, Any] = {}


def tables() -> Tables:
    global _tables
    if _tables is None:
        with _lock:
            if _tables is None:
                _tables = Tables(TableSettings.from_env(), policies=_policies, client_options=_client_options)
    return _tables


def reset(*, policies: Sequence[Any] = (), client_options: Mapping[str, Any] | None = None) -> None:
    """Forget every cached client; the next use re-reads settings (and uses ``policies``).

    ``client_options`` are extra azure-core client keywords, e.g. ``{"retry_total": 0}`` to switch the
    SDK's own retries off (fault-injection tests).
    """
    global _tables, _policies, _client_options
    with _lock:
        if _tables is not None:
            _tables.close()
        _tables = None
        _policies = list(policies)
        _client_options = dict(client_options or {})
    for hook in list(_reset_hooks):
        hook()


_reset_hooks: list[Any] = []


def on_reset(hook: Any) -> None:
    """Let a package drop its own cached services when :func:`reset` runs."""
    _reset_hooks.append(hook)


class Lazy[T]:
    """A process-wide object ``build()`` makes on first use; :func:`reset` drops it (``close`` is called
    on it first, when given), and the next use builds it again (from the changed environment)."""

    def __init__(self, build: Callable[[], T], *, close: Callable[[T], None] | None = None) -> None:
        self._build = build
        self._close = close
        self._lock = threading.Lock()
        self._value: T | None = None
        on_reset(self.drop)

    def __call__(self) -> T:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._build()
                value = self._value
        return value

    def built(self) -> T | None:
        """The object when it has been built, else None (never builds it)."""
        return self._value

    def replace(self, value: T) -> None:
        """Use ``value`` from now on, until the next drop (tests and the benchmark inject one)."""
        with self._lock:
            self._value = value

    def drop(self) -> None:
        with self._lock:
            value, self._value = self._value, None
        if value is not None and self._close is not None:
            self._close(value)
