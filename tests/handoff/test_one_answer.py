"""One settlement, one answer: identical concurrent or retried settlements are all
202 with one ``controlMessageId``; a delivered control message is never recorded ``superseded`` nor
listed ``unconfirmed``; a re-send never lands after the duplicate-detection window.

The transport projects (the broker model forwards kept copies to the resolver when pumped, or at once);
the clock is the test's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from common.clock import utcnow
from handoff import service
from tests.support.handoff_flows import Flow, complete, parked

from .broker import Broker, BrokerTransport


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield Broker()


@pytest.fixture
def bus(broker: Broker) -> Iterator[BrokerTransport]:
    transport = BrokerTransport(broker)
    service.use_transport(transport)
    yield transport
    service.reset()


def claim_state(flow: Flow) -> str:
    claim = service.store().get_claim(flow.endpoint, flow.event_id, "park-1")
    assert claim is not None
    return claim.state.name


def unconfirmed(call: Any, flow: Flow) -> list[str]:
    listed = call("handoff_unconfirmed", method="GET", route_params={"endpointId": flow.endpoint})
    return [item["eventId"] for item in listed.json["items"]]


def test_a_retry_whose_history_read_just_misses_the_projection_is_not_superseded(
    call, resolve, flow, broker, bus, monkeypatch
):
    # Given a settlement whose send reached the broker but whose answer was lost (claim still sending)
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    first = complete(call, flow)
    assert (first.status, first.json["confirmed"]) == (202, False)
    # And the resolver projects it right after the retry looked at the history
    store = service.store()
    original = store.has_history

    def history_then_projection(*args: Any, **kw: Any) -> bool:
        seen = original(*args, **kw)
        broker.pump()
        return seen

    monkeypatch.setattr(store, "has_history", history_then_projection)
    # When the caller retries the identical settlement
    again = complete(call, flow)
    monkeypatch.undo()
    # Then it is answered 202 with the same message, and the claim is delivered, never superseded
    assert again.status == 202, again.body
    assert again.json["controlMessageId"] == first.json["controlMessageId"]
    assert claim_state(flow) in ("sent", "delivered")  # never superseded


def test_a_retry_pinning_the_claim_during_the_first_send_does_not_lose_its_sent_mark(
    call, resolve, flow, broker, bus
):
    # Given topics without duplicate detection and a resolver that lags (nothing projected yet)
    broker.window = None
    parked(resolve, flow)
    original = bus.send
    answers: dict[str, Any] = {}

    def send(topic: str, message: Any) -> None:
        # A retry of the same settlement is answered (and pins the claim) while the first send is on the wire
        retry = threading.Thread(target=lambda: answers.update(retry=complete(call, flow)))
        retry.start()
        retry.join(60)
        original(topic, message)

    bus.send = send
    first = complete(call, flow)
    bus.send = original
    assert first.status == 202 and first.json["confirmed"] is True
    assert answers["retry"].status == 202
    assert answers["retry"].json["controlMessageId"] == first.json["controlMessageId"]
    # Then the broker's acknowledgement is recorded, and the reconciler never raises a false alarm
    assert claim_state(flow) == "sent"
    service.settlement_service().clock = lambda: utcnow() + timedelta(minutes=30)
    service.reconciler().run()
    assert unconfirmed(call, flow) == []
    assert len(broker.delivered) == 1


def test_the_resend_deadline_is_checked_again_immediately_before_the_send(
    call, resolve, flow, broker, bus, monkeypatch
):
    # Given a first copy the broker kept at T0 (its answer lost; the resolver lags), on a 10-minute window
    now = [utcnow()]
    settlement = service.settlement_service()
    settlement.clock = lambda: now[0]
    broker.clock = lambda: now[0]
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    assert complete(call, flow).json["confirmed"] is False
    # And a reconciler pass at T0 + 8.5 min (re-send still allowed) whose pin write takes 100 s
    now[0] += timedelta(minutes=8, seconds=30)
    store = service.store()
    original = store.submit

    def slow_pin(ops: Any) -> list[dict[str, Any]]:
        if any(len(op) > 1 and isinstance(op[1], dict) and "Attempts" in op[1] for op in ops):
            now[0] += timedelta(seconds=100)
        return original(ops)

    monkeypatch.setattr(store, "submit", slow_pin)
    service.reconciler().run()
    monkeypatch.undo()
    # Then nothing was sent past the window: one copy kept, none dropped
    assert len(broker.delivered) == 1 and broker.dropped == []
    assert claim_state(flow) in ("sending", "unconfirmed")


def test_identical_settlements_at_once_are_all_202_with_one_control_message(call, resolve, broker, bus):
    broker.forward = True  # projected at once, as by the loopback
    for _ in range(10):
        flow = Flow(
            endpoint="Billing-pairs", event_id=str(datetime.now().timestamp()) + "-" + str(id(object()))
        )
        parked(resolve, flow)
        barrier = threading.Barrier(2)
        answers: list[Any] = []

        def settle(f: Flow = flow, b: threading.Barrier = barrier, out: list[Any] = answers) -> None:
            b.wait(10)
            out.append(complete(call, f, settledBy="erp"))

        threads = [threading.Thread(target=settle) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [a.status for a in answers] == [202, 202], [a.body for a in answers]
        assert len({a.json["controlMessageId"] for a in answers}) == 1
        assert claim_state(flow) in ("sent", "delivered")  # never superseded
        assert len(broker.for_event(flow.event_id)) == 1


def test_the_resend_margin_exceeds_the_send_paths_bounded_worst_case():
    from handoff.messages.transport import SEND_WORST_CASE
    from handoff.settlement.timing import RESEND_MARGIN

    clock_error = timedelta(seconds=30)
    assert SEND_WORST_CASE + clock_error < RESEND_MARGIN


def test_a_link_that_took_longer_than_its_budget_to_open_sends_nothing(monkeypatch):
    from handoff.messages import transport as t
    from handoff.messages.transport import SendRefused, ServiceBusTransport

    bus = ServiceBusTransport(connection_string="Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v")
    sent: list[Any] = []

    class Sender:
        def send_messages(self, message: Any, timeout: float) -> None:
            sent.append(message)

    ticks = iter([0.0, t._OPEN_BUDGET_S + 1])
    import types

    monkeypatch.setattr(
        "handoff.messages.transport.time", types.SimpleNamespace(monotonic=lambda: next(ticks))
    )
    monkeypatch.setattr(bus, "_open", lambda topic: Sender())
    from azure.servicebus import ServiceBusMessage

    with pytest.raises(SendRefused):
        bus.send("Billing", ServiceBusMessage("{}", message_id="m-1"))
    assert sent == []
