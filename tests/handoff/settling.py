"""One parked hand-off on the in-memory table and the real ``SettlementService`` over it (no storage, no
broker): the fixtures of the settlement's rule tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from common.clock import iso
from handoff.messages.contract import Coordinates, MessageType
from handoff.settlement.settler import Settlement, SettlementService
from handoff.storage import keys
from handoff.storage.keys import Layout
from handoff.storage.records import ClaimRow, EventRow, QueueRow
from handoff.storage.store import HandoffStore

from .claim_rows import CLAIM_KEY, EVENT, PARKED, PK, QUEUE_KEY, T0, parked
from .memory_table import MemoryTable


@dataclass
class Transport:
    """Records what is sent; ``fail`` is raised instead (after recording the attempt)."""

    fail: Exception | None = None
    sent: list[Any] = field(default_factory=list)
    name: str = "test"

    @property
    def duplicate_window(self) -> timedelta | None:
        return timedelta(minutes=10)

    def send(self, topic: str, message: Any) -> None:
        self.sent.append((topic, message))
        if self.fail is not None:
            raise self.fail


@dataclass
class Clock:
    """The claim is taken at ``T0``; every later reading is ``T0 + later``."""

    later: timedelta = timedelta(0)
    readings: int = 0

    def __call__(self) -> datetime:
        self.readings += 1
        return T0 if self.readings == 1 else T0 + self.later


def hand_off(row: EventRow | None = None) -> MemoryTable:
    table = MemoryTable()
    park = row or parked(etag=None)
    table.submit([("create", park.to_entity(PK, keys.event_row(EVENT)))])
    queue = QueueRow(event_id=EVENT, parked_message_id=PARKED)
    table.submit([("create", queue.to_entity(PK, QUEUE_KEY))])
    return table


# The hand-off keys route by S = 1 with no earlier layout (no recorded layout is read: no storage).
ONE_PARTITION = Layout()


def settler(
    table: MemoryTable, transport: Transport, clock: Clock | None = None, *, layout: Layout = ONE_PARTITION
) -> SettlementService:
    return SettlementService(HandoffStore(table.tables, layout), lambda: transport, clock=clock or Clock())


def completion(**coordinates: Any) -> Settlement:
    coords = {"event_id": EVENT, "message_id": PARKED, **coordinates}
    return Settlement(
        kind=MessageType.HandoffCompletedRequest,
        endpoint_id="Billing",
        coordinates=Coordinates(**coords),
        settled_by="agent",
        result={"ok": True},
    )


def claim_in(table: MemoryTable) -> ClaimRow | None:
    return table.read(ClaimRow, PK, CLAIM_KEY)


def leased(token: str = "tok") -> MemoryTable:
    table = MemoryTable()
    table.submit([("create", parked(etag=None).to_entity(PK, keys.event_row(EVENT)))])
    until = iso(T0 + timedelta(seconds=30))
    queue = QueueRow(event_id=EVENT, parked_message_id=PARKED, lease_token=token, claimed_until=until)
    table.submit([("create", queue.to_entity(PK, QUEUE_KEY))])
    return table


def settlement(**changes: Any) -> Settlement:
    """The completion with other fields (``settled_by``, ``agent_id``, ``principal_id`` ...)."""
    return dataclasses.replace(completion(), **changes)


def with_lease(token: str, **changes: Any) -> Settlement:
    return settlement(lease_token=token, **changes)
