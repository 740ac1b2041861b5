"""The composition root of the operator API: its services, built on the process-wide hand-off services.

The operator's reads (:class:`management.reads.OperatorReads`) sit on the hand-off store and its overview;
operator actions and the poison desk join hand-off's settlement and resolver to management's rules (who
may act, what is audited), so they are built here, above both: ``handoff`` imports nothing from
``management``. They hold no state of their own; each call builds one on the shared store and transport
(:mod:`handoff.service`), so a reset or a replaced transport reaches them at once.

The services are imported inside their accessors, so the worker's indexing of the app loads none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from handoff import service

if TYPE_CHECKING:
    from management.actions import OperatorActions
    from management.poison import PoisonDesk
    from management.reads import OperatorReads


def operator_actions() -> OperatorActions:
    from management.actions import OperatorActions  # on first use, not at indexing (cold start)

    return OperatorActions(service.settlement_service())


def poison_desk() -> PoisonDesk:
    from management.poison import PoisonDesk  # on first use, not at indexing (cold start)

    return PoisonDesk(service.store(), service.resolver_service)


def operator_reads() -> OperatorReads:
    from management.reads import OperatorReads  # on first use, not at indexing (cold start)

    return OperatorReads(service.store(), service.overview())
