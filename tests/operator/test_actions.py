"""Resubmit / skip / settle from the operator's side: NimBus's wire shape, rules, exactly once, who."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from handoff import service
from handoff.messages.contract import MessageType
from handoff.timers.reconciler import Reconciler
from tests.handoff.broker import Broker, BrokerTransport
from tests.support.handoff_flows import event_of
from tests.support.operator_calls import act

from .conftest import failed_event, principal_headers

# The application properties NimBus always writes on a Manager request (contract §1.2, §1.5).
NIMBUS_PROPERTIES = {
    "To",
    "From",
    "MessageType",
    "EventId",
    "OriginatingMessageId",
    "ParentMessageId",
    "RetryCount",
    "OriginatingFrom",
    "EventTypeId",
}


def props(message) -> dict[str, Any]:
    return {str(k): v for k, v in (message.application_properties or {}).items()}


def body_of(message) -> Any:
    from handoff.messages.transport import message_body

    return json.loads(message_body(message))


def test_resubmit_sends_exactly_the_nimbus_resubmission_request_and_audits_it(call, resolve, flow, transport):
    failed_event(resolve, flow)
    answer = act(call, flow, "resubmit", {"by": "alice", "reason": "ERP is back"})
    assert answer.status == 202, answer.body
    [(topic, message)] = transport.sent
    p = props(message)
    assert topic == flow.endpoint
    assert p["MessageType"] == "ResubmissionRequest"
    assert (p["To"], p["From"], p["EventId"]) == (flow.endpoint, "Manager", flow.event_id)
    assert p["ParentMessageId"] == "err-1"  # the failed response it answers
    assert set(p) == NIMBUS_PROPERTIES  # contract §1.2: exactly these names, nothing of Settle's own
    assert (p["OriginatingFrom"], p["RetryCount"], p["EventTypeId"]) == ("self", 0, "Billing.InvoiceCreated")
    assert message.session_id == "session-1" and message.correlation_id == "req-1"
    assert body_of(message)["EventContent"] == {
        "EventTypeId": "Billing.InvoiceCreated",
        "EventJson": '{"invoice": 42}',
    }
    assert answer.json["action"] == "Resubmit" and answer.json["by"] == "alice"
    assert (
        answer.json["audit"]["auditType"] == "Resubmit" and answer.json["audit"]["comment"] == "ERP is back"
    )
    audits = event_of(call, flow)["audits"]
    assert [(a["auditType"], a["auditorName"]) for a in audits] == [("Resubmit", "alice")]


def test_resubmit_with_changes_sends_the_edited_payload(call, resolve, flow, transport):
    failed_event(resolve, flow)
    answer = act(call, flow, "resubmit", {"eventJson": '{"invoice": 43}'})
    assert answer.status == 202, answer.body
    assert body_of(transport.sent[0][1])["EventContent"]["EventJson"] == '{"invoice": 43}'
    assert answer.json["audit"]["auditType"] == "ResubmitWithChanges"
    assert json.loads(answer.json["audit"]["data"])["eventJson"] == '{"invoice": 43}'
    assert answer.json["by"] == "api"  # no principal, no `by`


def test_resubmit_takes_the_latest_request_payload_not_the_last_message(call, resolve, flow, transport):
    failed_event(resolve, flow)
    resolve(
        flow.control(
            MessageType.ResubmissionRequest, message_id="rs-1", parent="err-1", event_json='{"v": 2}'
        )
    )
    resolve(
        flow.response(
            MessageType.ErrorResponse, message_id="err-2", parent="rs-1", event_json=None, error_text="x"
        )
    )
    assert act(call, flow, "resubmit").status == 202
    assert body_of(transport.sent[0][1])["EventContent"]["EventJson"] == '{"v": 2}'


def test_skip_sends_an_empty_skip_request_correlated_with_the_skipped_message(call, resolve, flow, transport):
    failed_event(resolve, flow)
    answer = act(call, flow, "skip", {"reason": "duplicate invoice"})
    assert answer.status == 202, answer.body
    [(_, message)] = transport.sent
    p = props(message)
    assert p["MessageType"] == "SkipRequest" and p["From"] == "Manager" and p["ParentMessageId"] == "err-1"
    assert set(p) == NIMBUS_PROPERTIES and p["To"] == flow.endpoint and p["EventId"] == flow.event_id
    assert message.session_id == "session-1"
    assert message.correlation_id == "err-1"
    assert body_of(message) == {"EventContent": None, "ErrorContent": None}
    assert answer.json["audit"]["auditType"] == "Skip"


@pytest.mark.parametrize(
    ("last", "action", "status"),
    [
        ("request", "resubmit", 409),  # Pending: nothing to resubmit
        ("request", "skip", 409),
        ("completed", "skip", 409),
        ("completed", "resubmit", 202),  # NimBus allows resubmitting a Completed event
        ("deferred", "skip", 202),
        ("deferred", "resubmit", 409),
        ("unsupported", "resubmit", 202),
        ("deadlettered", "skip", 202),
        ("parked", "resubmit", 202),  # Pending + Handoff: NimBus FR-042 keeps resubmit and skip
        ("parked", "skip", 202),
        ("skipped", "resubmit", 409),
        ("skipped", "skip", 409),
    ],
)
def test_nimbus_state_rules_decide_what_is_allowed(call, resolve, flow, transport, last, action, status):
    resolve(flow.request())
    kinds = {
        "completed": (MessageType.ResolutionResponse, {}),
        "deferred": (MessageType.DeferralResponse, {}),
        "unsupported": (MessageType.UnsupportedResponse, {}),
        "deadlettered": (MessageType.ErrorResponse, {"DeadLetterErrorDescription": "poison"}),
        "parked": (MessageType.PendingHandoffResponse, {"HandoffReason": "DMF", "ExternalJobId": "j-1"}),
        "skipped": (MessageType.SkipResponse, {}),
    }
    if last in kinds:
        kind, extra = kinds[last]
        resolve(flow.response(kind, message_id="rsp-1", **extra))
    answer = act(call, flow, action)
    assert answer.status == status, answer.body
    assert len(transport.sent) == (1 if status == 202 else 0)
    if status == 409:
        assert answer.json["type"] == "urn:settle:problem:conflict" and event_of(call, flow)["audits"] == []


def test_an_unknown_event_is_404_and_writes_nothing(call, flow, transport):
    assert act(call, flow, "resubmit").status == 404
    assert act(call, flow, "skip").status == 404
    assert transport.sent == []


def test_a_principal_without_the_operator_role_gets_403_an_access_denied_audit_and_nothing_sent(
    call, resolve, flow, transport
):
    failed_event(resolve, flow)
    answer = act(call, flow, "resubmit", {"by": "ignored"}, headers=principal_headers("mallory@contoso.com"))
    assert answer.status == 403 and answer.json["type"] == "urn:settle:problem:access-denied"
    assert transport.sent == []
    [audit] = event_of(call, flow)["audits"]
    assert audit["auditType"] == "Resubmit" and audit["accessDenied"] is True
    assert audit["auditorName"] == "mallory@contoso.com"


def test_an_operator_principal_is_recorded_as_who_did_it(call, resolve, flow, transport):
    failed_event(resolve, flow)
    headers = principal_headers("olivia@contoso.com", "Settle.Operator")
    answer = act(call, flow, "skip", {"by": "someone-else"}, headers=headers)
    assert answer.status == 202, answer.body
    [audit] = event_of(call, flow)["audits"]
    assert audit["auditorName"] == "olivia@contoso.com"
    assert audit["principalId"] == "00000000-0000-0000-0000-000000000001"


def test_in_azure_no_principal_means_401(call, resolve, flow, transport, monkeypatch):
    failed_event(resolve, flow)
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "abc123")  # App Service sets it on every instance
    answer = act(call, flow, "resubmit", {"by": "anyone"})
    assert answer.status == 401 and transport.sent == []
    assert call("endpoints_overview", method="GET").status == 401


def test_in_azure_without_app_service_authentication_forged_operator_headers_send_nothing(
    call, resolve, flow, transport, monkeypatch
):
    failed_event(resolve, flow)
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "abc123")
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "disabled")  # the Bicep without operatorAppClientId
    forged = principal_headers("eve", "Settle.Operator")
    answer = act(call, flow, "resubmit", headers=forged)
    assert answer.status == 401 and transport.sent == []
    assert call("endpoints_overview", method="GET", headers=forged).status == 401
    monkeypatch.delenv("SETTLE_OPERATOR_AUTH")
    monkeypatch.delenv("WEBSITE_INSTANCE_ID")
    assert event_of(call, flow)["audits"] == []


def test_two_operators_resubmitting_at_once_send_one_message(call, resolve, flow, transport):
    failed_event(resolve, flow)
    answers = []

    def operator(name: str) -> None:
        answers.append(act(call, flow, "resubmit", {"by": name}))

    threads = [threading.Thread(target=operator, args=(f"op-{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(a.status for a in answers) == [202] + [409] * 5
    assert len(transport.sent) == 1
    assert [a["auditType"] for a in event_of(call, flow)["audits"]] == ["Resubmit"]


def test_a_resubmit_and_a_skip_of_the_same_failure_cannot_both_be_sent(call, resolve, flow, transport):
    failed_event(resolve, flow)
    assert act(call, flow, "resubmit", {"by": "a"}).status == 202
    skip = act(call, flow, "skip", {"by": "b"})
    assert skip.status == 409 and skip.json["type"] == "urn:settle:problem:settlement-in-flight"
    assert len(transport.sent) == 1


def test_a_retried_resubmit_is_answered_from_its_claim(call, resolve, flow, transport):
    failed_event(resolve, flow)
    first = act(call, flow, "resubmit", {"by": "alice"})
    again = act(call, flow, "resubmit", {"by": "alice"})
    assert again.status == 202 and again.json["replayed"] is True
    assert again.json["controlMessageId"] == first.json["controlMessageId"]
    assert len(transport.sent) == 1


def test_a_refused_send_is_503_and_leaves_no_audit(call, resolve, flow, transport):
    failed_event(resolve, flow)
    transport.fail = True
    answer = act(call, flow, "skip")
    assert answer.status == 503
    assert event_of(call, flow)["audits"] == []
    transport.fail = False
    assert act(call, flow, "skip").status == 202


def test_a_resubmit_delivered_then_raised_is_confirmed_by_the_reconciler(call, resolve, flow):
    broker = Broker()
    bus = BrokerTransport(broker).then(["deliver-then-raise"])
    service.use_transport(bus)
    try:
        failed_event(resolve, flow)
        answer = act(call, flow, "resubmit", {"by": "alice"})
        assert answer.status == 202 and answer.json["confirmed"] is False
        broker.pump()  # the broker had accepted it: the resolver projects its copy
        report = Reconciler(service.settlement_service(), clock=lambda: _later(3)).run()
        assert flow.event_id in report.delivered
        assert len(broker.for_event(flow.event_id)) == 1
        row = event_of(call, flow)
        assert row["resolutionStatus"] == "Pending" and row["messageType"] == "ResubmissionRequest"
        assert [a["auditType"] for a in row["audits"]] == ["Resubmit"]
    finally:
        service.reset()


def test_the_console_settles_a_parked_hand_off_as_the_operator(call, resolve, flow, transport):
    resolve(flow.request())
    resolve(flow.park())
    detail = call(
        "endpoint_event", method="GET", route_params={"endpointId": flow.endpoint, "eventId": flow.event_id}
    )
    assert detail.json["actions"] == ["complete", "fail", "resubmit", "skip"]
    answer = act(call, flow, "complete", {"result": {"ledger": 1}, "by": "olivia"})
    assert answer.status == 202, answer.body
    [(_, message)] = transport.sent
    assert props(message)["MessageType"] == "HandoffCompletedRequest"
    assert props(message)["ParentMessageId"] == "park-1"
    assert answer.json["audit"]["auditType"] == "CompleteHandoff"
    assert act(call, flow, "fail", {"errorText": "too late", "by": "olivia"}).status == 409


def _later(minutes: float):
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) + timedelta(minutes=minutes)


def test_a_projection_between_the_check_and_the_claim_refuses_the_action(
    call, resolve, flow, transport, monkeypatch
):
    # Given a failed event, and the subscriber's SkipResponse projected right after the operator's read
    failed_event(resolve, flow)
    store = service.store()
    original = store.event_rows

    def read_then_project(endpoint_id, event_id):
        rows = list(original(endpoint_id, event_id))
        resolve(flow.response(MessageType.SkipResponse, message_id="skip-rsp", parent="err-1"))
        return iter(rows)

    monkeypatch.setattr(store, "event_rows", read_then_project)
    # When the operator resubmits (the check saw Failed)
    answer = act(call, flow, "resubmit", {"by": "alice"})
    monkeypatch.undo()
    # Then the claim fails whole: 409, nothing sent, no audit, no claim left behind
    assert answer.status == 409 and "changed" in answer.json["detail"]
    assert transport.sent == []
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Skipped" and row["audits"] == []
    assert service.store().claims(flow.endpoint, flow.event_id) == []


def test_a_skip_lost_before_the_broker_is_re_sent_once_by_the_reconciler(call, resolve, flow):
    # Given a send that times out before the broker got the message (the sender cannot tell)
    broker = Broker()
    bus = BrokerTransport(broker).then(["lost-before"])
    service.use_transport(bus)
    try:
        failed_event(resolve, flow)
        answer = act(call, flow, "skip", {"by": "alice"})
        assert answer.status == 202 and answer.json["confirmed"] is False
        assert broker.for_event(flow.event_id) == []
        # When the reconciler looks after its two minutes (inside the duplicate-detection window)
        settlement = service.settlement_service()
        settlement.clock = lambda: _later(3)
        report = Reconciler(settlement).run()
        broker.pump()
        # Then the identical message reached the endpoint exactly once, with one audit
        assert flow.event_id in report.resent
        [copy] = broker.for_event(flow.event_id)
        assert copy.message_type == "SkipRequest" and copy.message_id == answer.json["controlMessageId"]
        assert [a["auditType"] for a in event_of(call, flow)["audits"]] == ["Skip"]
        settlement.clock = lambda: _later(20)  # past the window: nothing is ever re-sent again
        Reconciler(settlement).run()
        assert len(broker.for_event(flow.event_id)) == 1
    finally:
        service.reset()
