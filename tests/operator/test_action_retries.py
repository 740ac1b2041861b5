"""Operator actions retried safely: idempotent by the message they address.

The transport PROJECTS (the broker model forwards each kept copy to the resolver at once, like the
loopback), so a retry arriving after the endpoint answered sees the event as it really moved on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from handoff import service
from handoff.messages.contract import MessageType
from tests.handoff.broker import Broker, BrokerTransport
from tests.support.handoff_flows import Flow, event_of
from tests.support.operator_calls import act

from .conftest import failed_event


@pytest.fixture
def broker() -> Iterator[Broker]:
    broker = Broker(forward=True)
    service.use_transport(BrokerTransport(broker))
    yield broker
    service.reset()


def control_copies(broker: Broker, flow: Flow, kind: str) -> list[str]:
    return [c.message_id for c in broker.for_event(flow.event_id) if c.message_type == kind]


def audit_types(call: Any, flow: Flow) -> list[str]:
    return [a["auditType"] for a in event_of(call, flow)["audits"]]


def fails_again(resolve: Any, flow: Flow, broker: Broker, message_id: str) -> None:
    """The endpoint answers the last control message with a new ErrorResponse."""
    [sent] = [c for c in broker.delivered if c.event_id == flow.event_id][-1:]
    resolve(
        flow.response(
            MessageType.ErrorResponse, message_id=message_id, parent=sent.message_id, error_text="x"
        )
    )


def completes(
    resolve: Any, flow: Flow, broker: Broker, kind: MessageType = MessageType.ResolutionResponse
) -> None:
    """The endpoint answers the last control message: done (a skip is answered with SkipResponse)."""
    [sent] = [c for c in broker.delivered if c.event_id == flow.event_id][-1:]
    resolve(flow.response(kind, message_id="done-1", parent=sent.message_id))


@pytest.mark.parametrize("then", ["failed-again", "completed", "nothing"])
@pytest.mark.parametrize("action", ["resubmit", "skip"])
def test_a_retried_action_is_answered_from_its_claim_whatever_the_event_did_since(
    call, resolve, flow, broker, action, then
):
    # Given a failed event, and an operator's action addressed to the failed message, projected at once
    failed_event(resolve, flow)
    body = {"by": "alice", "messageId": "err-1"}
    first = act(call, flow, action, body)
    assert first.status == 202, first.body
    # and the endpoint answered that request before the retry arrived: it failed again (a new
    # ErrorResponse), or it is done (a resubmission completes; a skip is answered with SkipResponse)
    if then == "failed-again":
        fails_again(resolve, flow, broker, "err-2")
    if then == "completed":
        done = MessageType.ResolutionResponse if action == "resubmit" else MessageType.SkipResponse
        completes(resolve, flow, broker, done)
    row = event_of(call, flow)
    moved_on = {
        "failed-again": ("Failed", "err-2"),
        "completed": ("Completed" if action == "resubmit" else "Skipped", "done-1"),
        "nothing": ("Pending", first.json["controlMessageId"]),  # the request projected, no answer yet
    }
    assert (row["resolutionStatus"], row["lastMessageId"]) == moved_on[then]
    # When the operator's client retries the identical call (its first answer was lost)
    again = act(call, flow, action, body)
    # Then it is the same action: answered from its claim, nothing more sent, one audit
    assert again.status == 202, again.body
    assert again.json["replayed"] is True
    assert again.json["controlMessageId"] == first.json["controlMessageId"]
    kind = "ResubmissionRequest" if action == "resubmit" else "SkipRequest"
    assert control_copies(broker, flow, kind) == [first.json["controlMessageId"]]
    assert audit_types(call, flow) == ["Resubmit" if action == "resubmit" else "Skip"]


def test_a_message_id_that_is_not_current_and_was_never_acted_on_is_409_naming_it(
    call, resolve, flow, broker
):
    failed_event(resolve, flow)
    answer = act(call, flow, "resubmit", {"messageId": "err-0"})
    assert answer.status == 409 and answer.json["field"] == "messageId"
    assert "err-0" in answer.json["detail"]
    assert broker.delivered == [] and audit_types(call, flow) == []


def test_without_a_message_id_the_current_message_is_addressed(call, resolve, flow, broker):
    failed_event(resolve, flow)
    first = act(call, flow, "resubmit", {"by": "alice"})
    assert first.status == 202 and first.json["addressedMessageId"] == "err-1"
    fails_again(resolve, flow, broker, "err-2")
    second = act(call, flow, "resubmit", {"by": "alice"})  # a new decision on the new failure
    assert second.status == 202 and second.json["addressedMessageId"] == "err-2"
    assert second.json["replayed"] is False


@pytest.mark.parametrize("then", ["completed", "parked-again"])
@pytest.mark.parametrize("action", ["complete", "fail"])
def test_a_retried_operator_settlement_is_answered_from_its_claim(call, resolve, flow, broker, action, then):
    # Given a parked hand-off the operator settled, projected at once, and the endpoint moved on
    resolve(flow.request())
    resolve(flow.park())
    body: dict[str, Any] = {"by": "olivia", "messageId": "park-1"}
    if action == "fail":
        body["errorText"] = "rejected"
    first = act(call, flow, action, body)
    assert first.status == 202, first.body
    [sent] = broker.for_event(flow.event_id)
    if then == "completed":
        resolve(flow.response(MessageType.ResolutionResponse, message_id="done-1", parent=sent.message_id))
    else:
        resolve(flow.park(message_id="park-2", parent=sent.message_id))
    # When the identical call is retried
    again = act(call, flow, action, body)
    # Then the same answer, and nothing more reached the endpoint
    assert again.status == 202, again.body
    assert again.json["replayed"] is True
    assert again.json["controlMessageId"] == first.json["controlMessageId"]
    assert len(broker.for_event(flow.event_id)) == 1


def test_concurrent_identical_operator_retries_send_one_message(call, resolve, flow, broker):
    failed_event(resolve, flow)
    answers: list[Any] = []
    barrier = threading.Barrier(6)

    def operator() -> None:
        barrier.wait(10)
        answers.append(act(call, flow, "resubmit", {"by": "alice", "messageId": "err-1"}))

    threads = [threading.Thread(target=operator) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [a.status for a in answers] == [202] * 6, [a.body for a in answers]
    assert len({a.json["controlMessageId"] for a in answers}) == 1
    assert len(control_copies(broker, flow, "ResubmissionRequest")) == 1
    assert audit_types(call, flow) == ["Resubmit"]


def test_a_repeated_bulk_resubmit_is_answered_from_each_claim_after_the_events_failed_again(
    call, resolve, flow, broker
):
    # Given a failed event bulk-resubmitted, addressed to the failed message the operator saw
    failed_event(resolve, flow)
    body = {"action": "resubmit", "eventIds": [flow.event_id], "messageIds": {flow.event_id: "err-1"}}
    route = {"endpointId": flow.endpoint}
    first = call("endpoint_bulk", body, route_params=route)
    assert first.status == 200 and first.json["items"][0]["status"] == 202, first.body
    # and the endpoint failed again before the console's retry of the same chunk arrived
    fails_again(resolve, flow, broker, "err-2")
    again = call("endpoint_bulk", body, route_params=route)
    # Then the retry is the same action: answered from its claim, one ResubmissionRequest, one audit
    [item] = again.json["items"]
    assert item["status"] == 202 and item["accepted"]["replayed"] is True, again.body
    first_id = first.json["items"][0]["accepted"]["controlMessageId"]
    assert item["accepted"]["controlMessageId"] == first_id
    assert control_copies(broker, flow, "ResubmissionRequest") == [first_id]
    assert audit_types(call, flow) == ["Resubmit"]


@pytest.mark.parametrize(
    ("action", "body", "audit_type"),
    [
        ("resubmit", {"by": "alice", "messageId": "err-1"}, "Resubmit"),
        ("skip", {"by": "alice", "messageId": "err-1", "reason": "obsolete"}, "Skip"),
    ],
)
def test_identical_operator_actions_at_once_all_name_the_one_audit(
    call, resolve, flow, broker, action, body, audit_type
):
    # Given a failed event, and five operators (or one client's retries) sending the same action at once
    failed_event(resolve, flow)
    barrier = threading.Barrier(5)
    answers: list[Any] = []
    guard = threading.Lock()

    def operator() -> None:
        barrier.wait(10)
        answer = act(call, flow, action, body)
        with guard:
            answers.append(answer)

    threads = [threading.Thread(target=operator) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Then all are accepted, one as the action and four as its repeats, each naming the one audit written
    assert [a.status for a in answers] == [202] * 5, [a.body for a in answers]
    assert sorted(a.json["replayed"] for a in answers) == [False] + [True] * 4
    assert audit_types(call, flow) == [audit_type]
    [audit] = event_of(call, flow)["audits"]
    assert all(a.json["audit"] is not None for a in answers), [a.body for a in answers]
    assert {a.json["audit"]["auditTimestamp"] for a in answers} == {audit["auditTimestamp"]}
    assert {a.json["state"] for a in answers} == {answers[0].json["state"]}
