"""One request, one answer state: identical settlements sent at once (an agent retrying on a timeout, two
copies of one worker) all answer the same ``state`` and ``confirmed`` once the outcome is known, whoever of
them made the claim; while the first send is in flight a repeat waits for it (bounded) instead of answering
``sending``. Real threads released together by a barrier, against Azurite; the send takes a while, as a
real one does, so the repeats arrive while it is in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from handoff import service
from tests.support.handoff_flows import Flow, complete, fail, parked

from .broker import Broker, BrokerTransport

CALLERS = 5


@dataclass
class SlowTransport(BrokerTransport):
    """A send that takes ``delay`` seconds before the broker has the message."""

    delay: float = 0.6

    def send(self, topic: str, message: Any) -> None:
        time.sleep(self.delay)
        super().send(topic, message)


@pytest.fixture(params=["duplicate-detection", "none"])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    yield Broker(window=None if request.param == "none" else Broker().window)


@pytest.fixture
def bus(broker: Broker) -> Iterator[SlowTransport]:
    transport = SlowTransport(broker)
    service.use_transport(transport)
    yield transport
    service.reset()


def at_once(n: int, send: Any) -> list[Any]:
    barrier = threading.Barrier(n)
    answers: list[Any] = []
    guard = threading.Lock()

    def one(i: int) -> None:
        barrier.wait(10)
        time.sleep(0.05 * i)  # the first claims; the others arrive while its send is in flight
        answer = send()
        with guard:
            answers.append(answer)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(answers) == n
    return answers


@pytest.mark.parametrize("kind", ["complete", "fail"])
def test_identical_settlements_at_once_all_answer_the_state_of_the_one_send(
    call, resolve, flow, broker, bus, kind
):
    # Given a parked hand-off
    parked(resolve, flow)
    settle = complete if kind == "complete" else fail
    # When five identical settlements arrive while the first one's send is in flight
    answers = at_once(CALLERS, lambda: settle(call, flow, settledBy="erp-agent"))
    # Then all are 202 for one control message, and all say what happened to it: sent, confirmed
    assert [a.status for a in answers] == [202] * CALLERS, [a.body for a in answers]
    assert len({a.json["controlMessageId"] for a in answers}) == 1
    assert {(a.json["state"], a.json["confirmed"]) for a in answers} == {("sent", True)}, [
        (a.json["state"], a.json["replayed"]) for a in answers
    ]
    assert sorted(a.json["replayed"] for a in answers) == [False] + [True] * (CALLERS - 1)
    # and one message reached the endpoint
    assert len(broker.for_event(flow.event_id)) == 1


def test_repeats_of_a_send_whose_outcome_is_unknown_agree_with_each_other(
    call, resolve, flow: Flow, broker, bus
):
    # Given a settlement whose send reached the broker, then raised (its outcome unknown to the sender)
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    first = complete(call, flow, settledBy="erp-agent")
    assert first.status == 202 and first.json["confirmed"] is False
    # When five identical retries arrive at once
    answers = at_once(CALLERS, lambda: complete(call, flow, settledBy="erp-agent"))
    # Then they agree: re-sent under duplicate detection (sent), or unknown without it (sending)
    states = {(a.json["state"], a.json["confirmed"]) for a in answers}
    expected = ("sending", False) if broker.window is None else ("sent", True)
    assert states == {expected}, [(a.json["state"], a.json["replayed"]) for a in answers]
    assert len(broker.for_event(flow.event_id)) == 1
