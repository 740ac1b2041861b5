"""Settlement over HTTP: the exact wire shape sent, 404/409/503, the store-backed claim, round trips."""

from __future__ import annotations

import threading

import pytest

from common.roundtrips import ROUND_TRIPS
from handoff import service
from handoff.messages.contract import MessageType
from tests.support.handoff_flows import (
    EVENT_TYPE,
    Flow,
    body_of,
    complete,
    coordinates,
    event_of,
    fail,
    parked,
    props,
)


def test_complete_sends_one_handoff_completed_request_with_the_pinned_wire_shape(
    call, resolve, flow, transport
):
    parked(resolve, flow)
    result = complete(call, flow, result={"rows": 3}, settledBy="erp-status-checker")
    assert result.status == 202, result.body
    assert result.json["messageType"] == "HandoffCompletedRequest"
    [(topic, message)] = transport.sent
    assert topic == flow.endpoint
    assert props(message) == {
        "To": flow.endpoint,
        "From": "Manager",
        "MessageType": "HandoffCompletedRequest",
        "EventId": flow.event_id,
        "OriginatingMessageId": "req-1",
        "ParentMessageId": "park-1",
        "EventTypeId": EVENT_TYPE,
        "RetryCount": 0,
        "OriginatingFrom": "self",
    }
    assert message.session_id == "session-1"
    assert message.correlation_id == "corr-1"
    assert message.message_id == result.json["controlMessageId"] not in ("park-1", "req-1")
    assert body_of(message) == {
        "EventContent": {"EventTypeId": EVENT_TYPE, "EventJson": '{"rows":3}'},
        "ErrorContent": None,
    }
    # And one audit row says who settled
    [audit] = event_of(call, flow)["audits"]
    assert (audit["auditType"], audit["auditorName"]) == ("CompleteHandoff", "erp-status-checker")


def test_a_string_result_is_sent_verbatim_and_no_result_sends_empty_content(call, resolve, flow, transport):
    parked(resolve, flow)
    assert complete(call, flow, result="<ok/>").status == 202
    assert body_of(transport.sent[0][1])["EventContent"] == {"EventTypeId": EVENT_TYPE, "EventJson": "<ok/>"}
    other = Flow(endpoint=flow.endpoint, event_id=flow.event_id + "-2")
    parked(resolve, other)
    assert complete(call, other).status == 202
    assert body_of(transport.sent[1][1]) == {"EventContent": None, "ErrorContent": None}


def test_fail_sends_error_content_and_audits_fail_handoff(call, resolve, flow, transport):
    parked(resolve, flow)
    result = fail(call, flow, errorType="DmfValidation")
    assert result.status == 202, result.body
    [(_, message)] = transport.sent
    assert props(message)["MessageType"] == "HandoffFailedRequest"
    assert body_of(message) == {
        "EventContent": None,
        "ErrorContent": {
            "ErrorText": "DMF import rejected 3 rows",
            "ErrorType": "DmfValidation",
            "ExceptionStackTrace": None,
            "ExceptionSource": None,
        },
    }
    [audit] = event_of(call, flow)["audits"]
    assert audit["auditType"] == "FailHandoff" and audit["auditorName"] == "api"


def test_the_adapter_path_may_address_the_parked_request_and_omit_lineage(call, resolve, flow, transport):
    parked(resolve, flow)
    coords = {"eventId": flow.event_id, "sessionId": "session-1", "messageId": "req-1"}
    assert complete(call, flow, coordinates=coords).status == 202
    message = transport.sent[0][1]
    assert props(message)["ParentMessageId"] == "req-1"
    assert props(message)["OriginatingMessageId"] == "req-1"
    assert message.correlation_id == "corr-1"  # filled from the row


def test_an_unknown_event_is_404(call, flow, transport):
    result = complete(call, flow)
    assert result.status == 404 and result.content_type.startswith("application/problem+json")
    assert transport.sent == []


def test_a_row_that_is_not_a_pending_handoff_is_409(call, resolve, flow, transport):
    resolve(flow.request())
    result = complete(call, flow)
    assert result.status == 409
    assert "not a pending hand-off" in result.json["detail"]
    assert transport.sent == [] and event_of(call, flow)["audits"] == []


