"""Settlement exactly once, whatever the send does: the claim is an outbox record.

Counted as the issue asks: messages that reached the endpoint topic (the broker model), audit rows,
history rows of control messages, and the final row state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.core.pipeline.policies import HTTPPolicy

from common import runtime
from common.clock import utcnow
from handoff import service
from handoff.messages.contract import MessageType
from tests.support.handoff_flows import (
    EVENT_TYPE,
    Flow,
    Undecodable,
    complete,
    coordinates,
    event_of,
    fail,
    parked,
)

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


def audits(call, flow: Flow, kind: str | None = None) -> list[dict[str, Any]]:
    rows = event_of(call, flow)["audits"]
    return [a for a in rows if kind is None or a["auditType"] == kind]


def control_history(call, flow: Flow) -> list[str]:
    return [
        h["messageId"]
        for h in event_of(call, flow)["history"]
        if h["messageType"] in ("HandoffCompletedRequest", "HandoffFailedRequest")
    ]


def state(call, flow: Flow) -> tuple[str, str | None, str]:
    row = event_of(call, flow)
    return row["resolutionStatus"], row["pendingSubStatus"], row["messageType"]


def later(minutes: float) -> None:
    """Move settlement's (and so the reconciler's) clock forward."""
    service.settlement_service().clock = lambda: utcnow() + timedelta(minutes=minutes)


def reconcile() -> Any:
    return service.reconciler().run()


SETTLED_COMPLETE = ("Pending", None, "HandoffCompletedRequest")


# --- a send that delivers, then raises ---------------------------------------------------


def test_a_send_that_delivers_then_raises_settles_once_with_one_audit(call, resolve, flow, broker, bus):
    # Given a parked hand-off, and a send the broker accepts (and the resolver projects at once) but that
    # then raises in the sender
    broker.forward = True
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    # When the caller settles, and retries as a careful caller does
    first = complete(call, flow, settledBy="erp-checker")
    again = complete(call, flow, settledBy="erp-checker")
    # Then Settle owns the outcome: accepted, not yet confirmed, and the retry is the same settlement
    assert first.status == 202, first.body
    assert first.json["confirmed"] is False
    assert again.status == 202, again.body
    assert again.json["controlMessageId"] == first.json["controlMessageId"]
    assert again.json["replayed"] is True and again.json["confirmed"] is True
    # And exactly one message reached the endpoint, one audit says who sent it, the row is settled
    assert len(broker.for_event(flow.event_id)) == 1
    [audit] = audits(call, flow)
    assert (audit["auditType"], audit["auditorName"]) == ("CompleteHandoff", "erp-checker")
    assert control_history(call, flow) == [first.json["controlMessageId"]]
    assert state(call, flow) == SETTLED_COMPLETE


def test_a_send_that_delivers_then_raises_while_the_resolver_lags_still_settles_once(
    call, resolve, flow, broker, bus
):
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    first = complete(call, flow)
    assert (first.status, first.json["confirmed"]) == (202, False)
    # The reconciler re-sends the identical message (same MessageId) once the confirmation window passed;
    # the topic's duplicate detection drops the copy.
    later(3)
    reconcile()
    broker.pump()
    assert len(broker.for_event(flow.event_id)) == 1
    assert [c.message_id for c in broker.dropped] == [first.json["controlMessageId"]]
    assert len(audits(call, flow)) == 1 and control_history(call, flow) == [first.json["controlMessageId"]]
    assert state(call, flow) == SETTLED_COMPLETE


def test_a_send_refused_before_reaching_the_broker_is_503_without_audit_and_a_retry_settles(
    call, resolve, flow, broker, bus
):
    parked(resolve, flow)
    bus.then(["refuse"])
    refused = complete(call, flow)
    assert refused.status == 503 and refused.content_type.startswith("application/problem+json")
    assert int(refused.headers["retry-after"]) >= 1
    assert audits(call, flow) == [] and broker.delivered == []
    # Still offered to agents: nothing is in flight
    assert call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint}).status == 200
    retried = complete(call, flow)
    assert retried.status == 202 and retried.json["confirmed"] is True
    broker.pump()
    assert len(broker.for_event(flow.event_id)) == 1 and len(audits(call, flow)) == 1
    assert state(call, flow) == SETTLED_COMPLETE


def test_a_send_error_that_proves_nothing_is_accepted_and_the_reconciler_delivers_it(
    call, resolve, flow, broker, bus
):
    parked(resolve, flow)
    bus.then(["lost-before"])
    first = complete(call, flow)
    assert (first.status, first.json["confirmed"]) == (202, False)
    assert broker.delivered == []
    later(1)
    reconcile()  # inside the confirmation window: nothing yet
    assert broker.delivered == []
    later(3)
    reconcile()
    broker.pump()
    [copy] = broker.for_event(flow.event_id)
    assert copy.message_id == first.json["controlMessageId"]
    assert len(audits(call, flow)) == 1 and state(call, flow) == SETTLED_COMPLETE


# --- where a re-send is not safe, the answer says what remains and where operators see it ----


def test_an_unconfirmed_answer_says_how_settle_follows_it_up(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    bus.then(["lost-before"])
    first = complete(call, flow)
    assert (first.status, first.json["confirmed"]) == (202, False)
    note = first.json["followUp"]
    assert "re-sends the identical message" in note and f"/handoffs/{flow.endpoint}/unconfirmed" in note
    later(3)
    reconcile()
    again = complete(call, flow)
    assert again.json["confirmed"] is True and again.json["followUp"] is None


def test_without_duplicate_detection_the_answer_states_the_residual(call, resolve, flow, broker, bus):
    broker.window = None  # topics NimBus provisioned: HANDOFF_DUPLICATE_DETECTION=false
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    first = complete(call, flow)
    assert (first.status, first.json["confirmed"]) == (202, False)
    note = first.json["followUp"]
    assert "never re-sends" in note and "HANDOFF_DUPLICATE_DETECTION" in note
    assert f"GET /api/v1/handoffs/{flow.endpoint}/unconfirmed" in note
    # It reached the endpoint after all: the resolver's projection confirms it
    broker.pump()
    again = complete(call, flow)
    assert again.json["confirmed"] is True and again.json["followUp"] is None
    assert complete(call, flow, result={"other": 1}).status == 409


def test_a_confirmed_answer_has_no_follow_up(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    accepted = complete(call, flow)
    assert accepted.json["confirmed"] is True and accepted.json["followUp"] is None


# --- a sent message is never taken over; different messages, different ids ----------------


def test_a_different_settlement_six_minutes_after_a_sent_one_is_refused(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    completed = complete(call, flow)
    assert completed.status == 202
    later(6)
    failed = fail(call, flow)
    assert failed.status == 409
    assert failed.json["type"] == "urn:settle:problem:settlement-in-flight"
    assert [c.message_type for c in broker.for_event(flow.event_id)] == ["HandoffCompletedRequest"]
    assert [a["auditType"] for a in audits(call, flow)] == ["CompleteHandoff"]


def test_different_messages_carry_different_message_ids(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    sent: list[str] = []
    original = bus.send

    def recording(topic: str, message: Any) -> None:
        sent.append(str(message.message_id))
        original(topic, message)

    bus.send = recording
    bus.then(["refuse"])
    assert complete(call, flow).status == 503
    assert fail(call, flow).status == 202
    assert len(sent) == 2 and sent[0] != sent[1]
    assert [c.message_id for c in broker.for_event(flow.event_id)] == [sent[1]]


# --- the same settlement, retried, is one settlement -------------------------------------------


def test_a_retried_settlement_is_answered_from_its_claim_and_sends_nothing_more(
    call, resolve, flow, broker, bus
):
    parked(resolve, flow)
    first = complete(call, flow, result={"rows": 3})
    second = complete(call, flow, result={"rows": 3})
    assert (first.status, second.status) == (202, 202)
    assert first.json["replayed"] is False and second.json["replayed"] is True
    assert second.json["controlMessageId"] == first.json["controlMessageId"]
    other = complete(call, flow, result={"rows": 4})  # not the same settlement
    assert other.status == 409 and other.json["type"] == "urn:settle:problem:settlement-in-flight"
    assert len(broker.for_event(flow.event_id)) == 1 and len(audits(call, flow)) == 1
    # After the resolver projected it, a retry is still answered (the row is no longer parked)
    broker.pump()
    third = complete(call, flow, result={"rows": 3})
    assert third.status == 202 and third.json["controlMessageId"] == first.json["controlMessageId"]
    assert fail(call, flow).status == 409


# --- the size limit is checked on the message as it will be sent -----------------------


def test_a_result_that_escapes_past_256_kb_on_the_wire_is_413(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    # 150,000 double quotes: 150 KB as given, about 300 KB once escaped inside EventJson on the wire
    result = complete(call, flow, result='"' * 150_000)
    assert result.status == 413 and result.json["field"] == "result"
    assert "262144" in result.json["detail"].replace(",", "")
    assert broker.delivered == [] and audits(call, flow) == []


def test_a_large_result_that_fits_as_sent_is_accepted_and_sent_byte_for_byte(
    call, resolve, flow, broker, bus
):
    parked(resolve, flow)
    payload = {"lines": "é" * 60_000 + '"' * 10_000}  # ~160 KB on the wire (é: 2 bytes, " escaped twice)
    accepted = complete(call, flow, result=payload)
    assert accepted.status == 202, accepted.body
    [copy] = broker.for_event(flow.event_id)
    body = json.loads(copy.body)
    assert json.loads(body["EventContent"]["EventJson"]) == payload
    assert 150_000 < len(copy.body) < 256 * 1024


# --- addressing by endpoint/event/message, session taken from the row -------------------


def test_the_session_may_be_omitted_and_is_taken_from_the_row(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    coords = {"eventId": flow.event_id, "messageId": "park-1"}
    accepted = complete(call, flow, coordinates=coords)
    assert accepted.status == 202, accepted.body
    [copy] = broker.for_event(flow.event_id)
    assert copy.message.session_id == "session-1"
    assert copy.message.correlation_id == "corr-1"
    assert copy.properties["OriginatingMessageId"] == "req-1"


def test_a_session_that_does_not_match_the_row_is_still_409(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    result = complete(call, flow, coordinates=coordinates(flow, sessionId="someone-else"))
    assert result.status == 409 and result.json["field"] == "coordinates.sessionId"


# --- storage throttling during a settlement is a 503 with Retry-After --------------------


class Throttle(HTTPPolicy):  # type: ignore[type-arg]
    """Answers the chosen storage request (by HTTP method) with 429 Too Many Requests, as the service
    does when a partition is over its target: the request is not applied."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method
        self.armed = False

    def send(self, request: Any) -> Any:
        if not (self.armed and request.http_request.method == self.method):
            return self.next.send(request)
        import requests
        from azure.core.pipeline import PipelineResponse
        from azure.core.pipeline.transport import RequestsTransportResponse

        raw = requests.Response()
        raw.status_code = 429
        raw.reason = "Too Many Requests"
        raw.headers["Content-Type"] = "application/json;odata=minimalmetadata"
        raw.headers["Retry-After"] = "7"
        raw._content = json.dumps(
            {"odata.error": {"code": "TooManyRequests", "message": {"lang": "en-US", "value": "throttled"}}}
        ).encode()
        response = RequestsTransportResponse(request.http_request, raw)
        return PipelineResponse(request.http_request, response, request.context)


