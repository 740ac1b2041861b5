"""The span trees an operator follows: lock → set with its storage calls, a resolver projection that
continues the message's trace, a settlement whose control message carries the span's context.

Recorded with the OpenTelemetry SDK's in-memory exporter against Azurite; Service Bus messages are the
runtime's and the SDK's own objects (``azure.functions.servicebus`` in, ``azure.servicebus`` out).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from opentelemetry.trace import StatusCode

from common.clock import utcnow
from handoff import service
from handoff.messages.contract import MessageType
from tests.handoff.conftest import CaptureTransport
from tests.support.handoff_flows import Flow, complete, nimbus, parked
from tests.telemetry.conftest import Recorded, attrs, parent_of

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def key(item: str | None = None) -> dict[str, object]:
    return {
        "tenantId": 7,
        "scopeId": 4,
        "entityId": 100,
        "itemEntityKey": "invoice",
        "itemKey": item or "INV-" + uuid.uuid4().hex[:8],
    }


def is_storage(span) -> bool:
    """A span the Azure SDK made for a Table call (azure-core's OpenTelemetry plugin)."""
    return (
        span.name.startswith(("TableClient.", "TableServiceClient."))
        or attrs(span).get("az.namespace") == "Microsoft.Data.Tables"
    )


def test_lock_then_set_is_two_spans_with_their_storage_calls_as_children(otel: Recorded, call):
    k = key()
    lock = call("state_lock", {"key": k}, headers={"traceparent": TRACEPARENT})
    assert lock.status == 200 and lock.json["acquired"], lock.body
    done = call("state_set", {"key": k, "status": "Processed", "lockToken": lock.json["lockToken"]})
    assert done.status == 200, done.body

    locked, recorded = otel.span("settle.state.lock"), otel.span("settle.state.set")
    # The caller's traceparent is the parent of the lock (no host context in-process).
    assert f"{locked.context.trace_id:032x}" == TRACE_ID
    assert f"{parent_of(locked).span_id:016x}" == PARENT_ID
    assert attrs(locked)["settle.outcome"] == "acquired"
    assert attrs(locked)["settle.status_before"] == "None"
    assert attrs(locked)["settle.status_after"] == "Processing"
    assert attrs(locked)["settle.tenant_id"] == 7
    assert attrs(locked)["settle.scope"] == "Element"
    assert attrs(locked)["settle.entity_id"] == 100
    assert attrs(locked)["settle.item_key"] == k["itemKey"]
    assert attrs(locked)["http.response.status_code"] == 200
    assert attrs(locked)["settle.storage.round_trips"] >= 1

    assert attrs(recorded)["settle.outcome"] == "applied"
    assert attrs(recorded)["settle.status_before"] == "Processing"
    assert attrs(recorded)["settle.status_after"] == "Processed"
    assert attrs(recorded)["settle.version"] == 2
    assert attrs(recorded)["settle.storage.round_trips"] == 1  # a fenced set: one transaction

    for parent in (locked, recorded):
        storage = [s for s in otel.children(parent) if is_storage(s)]
        assert storage, f"{parent.name} has no storage child span: {[s.name for s in otel.children(parent)]}"
        assert all(s.context.trace_id == parent.context.trace_id for s in storage)
    assert any("submit_transaction" in s.name for s in otel.children(recorded))


def test_a_refused_lock_and_a_lost_lock_are_outcomes_not_failures(otel: Recorded, call):
    k = key()
    first = call("state_lock", {"key": k})
    second = call("state_lock", {"key": k})
    assert second.json["acquired"] is False
    stale = call(
        "state_set", {"key": k, "status": "Processed", "lockToken": first.json["lockToken"][:-4] + "AAAA"}
    )
    assert stale.status == 409

    refused = [s for s in otel.spans("settle.state.lock") if attrs(s)["settle.outcome"] == "refused"]
    assert len(refused) == 1 and refused[0].status.status_code is StatusCode.UNSET
    assert attrs(refused[0])["settle.status_before"] == "Processing"
    lost = otel.span("settle.state.set")
    assert attrs(lost)["settle.outcome"] == "lock-lost"
    assert attrs(lost)["settle.problem.field"] == "lockToken"
    assert lost.status.status_code is StatusCode.UNSET


def test_a_storage_outage_is_a_failed_span_with_its_problem_slug(otel: Recorded, call, monkeypatch):
    from azure.core.exceptions import ServiceRequestError

    from state.store import StateStore

    def down(self, key):
        raise ServiceRequestError("connection refused (test)")

    monkeypatch.setattr(StateStore, "read_head", down)
    answer = call("state_get", {"key": key()})
    assert answer.status == 503
    span = otel.span("settle.state.get")
    assert span.status.status_code is StatusCode.ERROR
    assert attrs(span)["settle.outcome"] == "unavailable"
    assert attrs(span)["error.type"] == "ServiceRequestError"


def test_the_resolver_continues_the_trace_of_the_message_it_projects(otel: Recorded, resolve, flow: Flow):
    resolve(flow.request(traceparent=TRACEPARENT))
    span = otel.span("settle.resolver.project")
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{parent_of(span).span_id:016x}" == PARENT_ID and parent_of(span).is_remote
    assert attrs(span)["settle.outcome"] == "applied"
    assert attrs(span)["nimbus.event_id"] == flow.event_id
    assert attrs(span)["nimbus.message_id"] == "req-1"
    assert attrs(span)["nimbus.session_id"] == "session-1"
    assert attrs(span)["nimbus.message_type"] == "EventRequest"
    assert attrs(span)["nimbus.endpoint"] == flow.endpoint
    assert attrs(span)["settle.status_before"] == "None"
    assert attrs(span)["settle.status_after"] == "Pending"
    assert any(is_storage(s) for s in otel.children(span))


def test_the_message_s_trace_wins_over_the_host_s_invocation_which_becomes_a_link(
    otel: Recorded, resolve, flow: Flow
):
    from common import telemetry

    # Given the worker made the host's invocation current (PYTHON_ENABLE_OPENTELEMETRY in Azure)
    with telemetry.span("host.invocation (test)"):
        resolve(flow.request(traceparent=TRACEPARENT))
    host, span = otel.span("host.invocation (test)"), otel.span("settle.resolver.project")
    # Then the projection continues the message's trace, and links the invocation
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{parent_of(span).span_id:016x}" == PARENT_ID
    [link] = span.links
    assert link.context.span_id == host.context.span_id and link.context.trace_id == host.context.trace_id


def test_diagnostic_id_is_the_fallback_and_a_bad_traceparent_starts_a_new_trace(
    otel: Recorded, resolve, flow
):
    resolve(flow.request(**{"Diagnostic-Id": TRACEPARENT}))
    resolve(flow.park(traceparent="00-not-a-trace-context-01", correlation_id="req-1"))
    first, second = otel.spans("settle.resolver.project")
    assert f"{first.context.trace_id:032x}" == TRACE_ID
    assert f"{second.context.trace_id:032x}" != TRACE_ID and second.parent is None
    assert attrs(second)["settle.status_after"] == "Pending+Handoff"


def test_a_duplicate_and_a_poison_message_are_outcomes_of_the_projection(otel: Recorded, resolve, flow):
    resolve(flow.request())
    resolve(flow.request())
    resolve(nimbus("NoSuchType", endpoint=flow.endpoint, event_id=flow.event_id))
    outcomes = [attrs(s)["settle.outcome"] for s in otel.spans("settle.resolver.project")]
    assert outcomes == ["applied", "duplicate", "poison"]


@pytest.fixture
def capture(fresh_tables: str):
    transport = CaptureTransport()
    service.use_transport(transport)
    yield transport
    service.reset()


def test_a_settlement_s_control_message_carries_the_settlement_span_s_context(
    otel: Recorded, call, resolve, flow: Flow, capture: CaptureTransport
):
    parked(resolve, flow)
    accepted = complete(call, flow, settledBy="erp-checker")
    assert accepted.status == 202, accepted.body

    settled = otel.span("settle.handoff.complete")
    [(topic, message)] = capture.sent
    from azure.servicebus import ServiceBusMessage

    assert isinstance(message, ServiceBusMessage) and topic == flow.endpoint
    props = {str(k): v for k, v in (message.application_properties or {}).items()}
    flags = int(settled.context.trace_flags)
    expected = f"00-{settled.context.trace_id:032x}-{settled.context.span_id:016x}-{flags:02x}"
    assert props["traceparent"] == expected
    assert props["Diagnostic-Id"] == expected
    assert attrs(settled)["settle.outcome"] == "sent"
    assert attrs(settled)["nimbus.event_id"] == flow.event_id
    assert attrs(settled)["nimbus.parked_message_id"] == "park-1"
    assert attrs(settled)["nimbus.control_message_id"] == str(message.message_id)
    assert attrs(settled)["nimbus.endpoint"] == flow.endpoint
    assert attrs(settled)["settle.status_before"] == "Pending+Handoff"

    # The resolver's projection of that control message continues the settlement's trace.
    from handoff.messages.transport import to_trigger_message

    resolve(to_trigger_message(message, enqueued=utcnow()))
    projected = otel.spans("settle.resolver.project")[-1]
    assert projected.context.trace_id == settled.context.trace_id
    assert parent_of(projected).span_id == settled.context.span_id
    assert attrs(projected)["nimbus.message_type"] == MessageType.HandoffCompletedRequest.name


def test_a_re_send_by_the_reconciler_carries_the_original_context_and_links_it(
    otel: Recorded, call, resolve, flow: Flow, capture: CaptureTransport
):
    parked(resolve, flow)
    capture.duplicate_window = timedelta(minutes=10)
    original = {}

    def lost(topic, message):  # the send raised: outcome unknown, the claim stays open
        original.update({str(k): v for k, v in message.application_properties.items()})
        raise TimeoutError("the answer never came (test)")

    capture.send = lost  # type: ignore[method-assign]
    assert complete(call, flow).json["confirmed"] is False
    capture.send = CaptureTransport.send.__get__(capture)  # type: ignore[method-assign]
    service.settlement_service().clock = lambda: utcnow() + timedelta(minutes=3)
    report = service.reconciler().run()
    assert flow.event_id in report.resent

    [(_, again)] = capture.sent
    props = {str(k): v for k, v in again.application_properties.items()}
    assert props["traceparent"] == original["traceparent"]  # the identical message, context included
    resend = otel.span("settle.handoff.resend")
    [link] = resend.links
    assert original["traceparent"].startswith(f"00-{link.context.trace_id:032x}-{link.context.span_id:016x}-")
    assert attrs(resend)["settle.outcome"] == "sent"
    run = otel.span("settle.reconciler.run")
    assert parent_of(resend).span_id == run.context.span_id
    assert attrs(run)["settle.reconciler.resent"] == 1
