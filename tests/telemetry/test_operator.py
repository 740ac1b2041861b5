"""Operator actions are spans and counts too: ``settle.operator.<action>`` names the event it acted on and
its outcome; an operator's settlement nests the ``settle.handoff.*`` span whose context its control
message carries; a refusal is an outcome, not a failure; the principal stays out of telemetry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.trace import StatusCode

from handoff import service
from tests.handoff.conftest import CaptureTransport
from tests.operator.conftest import failed_event, principal_headers
from tests.support.handoff_flows import Flow, parked
from tests.support.operator_calls import act
from tests.telemetry.conftest import Recorded, attrs, parent_of


@pytest.fixture
def capture(fresh_tables: str) -> Iterator[CaptureTransport]:
    transport = CaptureTransport()
    service.use_transport(transport)
    yield transport
    service.reset()


def test_a_resubmit_is_a_span_naming_its_event_and_counted_by_outcome(
    otel: Recorded, call, resolve, flow: Flow, capture: CaptureTransport
):
    failed_event(resolve, flow)
    assert act(call, flow, "resubmit", {"by": "alice", "reason": "ERP is back"}).status == 202
    assert act(call, flow, "resubmit", {"by": "alice", "reason": "ERP is back"}).status == 202  # retried

    first, again = otel.spans("settle.operator.resubmit")
    for span in (first, again):
        a = attrs(span)
        assert (a["nimbus.endpoint"], a["nimbus.event_id"]) == (flow.endpoint, flow.event_id)
        assert a["http.response.status_code"] == 202
        assert "alice" not in str(a)  # who did it is in the audit row, not in telemetry
    assert attrs(first)["settle.outcome"] == "sent"
    assert attrs(again)["settle.outcome"] == "replayed"
    [(_, message)] = capture.sent
    assert attrs(first)["nimbus.control_message_id"] == str(message.message_id)
    assert otel.value("settle.operator.actions", action="resubmit", outcome="sent") == 1
    assert otel.value("settle.operator.actions", action="resubmit", outcome="replayed") == 1


def test_a_refused_or_forbidden_action_is_an_outcome_not_a_failure(
    otel: Recorded, call, resolve, flow: Flow, capture: CaptureTransport
):
    failed_event(resolve, flow)
    assert act(call, flow, "complete", {"by": "bob"}).status == 409  # not parked: nothing to complete
    denied = act(call, flow, "skip", {}, headers=principal_headers("mallory@contoso.com"))
    assert denied.status == 403

    refused = otel.span("settle.operator.complete")
    assert attrs(refused)["settle.outcome"] == "conflict"
    assert refused.status.status_code is not StatusCode.ERROR
    forbidden = otel.span("settle.operator.skip")
    assert attrs(forbidden)["settle.outcome"] == "access-denied"
    assert "mallory" not in str(attrs(forbidden))
    assert otel.value("settle.operator.actions", action="complete", outcome="conflict") == 1
    assert otel.value("settle.operator.actions", action="skip", outcome="access-denied") == 1
    assert capture.sent == []


def test_an_operator_s_settlement_nests_the_handoff_span_its_control_message_carries(
    otel: Recorded, call, resolve, flow: Flow, capture: CaptureTransport
):
    parked(resolve, flow)
    assert act(call, flow, "complete", {"by": "bob", "result": {"ok": True}}).status == 202

    operator = otel.span("settle.operator.complete")
    settlement = otel.span("settle.handoff.complete")
    assert parent_of(settlement).span_id == operator.context.span_id
    assert attrs(operator)["settle.outcome"] == "sent"
    [(_, message)] = capture.sent
    props = {str(k): v for k, v in (message.application_properties or {}).items()}
    carried = str(props["traceparent"])
    assert carried.split("-")[2] == format(settlement.context.span_id, "016x")
    assert otel.value("settle.operator.actions", action="complete", outcome="sent") == 1
