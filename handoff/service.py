"""Process-wide hand-off services: the one place that builds them, lazily, and drops them on reset.

The Functions, the benchmark and the reliability suites all go through these accessors, so they share
one store, one transport (one Service Bus client) and one resolver per process (the operator API builds
its own on these, a layer above: ``management/services.py``). The transport is looked up at each use by
settlement, the reconciler and the resolver's redelivery alike, so :func:`use_transport` changes it for
all of them at once.

Each service's module is imported inside its builder, so the worker's indexing of the app loads none of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from common import runtime
from handoff import keys
from handoff.layout import recorded_counts

if TYPE_CHECKING:
    from handoff.overview import Overview
    from handoff.receive import ReceiveService
    from handoff.reconciler import Reconciler
    from handoff.resolver import Redelivery, ResolverService
    from handoff.settlement import SettlementService
    from handoff.store import HandoffStore
    from handoff.sweeper import Sweeper
    from handoff.transport import Transport

_lock = threading.RLock()


class _Built[T]:
    """One service per process: built by ``build`` on first use (under the lock), dropped by :func:`reset`."""

    def __init__(self, build: Callable[[], T]) -> None:
        self.build = build
        self.value: T | None = None

    def __call__(self) -> T:
        with _lock:
            if self.value is None:
                self.value = self.build()
            return self.value


def _new_store() -> HandoffStore:
    from handoff.store import HandoffStore

    return HandoffStore(runtime.tables())


def _new_transport() -> Transport:
    from handoff.transport import transport_from_env

    return transport_from_env(lambda msg: resolver_service().handle(msg))


def _redelivery() -> Redelivery | None:
    """The resolver reschedules copies through the transport when it can (Service Bus)."""
    current = transport()
    return current if hasattr(current, "schedule_copy") else None  # type: ignore[return-value]


def _new_settlement() -> SettlementService:
    from handoff.settlement import SettlementService

    return SettlementService(store(), transport)


def _new_resolver() -> ResolverService:
    from handoff.resolver import ResolverService

    return ResolverService(store(), redelivery=_redelivery)


def _new_receive() -> ReceiveService:
    from handoff.receive import ReceiveService

    return ReceiveService(store())


store = _Built(_new_store)
# The control-message transport chosen from the environment (see :mod:`handoff.transport`).
transport = _Built(_new_transport)
settlement_service = _Built(_new_settlement)
resolver_service = _Built(_new_resolver)
receive_service = _Built(_new_receive)
_SERVICES = (store, transport, settlement_service, resolver_service, receive_service)


def sweeper() -> Sweeper:
    from handoff.sweeper import Sweeper

    return Sweeper(settlement_service())


def reconciler() -> Reconciler:
    from handoff.reconciler import Reconciler

    return Reconciler(settlement_service())


def overview() -> Overview:
    from handoff.overview import Overview

    return Overview(store())


def use_transport(replacement: Transport) -> None:
    """Replace the transport (tests capture sent messages; the benchmark injects faults)."""
    with _lock:
        transport.value = replacement


def reset() -> None:
    """Forget every service (their clients are rebuilt from the environment on next use)."""
    with _lock:
        if transport.value is not None:
            close = getattr(transport.value, "close", None)
            if close is not None:
                close()
        for built in _SERVICES:
            built.value = None


runtime.on_reset(reset)


def _follow_the_recorded_layout() -> None:
    """Every hand-off key routes by the layout recorded in storage (common/layouts.py), not the setting."""

    keys.follow(recorded_counts)


_follow_the_recorded_layout()
