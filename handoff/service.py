"""Process-wide hand-off services, built lazily from ``common.runtime.tables()`` and dropped on reset.

The Functions, the benchmark and the reliability suites all go through these accessors, so they share
one store, one transport (one Service Bus client) and one resolver per process.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from common import runtime

if TYPE_CHECKING:
    from handoff.receive import ReceiveService
    from handoff.resolver import ResolverService
    from handoff.settlement import SettlementService
    from handoff.store import HandoffStore
    from handoff.sweeper import Sweeper
    from handoff.transport import Transport

_lock = threading.RLock()
_store: HandoffStore | None = None
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


def settlement_service() -> SettlementService:
    """Settlement with the transport chosen from the environment (see :mod:`handoff.transport`)."""
    global _settlement
    with _lock:
        if _settlement is None:
            from handoff.settlement import SettlementService
            from handoff.transport import transport_from_env

            _settlement = SettlementService(
                store(), transport_from_env(lambda msg: resolver_service().handle(msg))
            )
        return _settlement


def resolver_service() -> ResolverService:
    """The resolver; it reschedules copies through Service Bus when Service Bus is configured."""
    global _resolver
    with _lock:
        if _resolver is None:
            from handoff.resolver import ResolverService
            from handoff.transport import ServiceBusTransport

            transport = settlement_service().transport
            redelivery = transport if isinstance(transport, ServiceBusTransport) else None
            _resolver = ResolverService(store(), redelivery=redelivery)
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


def use_transport(transport: Transport) -> None:
    """Replace the settlement transport (tests capture sent messages; the benchmark injects faults)."""
    settlement_service().transport = transport


def reset() -> None:
    """Forget every service (their clients are rebuilt from the environment on next use)."""
    global _store, _resolver, _settlement, _receive
    with _lock:
        if _settlement is not None:
            close = getattr(_settlement.transport, "close", None)
            if close is not None:
                close()
        _store = _resolver = _settlement = _receive = None


runtime.on_reset(reset)