@pytest.mark.parametrize("method", ["GET", "POST"], ids=["event read", "claim transaction"])
def test_storage_throttling_during_a_settlement_is_503_with_retry_after(call, resolve, flow, bus, method):
    throttle = Throttle(method)
    runtime.reset(policies=[throttle], client_options={"retry_total": 0})
    service.use_transport(bus)
    try:
        parked(resolve, flow)
        throttle.armed = True
        result = complete(call, flow)
        throttle.armed = False
        assert result.status == 503, result.body
        assert result.headers["retry-after"] == "7"
        assert result.json["type"] == "urn:settle:problem:unavailable"
        assert complete(call, flow).status == 202
    finally:
        runtime.reset()


def test_a_storage_answer_that_cannot_be_decoded_during_a_settlement_is_503(call, resolve, flow, bus):
    undecodable = Undecodable("GET")
    runtime.reset(policies=[undecodable], client_options={"retry_total": 0})
    service.use_transport(bus)
    try:
        parked(resolve, flow)
        undecodable.armed = 1
        result = complete(call, flow)
        assert undecodable.armed == 0
        assert result.status == 503, result.body
        assert int(result.headers["retry-after"]) >= 1
        assert result.json["type"] == "urn:settle:problem:unavailable"
        assert complete(call, flow).status == 202
    finally:
        runtime.reset()


