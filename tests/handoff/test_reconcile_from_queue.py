"""The reconciler finds a hand-off's settlement through its queue mark (ADR-0022 change 9), on the in-memory
table with the real resolver, settlement and reconciler: the adversary's interleavings.

A settlement of a parked hand-off writes no reconcile row: the queue row it marks claimed carries
``ReconcileAt``, when the reconciler first looks. The reconciler moves that column once it has handled the
claim, ``If-Match`` the queue row as it read it, so a claim released and taken again meanwhile keeps its own
mark; and a claim it could not read is looked at again, never dropped.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from handoff.messages.contract import Coordinates, MessageType
from handoff.projection.resolver import ResolverService
from handoff.settlement import claims
from handoff.settlement.settler import Settlement, SettlementService
from handoff.settlement.timing import CONFIRM_AFTER, RETRY_AFTER
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.keys import Layout
from handoff.storage.records import ClaimRow, QueueRow
from handoff.storage.store import HandoffStore
from handoff.timers.reconciler import Reconciler
from tests.support.handoff_flows import Flow
from tests.support.memory_table import MemoryTables

from .broker import Broker, BrokerTransport

ENDPOINT = "Billing"
EVENT = "ev-q"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class Desk:
    """One endpoint's hand-off on the in-memory table, the settlement's clock set by the test."""

    def __init__(self) -> None:
        self.tables = MemoryTables()
        self.store = HandoffStore(self.tables, Layout())
        self.broker = Broker()
        self.transport = BrokerTransport(self.broker)
        self.now = T0
        self.settlement = SettlementService(self.store, lambda: self.transport, clock=lambda: self.now)
        self.reconciler = Reconciler(self.settlement)
        resolver = ResolverService(self.store, sleep=lambda _s: None)
        flow = Flow(endpoint=ENDPOINT, event_id=EVENT)
        resolver.handle(flow.request())
        resolver.handle(flow.park())

    def settle(self, by: str, behaviour: str) -> Any:
        self.transport.then([behaviour])
        return self.settlement.settle(
            Settlement(
                kind=MessageType.HandoffCompletedRequest,
                endpoint_id=ENDPOINT,
                coordinates=Coordinates(event_id=EVENT, message_id="park-1"),
                settled_by=by,
            )
        )

    def claim(self) -> ClaimRow | None:
        return self.store.get_claim(ENDPOINT, EVENT, "park-1")

    def queued(self) -> QueueRow:
        row = self.store.get_event(ENDPOINT, EVENT)
        assert row is not None and row.queue_key is not None
        found = self.store.get_queue_row(ENDPOINT, EVENT, row.queue_key)
        assert found is not None
        return found

    def reconcile_rows(self) -> list[str]:
        low, high = keys.RECONCILE_RANGE
        pk = self.store.event_partition(ENDPOINT, EVENT)
        table = self.tables.table(keys.EVENTS_TABLE)
        query = f"PartitionKey eq '{pk}' and RowKey ge '{low}' and RowKey lt '{high}'"
        return [str(e["RowKey"]) for e in table.query_entities(query)]


def test_a_settlement_writes_no_reconcile_row_and_its_queue_mark_says_when_to_look() -> None:
    desk = Desk()

    desk.settle("agent", "lost-before")  # the outcome of the send is unknown

    claim = desk.claim()
    assert claim is not None and claim.state is ClaimState.sending and not claim.reconcile_key
    assert desk.reconcile_rows() == []
    assert desk.queued().reconcile_at == T0 + CONFIRM_AFTER
    # Not due before then: nothing is read, nothing is written
    desk.now = T0 + CONFIRM_AFTER - timedelta(seconds=1)
    assert desk.reconciler.run([ENDPOINT]).resent == [] and desk.queued().reconcile_at == T0 + CONFIRM_AFTER
    # Due: the identical message again (within the detection window), then the mark is handled
    desk.now = T0 + CONFIRM_AFTER + timedelta(seconds=1)
    assert desk.reconciler.run([ENDPOINT]).resent == [EVENT]
    assert len(desk.broker.delivered) == 1  # the first copy never reached the broker
    assert desk.queued().reconcile_at == claims.RECONCILED
    # Handled: a later tick does not read it again
    desk.now += timedelta(minutes=5)
    report = desk.reconciler.run([ENDPOINT])
    assert (report.resent, report.waiting, report.errors) == ([], [], {})


def test_a_claim_released_and_taken_again_meanwhile_keeps_its_own_mark() -> None:
    desk = Desk()
    desk.settle("agent", "lost-before")
    first = desk.claim()
    assert first is not None
    desk.now = T0 + timedelta(minutes=3)
    advance = desk.settlement.follow_up.advance

    def released_and_retaken(endpoint_id: str, claim: ClaimRow, **kw: Any) -> ClaimRow:
        # While the reconciler holds its read of the queue row, the claim's sender (a paused process) is
        # refused and releases it, and another settlement claims the hand-off: a new mark, a new first look
        row = desk.store.get_event(ENDPOINT, EVENT)
        assert row is not None and desk.settlement.follow_up.release(ENDPOINT, row, claim)
        desk.settle("other-agent", "lost-before")
        return claim  # the reconciler's claim as it read it: still followed on its queue mark

    desk.settlement.follow_up.advance = released_and_retaken  # type: ignore[method-assign]
    desk.reconciler.run([ENDPOINT])
    desk.settlement.follow_up.advance = advance  # type: ignore[method-assign]

    second = desk.claim()
    assert second is not None and second.settled_by == "other-agent"
    # The reconciler's write of the old mark was refused: the new claim's first look stands
    assert desk.queued().reconcile_at == desk.now + CONFIRM_AFTER
    desk.now += CONFIRM_AFTER + timedelta(seconds=1)
    assert desk.reconciler.run([ENDPOINT]).resent == [EVENT]
    assert [c.message_id for c in desk.broker.delivered] == [second.control_message_id]


def test_a_claim_the_reconciler_could_not_read_is_looked_at_again() -> None:
    desk = Desk()
    desk.settle("agent", "lost-before")
    claim_key = keys.claim_row(EVENT, "park-1")
    faults = [1]

    def unreadable_once(call: str, args: tuple[Any, ...]) -> None:
        if call == "get_entity" and args[2] == claim_key and faults:
            faults.pop()
            raise ConnectionError("the claim read timed out (test)")

    desk.now = T0 + timedelta(minutes=3)
    desk.tables.gate = unreadable_once
    report = desk.reconciler.run([ENDPOINT])
    desk.tables.gate = None

    assert EVENT in report.errors[ENDPOINT] and desk.broker.delivered == []
    assert desk.queued().reconcile_at == desk.now + RETRY_AFTER  # not dropped: looked at again
    desk.now += RETRY_AFTER + timedelta(seconds=1)
    assert desk.reconciler.run([ENDPOINT]).resent == [EVENT] and len(desk.broker.delivered) == 1


def test_a_claim_given_a_later_look_moves_to_a_reconcile_row_and_its_mark_is_handled() -> None:
    desk = Desk()
    desk.broker.window = None  # no duplicate detection: never re-sent, shown unconfirmed instead
    desk.settle("agent", "lost-before")
    desk.now = T0 + timedelta(minutes=3)

    assert desk.reconciler.run([ENDPOINT]).unconfirmed == [EVENT]

    claim = desk.claim()
    assert claim is not None and claim.state is ClaimState.unconfirmed
    assert desk.reconcile_rows() == [claim.reconcile_key]  # looked at again through its own row
    assert desk.queued().reconcile_at == claims.RECONCILED
    assert desk.broker.delivered == []


def test_a_failed_read_of_the_queue_marks_does_not_stop_the_reconcile_rows() -> None:
    desk = Desk()
    desk.settle("agent", "lost-before")
    # A claim with a reconcile row of its own (an operator action's, or one given a later look)
    claim = desk.claim()
    assert claim is not None
    desk.now = T0 + timedelta(minutes=3)
    desk.settlement.follow_up.reschedule(ENDPOINT, claim, T0 + timedelta(minutes=2, seconds=30))
    assert len(desk.reconcile_rows()) == 1

    def queue_unreadable(call: str, args: tuple[Any, ...]) -> None:
        if call == "query_entities" and "hq|" in str(args[1]):
            raise ConnectionError("the queue's read timed out (test)")

    desk.tables.gate = queue_unreadable
    report = desk.reconciler.run([ENDPOINT])
    desk.tables.gate = None

    assert "*" in report.errors[ENDPOINT]
    assert report.resent == [EVENT] and len(desk.broker.delivered) == 1 and desk.reconcile_rows() == []
