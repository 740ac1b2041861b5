"""Poison input ends in the poison table (completed, with the reason); transient storage failures retry."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.policies import SansIOHTTPPolicy

from common import runtime
from handoff import service
from handoff.messages.contract import MessageType
from handoff.projection.resolver import RETRY_BUDGET, Outcome, TransientProjectionError, retry_delay
from handoff.storage import keys as handoff_keys
from tests.support.handoff_flows import Flow, RecordingRedelivery, _status_error, event_of, nimbus

pytestmark = pytest.mark.usefixtures("settle_tables")


@pytest.fixture(autouse=True)
def fresh_services():
    """Tests here rewire the process-wide resolver; the next test gets new services."""
    yield
    service.reset()


def _poison_reasons(msg) -> list[str]:
    day = (msg.enqueued_time_utc or datetime.now(UTC)).strftime("%Y%m%d")
    return [p.reason for p in service.store().poison_rows(day) if p.message_id == msg.message_id]


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (
            lambda f: nimbus("Bogus", endpoint=f.endpoint, event_id=f.event_id, to=f.endpoint),
            "Unknown MessageType 'Bogus'",
        ),
        (lambda f: nimbus("eventrequest", endpoint=f.endpoint, event_id=f.event_id), "Unknown MessageType"),
        (
            lambda f: nimbus(MessageType.ProcessDeferredRequest, endpoint=f.endpoint, event_id=f.event_id),
            "no projection",
        ),
        (lambda f: nimbus(MessageType.Unknown, endpoint=f.endpoint, event_id=f.event_id), "no projection"),
        (lambda f: f.response(MessageType.ResolutionResponse, from_=None), "without From"),
        (lambda f: f.request(body=b"{not json"), "Unreadable body"),
        (lambda f: f.request(body=b"[1, 2]"), "Unreadable body"),
        (lambda f: f.request(body=b"{" * 1_000_000), "Unreadable body"),
        (lambda f: f.request(body=b"[" * 100_000 + b"]" * 100_000), "Unreadable body"),
        (lambda f: f.request(body=b"\xff\xfe\x00"), "Unreadable body"),
        (
            lambda f: nimbus(
                MessageType.EventRequest, endpoint=f.endpoint, event_id=f.event_id, drop=("EventId",)
            ),
            "no EventId",
        ),
        (lambda f: f.request(message_id="m" * 600), "too long"),
    ],
    ids=[
        "unknown-type",
        "wrong-case",
        "process-deferred",
        "unknown",
        "response-without-from",
        "bad-json",
        "not-an-object",
        "huge-bad-json",
        "too-deep",
        "not-utf8",
        "no-event-id",
        "key-too-long",
    ],
)
def test_poison_is_stored_with_its_reason_and_completed_without_retries(resolve, flow: Flow, build, reason):
    flow.request_id = f"req-{flow.event_id}"
    msg = build(flow)
    # When the resolver function runs, it returns normally (the host completes the message: no retries)
    resolve(msg)
    assert service.resolver_service().handle(msg) is Outcome.POISONED
    # Then the reason is where operators look, once, and nothing was projected
    reasons = _poison_reasons(msg)
    assert len(reasons) == 1 and reason in reasons[0]
    assert service.store().get_event(flow.endpoint, flow.event_id) is None


class StorageDown(SansIOHTTPPolicy[Any, Any]):
    """Every Table request fails as if storage were unreachable."""

    def __init__(self) -> None:
        self.down = True

    def on_request(self, request: Any) -> None:
        if self.down:
            raise ServiceRequestError("storage unreachable (test)")


@pytest.fixture
def outage():
    policy = StorageDown()
    runtime.reset(policies=[policy])
    yield policy
    runtime.reset()


def test_a_storage_outage_reschedules_a_copy_with_backoff_and_loses_nothing(call, flow, outage):
    resolver = service.resolver_service()
    redelivery = RecordingRedelivery()
    resolver.redelivery = lambda: redelivery
    # Given storage is down: each attempt schedules a later copy (no broker delivery is used up)
    msg = flow.request()
    assert resolver.handle(msg) is Outcome.RESCHEDULED
    assert redelivery.scheduled == [("req-1", 5.0, 1)]
    copy = flow.request(ThrottleRetryCount=4, delivery_count=1)
    assert resolver.handle(copy) is Outcome.RESCHEDULED
    assert redelivery.scheduled[-1] == ("req-1", retry_delay(5), 5)
    # When storage is back, the rescheduled copy is projected
    outage.down = False
    assert resolver.handle(flow.request(ThrottleRetryCount=5)) is Outcome.APPLIED
    assert event_of(call, flow)["resolutionStatus"] == "Pending"


def test_the_backoff_spans_more_than_a_multi_minute_outage():
    assert [retry_delay(n) for n in range(1, 5)] == [5.0, 10.0, 20.0, 40.0]
    assert sum(retry_delay(n) for n in range(1, RETRY_BUDGET)) > 15 * 60


def test_without_a_scheduler_the_host_retries_after_an_in_process_backoff(flow, outage, no_sleep):
    resolver = service.resolver_service()
    resolver.redelivery = lambda: None
    with pytest.raises(TransientProjectionError):
        resolver.handle(flow.request(delivery_count=3))
    assert no_sleep == [20.0]


def test_when_scheduling_fails_too_the_message_is_abandoned_not_lost(flow, outage, no_sleep):
    resolver = service.resolver_service()
    resolver.redelivery = lambda: RecordingRedelivery(fail=True)
    with pytest.raises(TransientProjectionError):
        resolver.handle(flow.request())
    assert no_sleep == [5.0]


def test_after_the_retry_budget_the_broker_takes_over(flow, outage, no_sleep):
    resolver = service.resolver_service()
    redelivery = RecordingRedelivery()
    resolver.redelivery = lambda: redelivery
    with pytest.raises(TransientProjectionError):
        resolver.handle(flow.request(ThrottleRetryCount=RETRY_BUDGET - 1))
    assert redelivery.scheduled == []


def test_a_poison_message_during_an_outage_is_retried_not_dropped(flow, outage, no_sleep):
    resolver = service.resolver_service()
    resolver.redelivery = lambda: None
    with pytest.raises(TransientProjectionError):
        resolver.handle(nimbus("Bogus", endpoint=flow.endpoint, event_id=flow.event_id))


def test_an_unexpected_storage_rejection_is_stored_as_poison_not_retried(flow, monkeypatch):
    from azure.core.exceptions import HttpResponseError

    resolver = service.resolver_service()

    def reject(*_args, **_kwargs):
        error = HttpResponseError(message="EntityTooLarge (test)")
        error.status_code = 400  # a deterministic rejection, with its status: retrying cannot help
        raise error

    monkeypatch.setattr(resolver.store, "submit", reject)
    msg = flow.request(message_id=f"req-{flow.event_id}")
    assert resolver.handle(msg) is Outcome.POISONED
    [reason] = _poison_reasons(msg)
    assert reason.startswith("Failed to handle message: HttpResponseError")


# --- transient faults are retried, never poison --------------------------------


def _with_status(error: Any, status: int) -> Any:
    error.status_code = status
    return error


def _wrapped(cause: Exception, status: int) -> Exception:
    error = _status_error(status)
    error.__cause__ = cause
    return error


def _transient_faults() -> list[tuple[str, Any]]:
    from azure.core.exceptions import (
        ClientAuthenticationError,
        DecodeError,
        IncompleteReadError,
        ServiceResponseError,
    )

    return [
        ("incomplete-read", lambda: IncompleteReadError("the answer stopped half way (test)")),
        ("decode", lambda: DecodeError("the answer could not be decoded (test)")),
        # The same faults carrying the status of the answer they came with: a 200 whose body was cut,
        # a managed-identity endpoint answering 400 while the identity is being assigned
        ("incomplete-read-of-a-200", lambda: _with_status(IncompleteReadError("cut (test)"), 200)),
        ("decode-of-a-200", lambda: _with_status(DecodeError("JSON is invalid (test)"), 200)),
        ("token-endpoint-400", lambda: _with_status(ClientAuthenticationError("IMDS (test)"), 400)),
        # What the Tables SDK raises for an undecodable 200: a plain HttpResponseError caused by it
        ("wrapped-decode-of-a-200", lambda: _wrapped(DecodeError("JSON is invalid (test)"), 200)),
        ("http-without-status", lambda: _status_error(None)),
        ("token-endpoint", lambda: ClientAuthenticationError("token endpoint hiccup (test)")),
        ("throttled-429", lambda: _status_error(429)),
        ("server-503", lambda: _status_error(503)),
        ("server-500", lambda: _status_error(500)),
        # Storage refusing Settle's identity (a role assignment not yet propagated after a deployment)
        ("identity-refused-403", lambda: _status_error(403)),
        ("response-lost", lambda: ServiceResponseError("connection reset (test)")),
        ("connection", lambda: ConnectionError("connection refused (test)")),
        ("timeout", lambda: TimeoutError("read timed out (test)")),
    ]


@pytest.mark.parametrize(("name", "fault"), _transient_faults(), ids=[n for n, _ in _transient_faults()])
def test_a_transient_storage_fault_is_rescheduled_not_poisoned(flow, monkeypatch, name, fault):
    resolver = service.resolver_service()
    resolver.redelivery = lambda: redelivery
    redelivery = RecordingRedelivery()
    failures = {"left": 1}
    original = resolver.store.submit

    def flaky(operations):
        if failures["left"]:
            failures["left"] -= 1
            raise fault()
        return original(operations)

    monkeypatch.setattr(resolver.store, "submit", flaky)
    msg = flow.request(message_id=f"req-{flow.event_id}")
    assert resolver.handle(msg) is Outcome.RESCHEDULED
    assert _poison_reasons(msg) == []
    # The rescheduled copy is projected once storage answers
    assert resolver.handle(flow.request(message_id=msg.message_id, ThrottleRetryCount=1)) is Outcome.APPLIED


def test_at_the_retry_budget_the_message_is_stored_as_poison_with_the_reason_and_completed(
    flow, monkeypatch, no_sleep
):
    resolver = service.resolver_service()
    resolver.redelivery = lambda: RecordingRedelivery()

    def throttled(_operations):
        raise _status_error(503)

    monkeypatch.setattr(resolver.store, "submit", throttled)
    msg = flow.request(message_id=f"req-{flow.event_id}", ThrottleRetryCount=RETRY_BUDGET - 1)
    assert resolver.handle(msg) is Outcome.POISONED
    [reason] = _poison_reasons(msg)
    assert reason.startswith("retry budget exhausted") and "503" in reason


def test_a_storage_answer_that_cannot_be_decoded_is_rescheduled_not_poisoned(flow):
    from tests.support.handoff_flows import Undecodable

    undecodable = Undecodable("GET")
    runtime.reset(policies=[undecodable], client_options={"retry_total": 0})
    try:
        resolver = service.resolver_service()
        redelivery = RecordingRedelivery()
        resolver.redelivery = lambda: redelivery
        msg = flow.request(message_id=f"req-{flow.event_id}")
        runtime.tables().table(handoff_keys.EVENTS_TABLE)  # this instance's first GET: its tables listed
        undecodable.armed = 1  # the event row read: its answer is cut short
        assert resolver.handle(msg) is Outcome.RESCHEDULED
        assert undecodable.armed == 0 and _poison_reasons(msg) == []
        assert [m for m, _, _ in redelivery.scheduled] == [msg.message_id]
        copy = flow.request(message_id=msg.message_id, ThrottleRetryCount=1)
        assert resolver.handle(copy) is Outcome.APPLIED
    finally:
        runtime.reset()


# --- a malformed ThrottleRetryCount counts as 0 ------------------------------------------


def test_a_non_numeric_throttle_retry_count_is_zero(flow, outage):
    resolver = service.resolver_service()
    redelivery = RecordingRedelivery()
    resolver.redelivery = lambda: redelivery
    assert resolver.handle(flow.request(ThrottleRetryCount="abc")) is Outcome.RESCHEDULED
    assert redelivery.scheduled == [("req-1", 5.0, 1)]


# --- heartbeats match NimBus's OrdinalIgnoreCase ----------------------------------------


@pytest.mark.parametrize("event_type", ["nimbus.platform.heartbeat", "NIMBUS.PLATFORM.HEARTBEAT"])
def test_a_heartbeat_is_recognised_whatever_its_case(flow, event_type):
    assert service.resolver_service().handle(flow.request(event_type=event_type)) is Outcome.HEARTBEAT
    assert service.store().get_event(flow.endpoint, flow.event_id) is None


def test_a_look_alike_of_the_heartbeat_is_projected(flow):
    msg = flow.request(event_type="NimBus.Platform.Heartbeat2")
    assert service.resolver_service().handle(msg) is Outcome.APPLIED


# --- one transport, used by settlement and by the resolver's redelivery -----------------


def test_a_transport_change_reaches_the_resolver_s_redelivery_too(flow, outage):
    class Scheduling:
        name = "scheduling"
        duplicate_window = None

        def __init__(self) -> None:
            self.scheduled: list[str] = []

        def send(self, topic, message) -> None:
            raise AssertionError("not used here")

        def schedule_copy(self, msg, *, delay_s: float, throttle_retry_count: int) -> None:
            self.scheduled.append(msg.message_id)

    service.resolver_service()  # built before the transport changes
    transport = Scheduling()
    service.use_transport(transport)
    try:
        assert service.resolver_service().handle(flow.request()) is Outcome.RESCHEDULED
        assert transport.scheduled == ["req-1"]
        assert service.settlement_service().transport() is transport
    finally:
        service.reset()


# --- a large body is projected, truncated where it must be; poison keeps the whole body ----


def test_a_terminal_response_too_large_for_a_row_still_settles_the_handoff(call, flow):
    from datetime import timedelta

    resolver = service.resolver_service()
    resolver.handle(flow.request())
    expected_by = (datetime.now(UTC) - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    resolver.handle(flow.park(expected_by=expected_by))
    big = "z" * 600_000
    outcome = resolver.handle(
        flow.response(MessageType.ResolutionResponse, message_id="done-1", event_json=big)
    )
    assert outcome is Outcome.APPLIED
    row = event_of(call, flow)
    assert (row["resolutionStatus"], row["pendingSubStatus"]) == ("Completed", None)
    assert row["contentTruncated"] is True
    [done] = [h for h in row["history"] if h["messageId"] == "done-1"]
    assert done["contentTruncated"] is True
    # No longer offered to agents, and no longer overdue for the sweeper
    assert call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint}).status == 204
    report = service.sweeper().sweep()
    assert flow.event_id not in report.failed + report.skipped


def test_a_body_with_many_escapes_stays_within_a_transaction(call, flow):
    # 400,000 control characters: small as UTF-16, six times larger once JSON-escaped on the wire
    resolver = service.resolver_service()
    body = "\u0001" * 400_000
    msg = flow.request(message_id=f"esc-{flow.event_id}", event_json=body)
    assert resolver.handle(msg) is Outcome.APPLIED
    assert event_of(call, flow)["resolutionStatus"] == "Pending"


@pytest.mark.parametrize(
    ("body", "readable"),
    [(b"{" * 300_000, True), (b"\xff\xfe" + bytes(range(256)) * 1_000, False)],
    ids=["unreadable-json", "not-utf8"],
)
def test_poison_keeps_the_whole_body_for_a_replay(flow, body, readable):
    import base64

    msg = flow.request(message_id=f"poison-{flow.event_id}", body=body)
    assert service.resolver_service().handle(msg) is Outcome.POISONED
    day = (msg.enqueued_time_utc or datetime.now(UTC)).strftime("%Y%m%d")
    [row] = [p for p in service.store().poison_rows(day) if p.message_id == msg.message_id]
    assert row.body_bytes() == body
    assert not row.content_truncated
    if readable:
        assert row.message_content is not None and len(row.message_content) == len(body)
    else:
        assert row.message_content_base64 is not None
        assert base64.b64decode(row.message_content_base64) == body
    props = json.loads(row.application_properties)
    assert props["MessageType"] == "EventRequest"