# --- the audit holds valid JSON ---------------------------------------------------------


def test_the_audit_data_is_valid_json_whatever_the_result_size(call, resolve, flow, bus):
    parked(resolve, flow)
    result = {"note": 'a"b\\c' * 3_000, "n": 1}
    assert complete(call, flow, result=result).status == 202
    [audit] = audits(call, flow)
    data = json.loads(audit["data"])
    assert len(audit["data"]) <= 4000
    assert data["controlMessageId"] and data["parkedMessageId"] == "park-1"
    assert data["truncated"] == ["result"]
    assert json.dumps(result, separators=(",", ":")).startswith(data["result"])


# --- who settled, as the platform authenticated them -----------------------------------


def test_the_authenticated_principal_is_recorded_with_the_caller_supplied_names(
    call, resolve, flow, bus, monkeypatch
):
    parked(resolve, flow)
    # App Service authentication vouches for the principal headers (only then are they recorded)
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "required")
    headers = {
        "x-agent-id": "enrichment-agent",
        "x-ms-client-principal-name": "checker@contoso.example",
        "x-ms-client-principal-id": "00000000-0000-0000-0000-00000000c0de",
    }
    body = {"endpointId": flow.endpoint, "coordinates": coordinates(flow), "settledBy": "erp-checker"}
    assert call("handoff_complete", body, headers=headers).status == 202
    [audit] = audits(call, flow)
    assert audit["auditorName"] == "erp-checker"
    assert audit["principalName"] == "checker@contoso.example"
    assert audit["principalId"] == "00000000-0000-0000-0000-00000000c0de"
    data = json.loads(audit["data"])
    assert (data["agentId"], data["principalName"]) == ("enrichment-agent", "checker@contoso.example")
    claim = service.store().get_claim(flow.endpoint, flow.event_id, "park-1")
    assert claim is not None and claim.principal_name == "checker@contoso.example"