@pytest.mark.parametrize(
    ("override", "field"),
    [({"sessionId": "other"}, "coordinates.sessionId"), ({"messageId": "park-0"}, "coordinates.messageId")],
)
def test_coordinates_that_do_not_address_the_parked_message_are_409(
    call, resolve, flow, transport, override, field
):
    parked(resolve, flow)
    result = complete(call, flow, coordinates=coordinates(flow, **override))
    assert result.status == 409 and result.json["field"] == field
    assert transport.sent == []


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("handoff_fail", {"errorText": "  "}, "errorText"),
        ("handoff_fail", {"errorText": None}, "errorText"),
        ("handoff_complete", {"coordinates": {"eventId": "e"}}, "coordinates.messageId"),
        ("handoff_complete", {"endpointId": ""}, "endpointId"),
        ("handoff_complete", {"unknown": 1}, "unknown"),
    ],
)
def test_bad_requests_are_400_naming_the_field(call, flow, transport, name, body, field):
    payload = {"endpointId": flow.endpoint, "coordinates": coordinates(flow), "errorText": "x"}
    if name == "handoff_complete":
        payload.pop("errorText")
    payload.update(body)
    payload = {k: v for k, v in payload.items() if v is not None}
    result = call(name, payload)
    assert result.status == 400, result.body
    assert result.json["field"] == field


def test_a_second_settlement_while_the_first_is_in_flight_is_409(call, resolve, flow, transport):
    parked(resolve, flow)
    assert complete(call, flow).status == 202
    second = fail(call, flow)
    assert second.status == 409 and "already in flight" in second.json["detail"]
    assert len(transport.sent) == 1
    assert len(event_of(call, flow)["audits"]) == 1


def test_twenty_threads_settling_one_handoff_send_exactly_one_message(call, resolve, flow, transport):
    parked(resolve, flow)
    statuses: list[int] = []
    barrier = threading.Barrier(20)

    def settle(i: int) -> None:
        barrier.wait()
        result = (
            complete(call, flow, settledBy=f"agent-{i}")
            if i % 2
            else fail(call, flow, settledBy=f"agent-{i}")
        )
        statuses.append(result.status)

    threads = [threading.Thread(target=settle, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [202] + [409] * 19
    assert len(transport.sent) == 1
    assert len(event_of(call, flow)["audits"]) == 1


def test_a_failing_send_is_503_releases_the_claim_writes_no_audit_and_a_retry_succeeds(
    call, resolve, flow, transport
):
    parked(resolve, flow)
    transport.fail = True
    failed = complete(call, flow)
    assert failed.status == 503 and failed.content_type.startswith("application/problem+json")
    row = event_of(call, flow)
    assert row["audits"] == []
    # The hand-off is still offered to agents (the claim mark was released with the claim)
    nxt = call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint})
    assert nxt.status == 200
    transport.fail = False
    assert complete(call, flow).status == 202
    assert len(transport.sent) == 1 and len(event_of(call, flow)["audits"]) == 1


def test_without_service_bus_or_loopback_settlement_is_503_saying_what_to_set(
    call, resolve, flow, monkeypatch
):
    for name in ("ServiceBusConnection", "ServiceBusConnection__fullyQualifiedNamespace", "SETTLE_LOOPBACK"):
        monkeypatch.delenv(name, raising=False)
    service.reset()
    try:
        parked(resolve, flow)
        result = complete(call, flow)
        assert result.status == 503
        assert "ServiceBusConnection" in result.json["detail"] and "SETTLE_LOOPBACK" in result.json["detail"]
        assert event_of(call, flow)["audits"] == []
    finally:
        service.reset()


def test_a_settlement_costs_three_table_round_trips(call, resolve, flow, transport):
    parked(resolve, flow)
    with ROUND_TRIPS.measure() as tally:
        settlement_result = complete(call, flow)
    assert settlement_result.status == 202
    # Read the event row; one $batch: claim (its audit) + reconcile row + queue mark; send; one $batch: the
    # claim marked sent and its reconcile row deleted.
    assert tally.methods == ["GET", "POST", "POST"]


def test_control_messages_projected_by_the_resolver_move_the_row_out_of_the_queue(
    call, resolve, flow, transport
):
    transport.forward = True
    parked(resolve, flow)
    assert complete(call, flow).status == 202
    row = event_of(call, flow)
    assert (row["resolutionStatus"], row["pendingSubStatus"], row["messageType"]) == (
        "Pending",
        None,
        MessageType.HandoffCompletedRequest.name,
    )
    # The same settlement retried is answered from its claim; another one is refused
    again = complete(call, flow)
    assert again.status == 202 and again.json["replayed"] is True
    assert fail(call, flow).status == 409
    assert len(transport.sent) == 1


def test_a_result_too_large_for_a_service_bus_message_is_413(call, resolve, flow, transport):
    parked(resolve, flow)
    result = complete(call, flow, result="x" * 300_000)
    assert result.status == 413 and result.json["field"] == "result"
    assert transport.sent == [] and event_of(call, flow)["audits"] == []
