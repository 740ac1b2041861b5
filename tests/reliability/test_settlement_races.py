"""Racing settlements of parked hand-offs from many threads while the send fails at random.

Promises: at most one control message per hand-off (whatever the interleaving), a 202 leaves exactly one
audit row and a failed send none, and every claim is eventually free again: released at once after a
failed send, or (when even the release fails) taken over once it expires.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common.errors import Unavailable
from handoff import service
from handoff.contract import Coordinates, MessageType
from handoff.settlement import CLAIM_TTL, Settlement, SettlementService
from tests.conftest import Caller
from tests.reliability.faults import FAULTS
from tests.reliability.nimbus_model import Msg, service_bus_message
from tests.reliability.tally import TALLY, sized

pytestmark = pytest.mark.slow

AREA = "settlement races"


@dataclass
class FlakyTransport:
    """A Service Bus stand-in: each send fails at random (nothing sent), else the message is recorded."""

    failure_rate: float
    seed: int
    fail_release: bool = False
    name: str = "flaky"
    sent: list[tuple[str, Any]] = field(default_factory=list)
    failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def send(self, topic: str, message: Any) -> None:
        with self._lock:
            fail = self._rng.random() < self.failure_rate
            if fail:
                self.failures += 1
            else:
                self.sent.append((str(message.application_properties["EventId"]), message))
        if fail:
            if self.fail_release:
                FAULTS.arm(1, "before")  # the claim's release transaction fails too
                with self._lock:
                    self.failures += 1
            raise Unavailable("Service Bus did not accept the message (injected)")


@dataclass
class Parked:
    endpoint: str
    event_id: str
    park_id: str

    def body(self) -> dict[str, Any]:
        return {
            "endpointId": self.endpoint,
            "coordinates": {"eventId": self.event_id, "sessionId": self.event_id, "messageId": self.park_id},
            "result": {"ok": True},
        }


def park(functions: dict[str, Any], endpoint: str) -> Parked:
    resolver = functions["resolver"].get_user_function()
    event_id = str(uuid.uuid4())
    req = Msg("EventRequest", f"req-{uuid.uuid4().hex[:8]}")
    handoff = Msg("PendingHandoffResponse", f"park-{uuid.uuid4().hex[:8]}", req.message_id)
    for msg in (req, handoff):
        resolver(service_bus_message(msg, endpoint=endpoint, event_id=event_id))
    return Parked(endpoint, event_id, handoff.message_id)


def event(call: Caller, p: Parked) -> dict[str, Any]:
    result = call("event_get", method="GET", route_params={"endpointId": p.endpoint, "eventId": p.event_id})
    assert result.status == 200, result.body
    data: dict[str, Any] = result.json
    return data


def race(call: Caller, p: Parked, threads: int, tries: int) -> list[int]:
    """``threads`` callers settle ``p`` at the same instant, each retrying a 503 up to ``tries`` times."""
    barrier = threading.Barrier(threads)
    answers: list[int] = []
    lock = threading.Lock()

    def settle() -> None:
        barrier.wait()
        for _ in range(tries):
            result = call("handoff_complete", p.body())
            TALLY.check(
                AREA,
                result.status in (202, 409, 503)
                and (result.status == 202 or result.content_type.startswith("application/problem+json")),
                f"settle answered {result.status} {result.body!r}",
            )
            with lock:
                answers.append(result.status)
            if result.status != 503:
                return
        FAULTS.disarm()

    workers = [threading.Thread(target=settle) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    TALLY.add(AREA, operations=len(answers), races=1)
    return answers


@pytest.mark.parametrize("fail_release", [False, True], ids=["send fails", "send and release fail"])
def test_racing_settlements_send_at_most_one_control_message_and_free_every_claim(
    faulty_tables, functions, call, fail_release
):
    # Given parked hand-offs and a transport that fails half the sends
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    handoffs = [park(functions, endpoint) for _ in range(sized(24, 4))]
    transport = FlakyTransport(failure_rate=0.5, seed=7, fail_release=fail_release)
    service.use_transport(transport)
    # When eight callers race to settle each one
    answers = {p.event_id: race(call, p, threads=8, tries=3) for p in handoffs}
    TALLY.add(AREA, faults=transport.failures)
    # Then at most one control message per hand-off, and one 202 per message sent
    sent = Counter(event_id for event_id, _ in transport.sent)
    for p in handoffs:
        where = f"hand-off {p.event_id}"
        TALLY.check(AREA, sent[p.event_id] <= 1, f"{where}: {sent[p.event_id]} control messages")
        TALLY.check(
            AREA, answers[p.event_id].count(202) == sent[p.event_id], f"{where}: {answers[p.event_id]}"
        )
    # And every hand-off not sent is free again: at once, or once its claim expired
    healthy = FlakyTransport(failure_rate=0.0, seed=0)
    service.use_transport(healthy)
    later = SettlementService(
        service.store(), healthy, clock=lambda: datetime.now(UTC) + CLAIM_TTL + timedelta(seconds=5)
    )
    stuck: set[str] = set()
    for p in handoffs:
        if sent[p.event_id]:
            again = call("handoff_complete", p.body())
            TALLY.add(AREA, operations=1)
            TALLY.check(AREA, again.status == 409, f"{p.event_id}: settled twice ({again.status})")
            continue
        now = call("handoff_complete", p.body())
        TALLY.add(AREA, operations=1)
        if now.status == 202:
            continue
        # Only a claim whose release failed may still hold it, and only until it expires.
        TALLY.check(
            AREA,
            fail_release and now.status == 409,
            f"{p.event_id}: claim not released ({now.status} {now.body!r})",
        )
        stuck.add(p.event_id)
        coords = Coordinates(event_id=p.event_id, session_id=p.event_id, message_id=p.park_id)
        accepted = later.settle(
            Settlement(MessageType.HandoffCompletedRequest, p.endpoint, coords, "reliability")
        )
        TALLY.add(AREA, operations=1)
        TALLY.check(
            AREA, accepted.parked_message_id == p.park_id, f"{p.event_id}: expired claim not taken over"
        )
    finals = Counter(event_id for event_id, _ in healthy.sent) + sent
    TALLY.check(
        AREA, all(finals[p.event_id] == 1 for p in handoffs), f"control messages per hand-off: {finals}"
    )
    # One CompleteHandoff audit row per message sent. A claim whose release failed keeps its audit row
    # (claim and audit are deleted together), so such a hand-off shows one extra, unsent, settlement.
    for p in handoffs:
        audits = [a for a in event(call, p)["audits"] if a["auditType"] == "CompleteHandoff"]
        expected = finals[p.event_id] + (1 if p.event_id in stuck else 0)
        TALLY.check(
            AREA, len(audits) == expected, f"{p.event_id}: {len(audits)} audit rows, expected {expected}"
        )
    TALLY.add(AREA, operations=len(handoffs))


@dataclass
class AmbiguousTransport:
    """The broker accepts the message, but the sender sees an error (timeout after the send)."""

    name: str = "ambiguous"
    sent: list[Any] = field(default_factory=list)
    ambiguous_left: int = 1

    def send(self, topic: str, message: Any) -> None:
        self.sent.append(message)
        if self.ambiguous_left:
            self.ambiguous_left -= 1
            raise Unavailable("Service Bus send timed out (the broker had accepted it)")


def test_an_ambiguous_send_then_a_retry_still_sends_one_control_message(faulty_tables, functions, call):
    # Given a parked hand-off and a send that reaches the broker but reports a failure
    p = park(functions, "Billing-" + uuid.uuid4().hex[:8])
    transport = AmbiguousTransport()
    service.use_transport(transport)
    # When the caller retries the 503 as documented
    first = call("handoff_complete", p.body())
    second = call("handoff_complete", p.body())
    TALLY.add(AREA, operations=2, faults=1)
    # Then one control message reached the broker (or the same MessageId twice, which it deduplicates)
    assert (first.status, second.status) == (503, 202)
    assert len({str(m.message_id) for m in transport.sent}) == 1, [str(m.message_id) for m in transport.sent]


def test_a_storage_fault_on_any_request_of_a_settlement_still_sends_one_message_eventually(
    faulty_tables, functions, call
):
    # Given how many storage requests one settlement makes
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    transport = FlakyTransport(failure_rate=0.0, seed=0)
    service.use_transport(transport)
    p = park(functions, endpoint)
    with FAULTS.plan() as plan:
        assert call("handoff_complete", p.body()).status == 202
    requests = len(plan.requests)
    TALLY.add(AREA, operations=1)
    later = SettlementService(
        service.store(), transport, clock=lambda: datetime.now(UTC) + CLAIM_TTL + timedelta(seconds=5)
    )
    for index in range(1, requests + 1):
        for when in ("before", "after"):
            where = f"settlement, request #{index} fails {when}"
            p = park(functions, endpoint)
            before = len(transport.sent)
            # When request N fails and the caller retries 503s
            answers = []
            with FAULTS.plan(index, when) as plan:
                for _ in range(3):
                    result = call("handoff_complete", p.body())
                    answers.append(result.status)
                    if result.status != 503:
                        break
            TALLY.add(AREA, operations=len(answers), faults=len(plan.injected))
            sent = len(transport.sent) - before
            # Then at most one message; if none, the claim frees itself when it expires
            TALLY.check(AREA, sent <= 1 and answers.count(202) == sent, f"{where}: {answers}, {sent} sent")
            if sent == 0:
                TALLY.check(AREA, answers[-1] == 409, f"{where}: {answers}")
                coords = Coordinates(event_id=p.event_id, session_id=p.event_id, message_id=p.park_id)
                later.settle(Settlement(MessageType.HandoffCompletedRequest, endpoint, coords, "reliability"))
                TALLY.add(AREA, operations=1)
                sent = len(transport.sent) - before
            TALLY.check(AREA, sent == 1, f"{where}: {sent} control messages in the end")
