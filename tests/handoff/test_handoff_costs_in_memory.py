"""The entity writes of one full hand-off, counted on the in-memory table: the real resolver, receive,
settlement, reconciler and counts fold run step by step, as the benchmark's proxy counts them against
Azurite (``bench/costs.py``, ``tests/bench/test_costs.py``), and each step must write exactly what the
documented table says. Here it runs in the unit tier, so a change that adds a write fails ``make
test-unit`` before it reaches storage."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import costs
from common.clock import iso
from handoff.messages.contract import Coordinates, MessageType
from handoff.messages.transport import to_trigger_message
from handoff.projection.resolver import ResolverService
from handoff.receive.receiver import ReceiveService
from handoff.settlement.settler import Settlement, SettlementService
from handoff.storage.keys import Layout
from handoff.storage.overview import Overview
from handoff.storage.store import HandoffStore
from handoff.timers.reconciler import Reconciler
from handoff.timers.sweeper import tick
from tests.handoff.conftest import CaptureTransport
from tests.support.handoff_flows import Flow
from tests.support.memory_table import MemoryTables

ENDPOINT = "Billing"
_WRITES = {"create", "update", "upsert", "delete"}


class WriteCounter:
    """A gate on every call of the in-memory tables: counts the entities each write call writes (a
    transaction: each operation), per table."""

    def __init__(self) -> None:
        self.by_table: Counter[str] = Counter()

    def __call__(self, call: str, args: tuple[Any, ...]) -> None:
        table = str(args[0])
        if call == "submit_transaction":
            self.by_table[table] += sum(1 for op in args[1] if str(op[0]) in _WRITES)
        elif call in ("create_entity", "update_entity", "upsert_entity", "delete_entity"):
            self.by_table[table] += 1

    def total(self) -> int:
        return sum(self.by_table.values())


class Desk:
    """One in-memory storage with the hand-off services on it, wired as ``handoff/service.py`` wires them."""

    def __init__(self) -> None:
        self.tables = MemoryTables()
        self.store = HandoffStore(self.tables, Layout())
        self.transport = CaptureTransport()
        self.resolver = ResolverService(self.store, sleep=lambda _s: None)
        self.settlement = SettlementService(self.store, lambda: self.transport)
        self.receive = ReceiveService(self.store)
        self.counter = WriteCounter()
        self.tables.gate = self.counter

    def tick(self) -> None:
        tick(self.store, Reconciler(self.settlement), Overview(self.store).fold_all, None)

    def handoff(self, event_id: str) -> dict[str, int]:
        """One full hand-off, step by step (:data:`bench.costs.HANDOFF`; the park expected within the hour,
        as the benchmark's): the entities each step wrote."""
        flow = Flow(endpoint=ENDPOINT, event_id=event_id)
        sent_before = len(self.transport.sent)

        def next_() -> None:
            found = self.receive.next(ENDPOINT)
            assert found is not None and found.event_id == event_id

        def complete() -> None:
            self.settlement.settle(
                Settlement(
                    kind=MessageType.HandoffCompletedRequest,
                    endpoint_id=ENDPOINT,
                    coordinates=Coordinates(event_id=event_id, message_id="park-1"),
                    settled_by="bench",
                    result={"erp": "ok"},
                )
            )
            assert len(self.transport.sent) == sent_before + 1  # one control message

        def completed() -> None:
            _, message = self.transport.sent[sent_before]
            self.resolver.handle(to_trigger_message(message, enqueued=datetime.now(UTC)))

        def resolution() -> None:
            _, message = self.transport.sent[sent_before]
            self.resolver.handle(
                flow.response(
                    MessageType.ResolutionResponse, message_id=f"done-{event_id}", parent=message.message_id
                )
            )

        steps: list[Callable[[], object]] = [
            lambda: self.resolver.handle(flow.request()),
            lambda: self.resolver.handle(flow.park(expected_by=iso(datetime.now(UTC) + timedelta(hours=1)))),
            next_,
            complete,
            completed,
            resolution,
            self.tick,
        ]
        written: dict[str, int] = {}
        for step, call in zip(costs.HANDOFF, steps, strict=True):
            before = self.counter.total()
            call()
            written[step.name] = self.counter.total() - before
        return written


def test_a_full_handoff_on_the_in_memory_table_writes_the_documented_entities_per_step() -> None:
    # Given the services warm on one endpoint (its first hand-off registered the endpoint)
    desk = Desk()
    desk.handoff("ev-warm")

    # When one more hand-off runs, step by step, and the next timer tick folds its counts
    written = desk.handoff("ev-measured")

    # Then each step wrote exactly the entities the table documents (the same table the proxy holds
    # Settle to against Azurite)
    assert written == {step.name: step.writes for step in costs.HANDOFF}
    assert sum(written.values()) == sum(step.writes for step in costs.HANDOFF)


def test_the_write_counter_counts_each_operation_of_a_transaction_and_each_single_write() -> None:
    counter = WriteCounter()
    counter("submit_transaction", ("t", [("create", {}), ("update", {}), ("delete", {})]))
    counter("create_entity", ("u", {}))
    counter("get_entity", ("u", "pk", "rk"))
    counter("query_entities", ("u", "PartitionKey eq 'x'", None))
    assert counter.by_table == Counter({"t": 3, "u": 1})
