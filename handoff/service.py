"""Process-wide hand-off services: the one place that builds them, lazily, and drops them on reset.

The Functions, the benchmark and the reliability suites all go through these accessors, so they share
one store, one transport (one Service Bus client) and one resolver per process (the operator API builds
its own on these, a layer above: ``management/services.py``). The transport is looked up at each use by
settlement, the reconciler and the resolver's redelivery alike, so :func:`use_transport` changes it for
all of them at once.

Each service's module is imported inside its accessor, so the worker's indexing of the app loads none of them.
"""

from __future__ import annotations

import threading
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
_store: HandoffStore | None = None
_transport: Transport | None = None
_resolver: ResolverService | None = None
_settlement: SettlementService | None = None
_receive: ReceiveService | None = None


def store() -> HandoffStore:
    global _store
    with _lock:
        if _store is None:
            from handoff.store import HandoffStore

            _store = HandoffStore(runtime.tables())
        return _store


def transport() -> Transport:
    """The control-message transport chosen from the environment (see :mod:`handoff.transport`)."""
    global _transport
    with _lock:
        if _transport is None:
            from handoff.transport import transport_from_env

            _transport = transport_from_env(lambda msg: resolver_service().handle(msg))
        return _transport


def _redelivery() -> Redelivery | None:
    """The resolver reschedules copies through the transport when it can (Service Bus)."""
    current = transport()
    return current if hasattr(current, "schedule_copy") else None  # type: ignore[return-value]


def settlement_service() -> SettlementService:
    global _settlement
    with _lock:
        if _settlement is None:
            from handoff.settlement import SettlementService

            _settlement = SettlementService(store(), transport)
        return _settlement


def resolver_service() -> ResolverService:
    global _resolver
    with _lock:
        if _resolver is None:
            from handoff.resolver import ResolverService

            _resolver = ResolverService(store(), redelivery=_redelivery)
        return _resolver


def receive_service() -> ReceiveService:
    global _receive
    with _lock:
        if _receive is None:
            from handoff.receive import ReceiveService

            _receive = ReceiveService(store())
        return _receive


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
    global _transport
    with _lock:
        _transport = replacement


def reset() -> None:
    """Forget every service (their clients are rebuilt from the environment on next use)."""
    global _store, _transport, _resolver, _settlement, _receive
    with _lock:
        if _transport is not None:
            close = getattr(_transport, "close", None)
            if close is not None:
                close()
        _store = _transport = _resolver = _settlement = _receive = None


runtime.on_reset(reset)


def _follow_the_recorded_layout() -> None:
    """Every hand-off key routes by the layout recorded in storage (common/layouts.py), not the setting."""

    keys.follow(recorded_counts)


_follow_the_recorded_layout()
