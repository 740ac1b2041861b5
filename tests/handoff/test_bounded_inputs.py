"""Every agent input is bounded: ``leaseSeconds`` is a whole number of seconds in its documented range,
``x-agent-id`` at most 128 printable characters, and every identifier within the maximum README "Limits"
gives; one step beyond is a 400 problem+json naming the field, and nothing is leased, sent or written."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from handoff import service
from handoff.limits import MAX_AGENT_ID, MAX_ENDPOINT_ID, MAX_ID
from tests.support.handoff_flows import Flow, coordinates, lease_call, park, parked, receive

from .broker import Broker, BrokerTransport


@pytest.fixture
def broker() -> Iterator[Broker]:
    broker = Broker(forward=True)
    service.use_transport(BrokerTransport(broker))
    yield broker
    service.reset()


def parked_one(resolve: Any) -> Flow:
    """A parked hand-off on an endpoint of its own."""
    at = datetime.now(UTC) - timedelta(minutes=1)
    return park(resolve, f"Billing-{uuid.uuid4().hex[:8]}", "ev-1", at=at)


def refused(answer: Any, field: str) -> None:
    assert answer.status == 400, answer.body
    assert answer.content_type.startswith("application/problem+json")
    assert answer.json["field"] == field, answer.json


@pytest.mark.parametrize("raw", ["30.5", "300.0", "1e2", "nan", "-30", " ", "٣٠٠", "9" * 40])
def test_a_lease_length_that_is_not_whole_seconds_is_a_400_and_leases_nothing(call, resolve, broker, raw):
    flow = parked_one(resolve)
    answer = receive(call, flow.endpoint, leaseSeconds=raw)
    if raw.strip() == "":
        assert answer.status == 200  # left out: the default lease
        return
    refused(answer, "leaseSeconds")
    # Nothing was leased: the next receive gets it
    assert receive(call, flow.endpoint).status == 200


def test_the_lease_reported_is_the_lease_applied(call, resolve, broker):
    flow = parked_one(resolve)
    answer = receive(call, flow.endpoint, leaseSeconds="37")
    assert answer.status == 200, answer.body
    lease = answer.json["lease"]
    assert lease["leaseSeconds"] == 37
    renewed = lease_call(call, "renew", flow.endpoint, flow.event_id, lease["token"], leaseSeconds=41)
    assert renewed.status == 200 and renewed.json["leaseSeconds"] == 41, renewed.body


@pytest.mark.parametrize("value", [30.5, "30.5", 9, 3601, True])
def test_a_renewal_whose_length_is_not_whole_seconds_in_range_is_a_400(call, resolve, broker, value):
    flow = parked_one(resolve)
    lease = receive(call, flow.endpoint).json["lease"]
    answer = lease_call(call, "renew", flow.endpoint, flow.event_id, lease["token"], leaseSeconds=value)
    refused(answer, "leaseSeconds")


@pytest.mark.parametrize(
    "agent", ["a" * (MAX_AGENT_ID + 1), "agent\x01seven", "agent\nseven", "agent\u202eseven"]
)
def test_an_agent_id_beyond_128_printable_characters_is_a_400_naming_the_header(
    call, resolve, broker, flow, agent
):
    park_flow = parked_one(resolve)
    refused(receive(call, park_flow.endpoint, agent=agent), "x-agent-id")
    parked(resolve, flow)
    answer = call(
        "handoff_complete",
        {"endpointId": flow.endpoint, "coordinates": coordinates(flow)},
        headers={"x-agent-id": agent},
    )
    refused(answer, "x-agent-id")
    assert broker.for_event(flow.event_id) == []


def test_an_agent_id_of_128_printable_characters_is_recorded(call, resolve, broker, flow):
    agent = "ä" * MAX_AGENT_ID
    parked(resolve, flow)
    answer = call(
        "handoff_complete",
        {"endpointId": flow.endpoint, "coordinates": coordinates(flow)},
        headers={"x-agent-id": agent},
    )
    assert answer.status == 202, answer.body
    assert answer.json["settledBy"] == agent


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("endpointId", "endpointId"),
        ("coordinates.eventId", "coordinates.eventId"),
        ("coordinates.messageId", "coordinates.messageId"),
        ("coordinates.sessionId", "coordinates.sessionId"),
        ("coordinates.correlationId", "coordinates.correlationId"),
    ],
)
def test_identifiers_beyond_their_maximum_in_a_settlement_are_a_400_naming_them(
    call, resolve, broker, flow, where, field
):
    parked(resolve, flow)
    body: dict[str, Any] = {"endpointId": flow.endpoint, "coordinates": coordinates(flow)}
    if where == "endpointId":
        body["endpointId"] = "E" * (MAX_ENDPOINT_ID + 1)
    else:
        body["coordinates"][where.split(".")[1]] = "x" * (MAX_ID + 1)
    refused(call("handoff_complete", body), field)
    assert broker.for_event(flow.event_id) == []


@pytest.mark.parametrize(
    ("name", "route"),
    [
        ("handoff_receive", {"endpointId": "E" * (MAX_ENDPOINT_ID + 1)}),
        ("event_get", {"endpointId": "Billing", "eventId": "x" * (MAX_ID + 1)}),
        ("handoff_job", {"endpointId": "Billing", "externalJobId": "j" * (MAX_ID + 1)}),
        ("event_settlement_resolve", {"endpointId": "Billing", "eventId": "x" * (MAX_ID + 1)}),
        ("event_resubmit", {"endpointId": "E" * (MAX_ENDPOINT_ID + 1), "eventId": "ev-1"}),
    ],
)
def test_route_identifiers_beyond_their_maximum_are_a_400_naming_them(call, name, route):
    body = {"messageId": "m", "resolution": "released", "reason": "x"} if "resolve" in name else {}
    method = "GET" if name in ("event_get", "handoff_job") else None
    answer = call(name, body, method=method, route_params=route)
    [field] = [k for k, v in route.items() if len(v) > 100]
    refused(answer, field)


def test_bad_inputs_sent_at_once_are_each_a_400(call, resolve, broker):
    # Many agents misconfigured the same way at once: each gets its own 400, and the hand-off stays free
    flow = parked_one(resolve)
    barrier = threading.Barrier(6)
    answers: list[Any] = []

    def agent(i: int) -> None:
        barrier.wait(10)
        if i % 2:
            answers.append(receive(call, flow.endpoint, agent="x" * 200))
        else:
            answers.append(receive(call, flow.endpoint, leaseSeconds="30.5"))

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(a.status for a in answers) == [400] * 6
    assert {a.json["field"] for a in answers} == {"x-agent-id", "leaseSeconds"}
    assert receive(call, flow.endpoint).status == 200