def test_without_authentication_no_principal_is_invented(call, resolve, flow, bus):
    parked(resolve, flow)
    assert complete(call, flow).status == 202
    [audit] = audits(call, flow)
    assert audit["principalName"] is None and audit["principalId"] is None


# --- the wire shape is kept through the outbox ---------------------------------------------------


def test_the_stored_message_is_the_sent_message(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    accepted = complete(call, flow, result={"rows": 3})
    [copy] = broker.for_event(flow.event_id)
    claim = service.store().get_claim(flow.endpoint, flow.event_id, "park-1")
    assert claim is not None
    stored = claim.outbox_message()
    assert stored.message_id == copy.message_id == accepted.json["controlMessageId"]
    resent = stored.to_service_bus()
    assert b"".join(resent.body) == copy.body
    assert {str(k): v for k, v in (resent.application_properties or {}).items()} == copy.properties
    assert (resent.session_id, resent.correlation_id) == ("session-1", "corr-1")
    assert copy.properties["EventTypeId"] == EVENT_TYPE
    assert copy.properties["MessageType"] == MessageType.HandoffCompletedRequest.name


def test_a_retry_resending_while_the_first_send_is_refused_cannot_free_the_handoff_for_another(
    call, resolve, flow, broker, bus
):
    # Given a first send that is refused while a retry of the same settlement (another instance) is in
    # the middle of re-sending the claim's message, which then reaches the broker
    import threading

    from handoff.messages.transport import SendRefused

    parked(resolve, flow)
    retry_sending, first_done = threading.Event(), threading.Event()
    original = bus.send

    def send(topic: str, message: Any) -> None:
        if threading.current_thread().name == "first":
            retry.start()
            assert retry_sending.wait(30)
            raise SendRefused("refused (test)")
        retry_sending.set()
        first_done.wait(30)  # the first sender handles its refusal meanwhile
        original(topic, message)

    bus.send = send
    answers: dict[str, Any] = {}
    retry = threading.Thread(target=lambda: answers.update(retry=complete(call, flow)), name="retry")
    first = threading.Thread(target=lambda: answers.update(first=complete(call, flow)), name="first")
    first.start()
    first.join(60)
    first_done.set()
    retry.join(60)
    # Then both answers name the one message that reached the broker, and the hand-off stays claimed
    [copy] = broker.for_event(flow.event_id)
    assert answers["retry"].status == 202, answers["retry"].body
    assert answers["retry"].json["controlMessageId"] == copy.message_id
    assert answers["first"].status in (202, 503)
    assert len(audits(call, flow)) == 1
    assert fail(call, flow).status == 409
    broker.pump()
    assert len(broker.for_event(flow.event_id)) == 1 and state(call, flow) == SETTLED_COMPLETE


def test_a_retry_answered_202_while_the_first_send_is_refused_keeps_its_claim(
    call, resolve, flow, broker, bus
):
    # Given topics without duplicate detection (a retry cannot re-send), and a first send that is refused
    # just after a retry of the same settlement was answered from its claim
    import threading

    from handoff.messages.transport import SendRefused

    broker.window = None
    parked(resolve, flow)
    answers: dict[str, Any] = {}
    retry = threading.Thread(target=lambda: answers.update(retry=complete(call, flow)))

    def send(topic: str, message: Any) -> None:
        retry.start()
        retry.join(60)  # the retry has its answer before the first sender learns of the refusal
        raise SendRefused("refused (test)")

    bus.send = send
    answers["first"] = complete(call, flow)
    # Then the 202 the retry got still stands: the claim was not released under it
    assert answers["retry"].status == 202 and answers["retry"].json["confirmed"] is False
    assert answers["first"].status == 202, answers["first"].body
    assert service.store().get_claim(flow.endpoint, flow.event_id, "park-1") is not None
    assert len(audits(call, flow)) == 1 and broker.delivered == []
