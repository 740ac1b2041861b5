"""End to end over the loopback transport: park → receive → settle → projection → terminal → Completed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from handoff.messages.contract import MessageType
from tests.support.handoff_flows import Flow, event_of


def test_a_parked_event_is_received_settled_and_completed(call, resolve, flow: Flow, loopback):
    # Given an event handed off an hour ago
    resolve(flow.request(enqueued=datetime.now(UTC) - timedelta(hours=1)))
    resolve(flow.park(ProcessingTimeMs=80))
    # When an agent receives it and completes it with the coordinates it got
    received = call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint})
    assert received.status == 200
    settled = call(
        "handoff_complete",
        {"endpointId": flow.endpoint, "coordinates": received.json["coordinates"], "result": {"ok": True}},
        headers={"x-agent-id": "enrichment-agent"},
    )
    assert settled.status == 202 and settled.json["transport"] == "loopback"
    # Then the resolver projected the forwarded copy: plain Pending, out of the receive queue
    row = event_of(call, flow)
    assert (row["resolutionStatus"], row["pendingSubStatus"], row["messageType"]) == (
        "Pending",
        None,
        "HandoffCompletedRequest",
    )
    assert row["from"] == "Manager" and row["lastMessageId"] == settled.json["controlMessageId"]
    assert call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint}).status == 204
    # When the subscriber answers the settlement with its terminal ResolutionResponse
    resolve(
        flow.response(
            MessageType.ResolutionResponse,
            parent=settled.json["controlMessageId"],
            correlation_id=settled.json["controlMessageId"],
            ProcessingTimeMs=12,
        )
    )
    # Then the event is Completed with the wall-clock processing time since the request
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Completed"
    assert row["processingTimeMs"] >= 3600 * 1000 - 5000
    assert [h["messageType"] for h in row["history"]] == [
        "EventRequest",
        "PendingHandoffResponse",
        "HandoffCompletedRequest",
        "ResolutionResponse",
    ]
    [audit] = row["audits"]
    assert (audit["auditType"], audit["auditorName"]) == ("CompleteHandoff", "enrichment-agent")


def test_a_failed_handoff_ends_failed_with_the_error_text(call, resolve, flow: Flow, loopback):
    resolve(flow.request())
    resolve(flow.park())
    received = call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint}).json
    settled = call(
        "handoff_fail",
        {"endpointId": flow.endpoint, "coordinates": received["coordinates"], "errorText": "job cancelled"},
    )
    assert settled.status == 202
    assert event_of(call, flow)["messageType"] == "HandoffFailedRequest"
    resolve(
        flow.response(
            MessageType.ErrorResponse, parent=settled.json["controlMessageId"], error_text="job cancelled"
        )
    )
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Failed"
    assert row["messageContent"]["ErrorContent"]["ErrorText"] == "job cancelled"
    # A late settlement of the same hand-off is refused: the row is no longer parked
    again = call("handoff_complete", {"endpointId": flow.endpoint, "coordinates": received["coordinates"]})
    assert again.status == 409
