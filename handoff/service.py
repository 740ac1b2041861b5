"""Process-wide hand-off services: the one place that builds them, lazily, and drops them on reset.

The Functions, the benchmark and the reliability suites all go through these accessors, so they share
one store, one transport (one Service Bus client) and one resolver per process (the operator API builds
its own on these, a layer above: ``management/services.py``). The transport is looked up at each use by
settlement, the reconciler and the resolver's redelivery alike, so :func:`use_transport` changes it for
all of them at once.

Each service's module is imported inside its builder, so the worker's indexing of the app loads none of them.
The layout the keys route by is built here too (:data:`layout`: the one recorded in storage, read through
the process's layout book) and handed to the store, which routes every key that depends on it; nothing is
installed into another module. A test routes the process by a layout of its own with
``layout.replace(Layout(...))`` before the store is built (``runtime.reset()`` drops both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common import runtime

if TYPE_CHECKING:
    from handoff.messages.transport import Transport
    from handoff.projection.resolver import Redelivery, ResolverService
    from handoff.receive.receiver import ReceiveService
    from handoff.settlement.settler import SettlementService
    from handoff.storage.layout import LayoutSource
    from handoff.storage.overview import Overview
    from handoff.storage.store import HandoffStore
    from handoff.timers.reconciler import Reconciler
    from handoff.timers.sweeper import Sweeper, SweepReport


def _new_layout() -> LayoutSource:
    from common import layouts
    from handoff.storage.layout import RecordedLayout

    return RecordedLayout(layouts.book())


def _new_store() -> HandoffStore:
    from handoff.storage.store import HandoffStore

    return HandoffStore(runtime.tables(), layout())


def _new_transport() -> Transport:
    from handoff.messages.transport import transport_from_env

    return transport_from_env(lambda msg: resolver_service().handle(msg))


def _redelivery() -> Redelivery | None:
    """The resolver reschedules copies through the transport when it can (Service Bus)."""
    current = transport()
    return current if hasattr(current, "schedule_copy") else None  # type: ignore[return-value]


def _new_settlement() -> SettlementService:
    from handoff.settlement.settler import SettlementService

    return SettlementService(store(), transport)


def _new_resolver() -> ResolverService:
    from handoff.projection.resolver import ResolverService

    return ResolverService(store(), redelivery=_redelivery)


def _new_receive() -> ReceiveService:
    from handoff.receive.receiver import ReceiveService

    return ReceiveService(store())


def _close(transport: Transport) -> None:
    close = getattr(transport, "close", None)
    if close is not None:
        close()


# The hand-off layout every key routes by (``handoff/storage/layout.py``): the one recorded in storage.
layout = runtime.Lazy(_new_layout)
store = runtime.Lazy(_new_store)
# The control-message transport chosen from the environment (see :mod:`handoff.messages.transport`).
transport = runtime.Lazy(_new_transport, close=_close)
settlement_service = runtime.Lazy(_new_settlement)
resolver_service = runtime.Lazy(_new_resolver)
receive_service = runtime.Lazy(_new_receive)
_SERVICES = (layout, store, transport, settlement_service, resolver_service, receive_service)


def sweeper() -> Sweeper:
    from handoff.timers.sweeper import Sweeper

    return Sweeper(settlement_service())


def reconciler() -> Reconciler:
    from handoff.timers.reconciler import Reconciler

    return Reconciler(settlement_service())


def overview() -> Overview:
    from handoff.storage.overview import Overview

    return Overview(store())


def timer_tick(*, sweeping: bool, gauges: bool) -> SweepReport | None:
    """One tick of the ``handoff_sweeper`` timer (:func:`handoff.timers.sweeper.tick`), wired to this
    process's services: the sweep only when ``sweeping``, the parked gauges only when ``gauges``."""
    from handoff.timers.sweeper import tick

    return tick(
        store(),
        reconciler(),
        overview().fold_all,
        sweeper() if sweeping else None,
        gauges_at=settlement_service().clock if gauges else None,
    )


def use_transport(replacement: Transport) -> None:
    """Replace the transport (tests capture sent messages; the benchmark injects faults)."""
    transport.replace(replacement)


def reset() -> None:
    """Forget every hand-off service (their clients are rebuilt from the environment on next use); the
    transport is closed first. :func:`common.runtime.reset` drops them too."""
    for built in _SERVICES:
        built.drop()
