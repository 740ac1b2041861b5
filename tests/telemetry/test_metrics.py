"""Metric values after a known sequence of operations (the SDK's in-memory metric reader)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.policies import HTTPPolicy
from azure.functions.timer import TimerRequest

from common import runtime
from common.clock import utcnow
from handoff import service as handoff_service
from state import service as state_service
from tests.handoff.conftest import CaptureTransport
from tests.support.handoff_flows import Flow, complete, fail, nimbus, parked
from tests.telemetry.conftest import Recorded


def key(item: str) -> dict[str, Any]:
    return {"tenantId": 3, "scopeId": 4, "entityId": 9, "itemEntityKey": "invoice", "itemKey": item}


@pytest.fixture
def capture(fresh_tables: str):
    transport = CaptureTransport()
    handoff_service.use_transport(transport)
    yield transport
    handoff_service.reset()


def test_state_metrics_after_locks_a_set_a_miss_and_a_catch_up(otel: Recorded, call, fresh_tables):
    first, short = key("A-" + uuid.uuid4().hex), key("B-" + uuid.uuid4().hex)
    token = call("state_lock", {"key": first}).json["lockToken"]
    assert call("state_lock", {"key": first}).json["acquired"] is False
    assert call("state_lock", {"key": short, "lockSeconds": 1}).json["acquired"] is True
    assert call("state_set", {"key": first, "status": "Processed", "lockToken": token}).status == 200
    assert call("state_get", {"key": key("missing")}).status == 404
    result = state_service.catchup().run(now=utcnow() + timedelta(minutes=2))
    assert result.locks_failed == 1

    assert otel.value("settle.state.locks", outcome="acquired") == 2
    assert otel.value("settle.state.locks", outcome="refused") == 1
    assert otel.value("settle.state.locks") == 3
    assert otel.value("settle.state.operations", op="lock", outcome="acquired") == 2
    assert otel.value("settle.state.operations", op="lock", outcome="refused") == 1
    assert otel.value("settle.state.operations", op="set", outcome="applied") == 1
    assert otel.value("settle.state.operations", op="get", outcome="not-found") == 1
    assert otel.value("settle.state.operations") == 5
    assert otel.value("settle.state.duration", op="lock") == 3  # a histogram: its count
    assert otel.value("settle.catchup.expired_locks") == 1
    run = otel.span("settle.catchup.run")
    assert run.attributes is not None and run.attributes["settle.catchup.locks_failed"] == 1
    [event] = [e for e in run.events if e.name == "settle.catchup.lock_expired"]
    assert event.attributes is not None and event.attributes["settle.tenant_id"] == 3


def test_resolver_and_settlement_metrics(otel: Recorded, call, resolve, capture, fresh_tables):
    flow = Flow(endpoint="Billing-" + uuid.uuid4().hex[:8], event_id=str(uuid.uuid4()))
    parked(resolve, flow)  # EventRequest + PendingHandoffResponse, both applied
    resolve(flow.request(correlation_id="corr-1"))  # the same request again: a duplicate
    resolve(nimbus("NoSuchType", endpoint=flow.endpoint, event_id=flow.event_id))  # poison
    assert complete(call, flow).status == 202
    assert complete(call, flow).json["replayed"] is True  # the same settlement retried
    assert fail(call, flow).status == 409  # another settlement while the first holds the claim

    assert otel.value("settle.resolver.messages", message_type="EventRequest", outcome="applied") == 1
    assert (
        otel.value("settle.resolver.messages", message_type="PendingHandoffResponse", outcome="applied") == 1
    )
    assert otel.value("settle.resolver.messages", message_type="EventRequest", outcome="duplicate") == 1
    assert otel.value("settle.resolver.messages", message_type="Unparsed", outcome="poison") == 1
    assert otel.value("settle.handoff.settlements", kind="complete", outcome="sent") == 1
    assert otel.value("settle.handoff.settlements", kind="complete", outcome="replayed") == 1
    assert otel.value("settle.handoff.settlements", kind="fail", outcome="in-flight") == 1
    assert otel.value("settle.handoff.settlements") == 3


def test_a_settlement_without_a_bus_counts_as_unavailable(otel: Recorded, call, resolve, capture, flow):
    parked(resolve, flow)
    capture.fail = True
    assert complete(call, flow).status == 503
    assert otel.value("settle.handoff.settlements", kind="complete", outcome="unavailable") == 1
    assert otel.span("settle.handoff.complete").status.status_code.name == "ERROR"


def test_the_sweeper_tick_reports_parked_and_overdue_hand_offs_per_endpoint(
    otel: Recorded, functions, resolve, capture, fresh_tables, monkeypatch
):
    monkeypatch.setenv("HANDOFF_SWEEPER_ENABLED", "false")
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    due = (utcnow() - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    parked(resolve, Flow(endpoint=endpoint, event_id=str(uuid.uuid4())), expected_by=due)
    parked(resolve, Flow(endpoint=endpoint, event_id=str(uuid.uuid4())), message_id="park-2", job="job-2")
    functions["handoff_sweeper"].get_user_function()(TimerRequest(past_due=False))

    assert otel.value("settle.handoff.parked", endpoint=endpoint) == 2
    assert otel.value("settle.handoff.overdue", endpoint=endpoint, sweeper="off") == 1
    tick = otel.span("settle.sweeper.run")
    assert tick.attributes is not None and tick.attributes["settle.sweeper.enabled"] is False
    assert otel.span("settle.reconciler.run").parent is not None


class _FailFirstAttempt(HTTPPolicy[Any, Any]):
    """The first point read never leaves (a connection refused); the SDK's retry sends it again (the SDK
    retries a failed request only for idempotent methods, so a GET)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0

    def send(self, request: Any) -> Any:
        if self.failed == 0 and request.http_request.method == "GET":
            self.failed += 1
            raise ServiceRequestError("connection refused (test)")
        return self.next.send(request)


def test_a_request_the_sdk_sent_again_counts_as_a_storage_retry(otel: Recorded, call, fresh_tables):
    assert call("state_lock", {"key": key("warm-" + uuid.uuid4().hex)}).status == 200  # tables exist
    fault = _FailFirstAttempt()
    runtime.reset(policies=[fault])
    try:
        assert call("state_get", {"key": key("none-" + uuid.uuid4().hex)}).status == 404
    finally:
        runtime.reset()
    assert fault.failed == 1
    assert otel.value("settle.storage.retries", method="GET") == 1
