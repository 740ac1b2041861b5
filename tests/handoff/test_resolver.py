"""The resolver function against Azurite: status map, attribution, hand-off fields, Spec 030, duplicates."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from common.roundtrips import ROUND_TRIPS
from handoff import service
from handoff.messages.contract import MessageType
from handoff.projection.resolver import Outcome
from handoff.storage import keys
from tests.support.handoff_flows import EVENT_TYPE, Flow, event_of, nimbus

RESPONSE_STATUS = [
    (MessageType.ResolutionResponse, "Completed"),
    (MessageType.ErrorResponse, "Failed"),
    (MessageType.DeferralResponse, "Deferred"),
    (MessageType.SkipResponse, "Skipped"),
    (MessageType.UnsupportedResponse, "Unsupported"),
    (MessageType.PendingHandoffResponse, "Pending"),
]
REQUEST_TYPES = [
    MessageType.EventRequest,
    MessageType.ResubmissionRequest,
    MessageType.RetryRequest,
    MessageType.SkipRequest,
    MessageType.ContinuationRequest,
    MessageType.HandoffCompletedRequest,
    MessageType.HandoffFailedRequest,
]


def test_an_event_request_is_recorded_pending_under_the_consuming_endpoint(call, resolve, flow: Flow):
    # Given the forwarded copy of a request from Storefront to Billing
    resolve(flow.request(correlation_id="corr-1"))
    # Then the row is attributed by To, Pending, last written by the request, with one history entry
    row = event_of(call, flow)
    assert row["endpointId"] == flow.endpoint
    assert row["resolutionStatus"] == "Pending"
    assert row["pendingSubStatus"] is None
    assert row["messageType"] == "EventRequest"
    assert row["lastMessageId"] == "req-1"
    assert row["from"] == "Storefront" and row["to"] == flow.endpoint
    assert row["correlationId"] == "corr-1"
    assert row["eventTypeId"] == EVENT_TYPE
    assert row["messageContent"]["EventContent"]["EventJson"] == '{"invoice": 42}'
    assert [h["messageId"] for h in row["history"]] == ["req-1"]


@pytest.mark.parametrize(("kind", "status"), RESPONSE_STATUS)
def test_each_response_type_projects_its_status_and_is_attributed_by_from(call, resolve, flow, kind, status):
    resolve(flow.request())
    resolve(flow.response(kind, message_id=f"rsp-{kind.name}"))
    row = event_of(call, flow)
    assert row["resolutionStatus"] == status
    assert row["messageType"] == kind.name
    assert row["lastMessageId"] == f"rsp-{kind.name}"
    assert row["from"] == flow.endpoint and row["to"] == "Resolver"
    assert len(row["history"]) == 2


@pytest.mark.parametrize("kind", REQUEST_TYPES)
def test_each_request_type_projects_pending_attributed_by_to(call, resolve, flow, kind):
    # Given a failed event (so every control request is a legitimate transition)
    resolve(flow.request())
    resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="boom"))
    msg = (
        flow.request()
        if kind is MessageType.EventRequest
        else flow.control(kind, message_id="ctl-1", parent="err-1")
    )
    resolve(msg)
    row = event_of(call, flow)
    expected = "Failed" if kind is MessageType.EventRequest else "Pending"  # a late request copy is stale
    assert row["resolutionStatus"] == expected
    if kind is not MessageType.EventRequest:
        assert row["messageType"] == kind.name
        assert row["endpointId"] == flow.endpoint and row["from"] == "Manager"
        assert row["pendingSubStatus"] is None


def test_a_message_type_given_as_its_number_parses_like_the_name(call, resolve, flow):
    resolve(nimbus("1", endpoint=flow.endpoint, event_id=flow.event_id, to=flow.endpoint, message_id="req-1"))
    assert event_of(call, flow)["messageType"] == "EventRequest"


def test_a_dead_letter_description_makes_any_response_dead_lettered_with_the_reason(call, resolve, flow):
    resolve(flow.request())
    resolve(
        flow.response(
            MessageType.ResolutionResponse,
            DeadLetterErrorDescription="poison payload",
            DeadLetterReason="Permanent",
        )
    )
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "DeadLettered"
    assert row["reason"] == "poison payload"
    assert row["deadLetterReason"] == "Permanent"


def test_a_skip_response_carries_its_error_text_as_reason(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.SkipResponse, error_text="DuplicateDetected", event_json=None))
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Skipped"
    assert row["reason"] == "DuplicateDetected"


def test_a_request_without_from_is_still_recorded(call, resolve, flow):
    resolve(flow.request(from_=None, OriginatingFrom="Storefront"))
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Pending"
    assert row["from"] == "Storefront"  # NimBus: From = OriginatingFrom ?? "self"


def test_a_pending_handoff_response_parks_the_event_with_its_metadata(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.park(expected_by="2026-12-01T09:00:00.0000000Z"))
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Pending"
    assert row["pendingSubStatus"] == "Handoff"
    assert row["handoffReason"] == "Awaiting DMF import"
    assert row["externalJobId"] == "job-1"
    assert row["expectedBy"].startswith("2026-12-01T09:00:00")
    assert row["lastMessageId"] == "park-1" and row["parentMessageId"] == "req-1"
    job = call(
        "handoff_job", method="GET", route_params={"endpointId": flow.endpoint, "externalJobId": "job-1"}
    )
    assert job.status == 200 and job.json["coordinates"]["messageId"] == "park-1"


def test_a_settlement_request_projects_a_plain_pending_row_and_leaves_the_queue(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.park())
    resolve(flow.control(MessageType.HandoffCompletedRequest, message_id="settle-1", parent="park-1"))
    row = event_of(call, flow)
    assert (row["resolutionStatus"], row["pendingSubStatus"], row["messageType"]) == (
        "Pending",
        None,
        "HandoffCompletedRequest",
    )
    assert row["handoffReason"] is None and row["externalJobId"] is None
    nxt = call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint})
    assert nxt.status == 204
    job = call(
        "handoff_job", method="GET", route_params={"endpointId": flow.endpoint, "externalJobId": "job-1"}
    )
    assert job.status == 404


def test_a_terminal_response_after_a_handoff_reports_wall_clock_processing_time(call, resolve, flow):
    start = datetime.now(UTC) - timedelta(hours=2)
    resolve(flow.request(enqueued=start))
    resolve(flow.park(ProcessingTimeMs=120))
    resolve(flow.control(MessageType.HandoffCompletedRequest, message_id="settle-1", parent="park-1"))
    resolve(flow.response(MessageType.ResolutionResponse, parent="settle-1", ProcessingTimeMs=250))
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Completed"
    assert row["processingTimeMs"] >= 2 * 3600 * 1000 - 5000
    assert [h["processingTimeMs"] for h in row["history"] if h["messageType"] == "ResolutionResponse"] == [
        250
    ]


def test_a_terminal_response_without_a_handoff_keeps_the_handler_processing_time(call, resolve, flow):
    resolve(flow.request(enqueued=datetime.now(UTC) - timedelta(hours=2)))
    resolve(flow.response(MessageType.ResolutionResponse, ProcessingTimeMs=75))
    assert event_of(call, flow)["processingTimeMs"] == 75


def test_a_failed_handoff_reports_wall_clock_time_on_the_error_response(call, resolve, flow):
    resolve(flow.request(enqueued=datetime.now(UTC) - timedelta(minutes=30)))
    resolve(flow.park())
    resolve(flow.response(MessageType.ErrorResponse, error_text="DMF failed", ProcessingTimeMs=10))
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Failed"
    assert row["processingTimeMs"] >= 30 * 60 * 1000 - 5000


# --- Spec 030: stale copies are refused; legitimate transitions apply ------------------------------


def _statuses(call, flow):
    row = event_of(call, flow)
    return row["resolutionStatus"], row["pendingSubStatus"], row["messageType"]


def test_the_incident_order_leaves_the_row_completed_with_a_comment_audit(call, resolve, flow):
    resolve(flow.response(MessageType.ResolutionResponse, message_id="rsp-1"))
    resolve(flow.request(ThrottleRetryCount=5))
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Completed"
    assert len(row["history"]) == 2  # the refused copy is still in the history
    [audit] = row["audits"]
    assert audit["auditorName"] == "Resolver" and audit["auditType"] == "Comment"
    assert "Ignored stale EventRequest req-1" in audit["data"]


def test_the_fan_out_lag_order_leaves_the_row_completed(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ResolutionResponse))
    resolve(flow.request(message_id="req-1"))  # same id: a duplicate, nothing changes
    resolve(flow.request(message_id="req-1-copy"))  # a fresh copy: refused by the guard
    assert _statuses(call, flow)[0] == "Completed"


def test_a_late_request_copy_keeps_a_parked_handoff(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.park())
    resolve(flow.request(message_id="req-1-late"))
    assert _statuses(call, flow) == ("Pending", "Handoff", "PendingHandoffResponse")


def test_a_late_request_copy_does_not_replace_a_settlement_projection(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.park())
    resolve(flow.control(MessageType.HandoffCompletedRequest, message_id="settle-1", parent="park-1"))
    resolve(flow.request(message_id="req-1-late"))
    assert _statuses(call, flow) == ("Pending", None, "HandoffCompletedRequest")


def test_a_resubmission_reopens_a_failed_row(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="boom"))
    resolve(flow.control(MessageType.ResubmissionRequest, message_id="rs-1", parent="err-1"))
    assert _statuses(call, flow) == ("Pending", None, "ResubmissionRequest")


def test_a_resubmission_reopens_a_completed_row(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ResolutionResponse))
    resolve(flow.control(MessageType.ResubmissionRequest, message_id="rs-1"))
    assert _statuses(call, flow)[0] == "Pending"


def test_a_skip_request_then_skip_response_settles_skipped(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="boom"))
    resolve(flow.control(MessageType.SkipRequest, message_id="sk-1", parent="err-1", event_json=None))
    assert _statuses(call, flow)[0] == "Pending"
    resolve(flow.response(MessageType.SkipResponse, parent="sk-1", event_json=None))
    assert _statuses(call, flow)[0] == "Skipped"


def test_a_late_deferral_after_the_response_does_not_strand_the_row(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ResolutionResponse))
    resolve(flow.response(MessageType.DeferralResponse, message_id="def-late"))
    assert _statuses(call, flow)[0] == "Completed"


def test_a_deferred_row_is_reopened_by_the_drain_and_redeferred(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.DeferralResponse, message_id="def-1"))
    assert _statuses(call, flow)[0] == "Deferred"
    resolve(flow.request(message_id="req-drain"))
    assert _statuses(call, flow)[0] == "Pending"
    resolve(flow.response(MessageType.DeferralResponse, message_id="def-2", parent="req-drain"))
    assert _statuses(call, flow)[0] == "Deferred"


def test_a_broker_redelivery_of_the_same_request_changes_nothing(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.request(delivery_count=2))
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Pending" and len(row["history"]) == 1 and row["audits"] == []


def test_a_late_handoff_park_after_the_response_does_not_reopen_the_row(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ResolutionResponse))
    resolve(flow.park(message_id="park-late"))
    assert _statuses(call, flow)[0] == "Completed"
    assert call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint}).status == 204


def test_a_park_after_a_failure_is_applied(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="boom"))
    resolve(flow.park(message_id="park-2"))
    assert _statuses(call, flow) == ("Pending", "Handoff", "PendingHandoffResponse")


def test_a_rescheduled_control_request_arriving_after_its_own_response_is_refused(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="boom"))
    resolve(flow.control(MessageType.ResubmissionRequest, message_id="rs-1", parent="err-1"))
    resolve(flow.response(MessageType.ResolutionResponse, parent="rs-1"))
    resolve(
        flow.control(MessageType.ResubmissionRequest, message_id="rs-1", parent="err-1", ThrottleRetryCount=1)
    )
    assert _statuses(call, flow)[0] == "Completed"


def test_terminal_over_terminal_stays_last_writer_wins(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ErrorResponse, error_text="boom"))
    resolve(flow.response(MessageType.ResolutionResponse))
    assert _statuses(call, flow)[0] == "Completed"


# --- duplicates, concurrency, heartbeat ------------------------------------------------------------


def test_a_duplicate_changes_nothing(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.park())
    before = event_of(call, flow)
    assert service.resolver_service().handle(flow.park()) is Outcome.DUPLICATE
    after = event_of(call, flow)
    assert after == before


def test_two_copies_projected_at_once_leave_the_same_row_as_one_copy(call, resolve, flow):
    resolve(flow.request())
    copies = [flow.park() for _ in range(8)]
    outcomes: list[Outcome] = []
    barrier = threading.Barrier(len(copies))

    def project(msg):
        barrier.wait()
        outcomes.append(service.resolver_service().handle(msg))

    threads = [threading.Thread(target=project, args=(m,)) for m in copies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.value for o in outcomes) == ["applied"] + ["duplicate"] * 7
    row = event_of(call, flow)
    assert row["pendingSubStatus"] == "Handoff" and len(row["history"]) == 2 and row["audits"] == []
    rows = list(service.store().event_rows(flow.endpoint, flow.event_id))
    assert len(rows) == 3  # event row + 2 history rows; the index rows are outside the event range
    queue = service.store().queued(flow.endpoint, claimed_before="9")
    assert [q.event_id for q in queue] == [flow.event_id]


def test_a_heartbeat_is_bypassed_without_touching_storage(resolve, flow):
    msg = flow.request(event_type="NimBus.Platform.Heartbeat")
    with ROUND_TRIPS.measure() as tally:
        assert service.resolver_service().handle(msg) is Outcome.HEARTBEAT
    assert tally.requests == 0
    assert service.store().get_event(flow.endpoint, flow.event_id) is None


# --- round trips ------------------------------------------------------------------------------------


def test_a_projection_reads_once_and_writes_once(resolve, flow):
    resolve(flow.request())  # warm: table clients and the endpoint registry exist
    resolve(flow.park(message_id="park-0"))
    counts = {}
    for name, msg in [
        ("EventRequest (existing row)", flow.request(message_id="req-2")),
        ("PendingHandoffResponse", flow.park(message_id="park-2", parent="req-2")),
        ("HandoffCompletedRequest", flow.control(MessageType.HandoffCompletedRequest, parent="park-2")),
        ("ResolutionResponse", flow.response(MessageType.ResolutionResponse)),
        ("stale EventRequest (refused)", flow.request(message_id="req-3")),
        ("duplicate", flow.request(message_id="req-3")),
    ]:
        with ROUND_TRIPS.measure() as tally:
            resolve(msg)
        counts[name] = (tally.requests, tally.methods)
    for name, (requests, methods) in counts.items():
        # read, then one $batch; beside the read, the insert of the message id into the lookup index (hoids:
        # the event's other ids are written already, and a duplicate's message id too)
        index_inserts = 0 if name == "duplicate" else 1
        assert requests == 2 + index_inserts, (name, methods)
        assert methods.count("GET") == 1 and methods[-1] == "POST", (name, methods)


def test_a_first_request_creates_the_row_in_one_read_and_one_write(resolve, flow):
    resolve(nimbus(MessageType.EventRequest, endpoint=flow.endpoint, event_id="warm", to=flow.endpoint))
    with ROUND_TRIPS.measure() as tally:
        resolve(flow.request())
    # + the lookup index inserts of its message id, event id and session id, sent beside the read
    assert tally.requests == 2 + 3


def test_event_ids_with_key_forbidden_characters_round_trip(call, resolve):
    flow = Flow(endpoint="Billing/EU#1", event_id="inv?42\\a|b~%")
    resolve(flow.request())
    assert event_of(call, flow)["eventId"] == "inv?42\\a|b~%"
    assert keys.partition("Billing/EU#1") == "Billing%2FEU%231"


def test_a_retry_request_is_audited_once_by_manager(call, resolve, flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="boom"))
    retry = flow.control(MessageType.RetryRequest, message_id="retry-1", parent="err-1")
    resolve(retry)
    resolve(retry)  # a redelivered copy adds nothing
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Pending"
    assert [(a["auditorName"], a["auditType"]) for a in row["audits"]] == [("Manager", "Retry")]


def test_a_large_body_is_split_across_properties_and_read_back_whole(call, resolve, flow):
    payload = '{"lines": "' + "x" * 200_000 + '"}'
    resolve(flow.request(event_json=payload))
    assert event_of(call, flow)["messageContent"]["EventContent"]["EventJson"] == payload


def test_a_handoff_lasting_a_month_reports_its_processing_time(call, resolve, flow):
    resolve(flow.request(enqueued=datetime.now(UTC) - timedelta(days=30)))
    resolve(flow.park())
    resolve(flow.response(MessageType.ResolutionResponse, QueueTimeMs=2**40))
    row = event_of(call, flow)
    assert row["processingTimeMs"] >= 30 * 86_400_000 - 5000  # beyond 32 bits
    assert row["queueTimeMs"] == 2**40
