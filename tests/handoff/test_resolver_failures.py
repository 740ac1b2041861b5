"""Poison input ends in the poison table (completed, with the reason); transient storage failures retry."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.policies import SansIOHTTPPolicy

from common import runtime
from handoff import service
from handoff.contract import MessageType
from handoff.resolver import RETRY_BUDGET, Outcome, TransientProjectionError, retry_delay

from .conftest import Flow, event_of, nimbus


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


class RecordingRedelivery:
    def __init__(self, *, fail: bool = False) -> None:
        self.scheduled: list[tuple[str, float, int]] = []
        self.fail = fail

    def schedule_copy(self, msg, *, delay_s: float, throttle_retry_count: int) -> None:
        if self.fail:
            raise ConnectionError("Service Bus down too")
        self.scheduled.append((msg.message_id, delay_s, throttle_retry_count))


def test_a_storage_outage_reschedules_a_copy_with_backoff_and_loses_nothing(call, flow, outage):
    resolver = service.resolver_service()
    resolver.redelivery = redelivery = RecordingRedelivery()
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
    resolver.redelivery = None
    with pytest.raises(TransientProjectionError):
        resolver.handle(flow.request(delivery_count=3))
    assert no_sleep == [20.0]


def test_when_scheduling_fails_too_the_message_is_abandoned_not_lost(flow, outage, no_sleep):
    resolver = service.resolver_service()
    resolver.redelivery = RecordingRedelivery(fail=True)
    with pytest.raises(TransientProjectionError):
        resolver.handle(flow.request())
    assert no_sleep == [5.0]


def test_after_the_retry_budget_the_broker_takes_over(flow, outage, no_sleep):
    resolver = service.resolver_service()
    resolver.redelivery = redelivery = RecordingRedelivery()
    with pytest.raises(TransientProjectionError):
        resolver.handle(flow.request(ThrottleRetryCount=RETRY_BUDGET - 1))
    assert redelivery.scheduled == []


def test_a_poison_message_during_an_outage_is_retried_not_dropped(flow, outage, no_sleep):
    resolver = service.resolver_service()
    resolver.redelivery = None
    with pytest.raises(TransientProjectionError):
        resolver.handle(nimbus("Bogus", endpoint=flow.endpoint, event_id=flow.event_id))


def test_an_unexpected_storage_rejection_is_stored_as_poison_not_retried(flow, monkeypatch):
    from azure.core.exceptions import HttpResponseError

    resolver = service.resolver_service()

    def reject(*_args, **_kwargs):
        raise HttpResponseError(message="EntityTooLarge (test)")

    monkeypatch.setattr(resolver.store, "submit", reject)
    msg = flow.request(message_id=f"req-{flow.event_id}")
    assert resolver.handle(msg) is Outcome.POISONED
    [reason] = _poison_reasons(msg)
    assert reason.startswith("Failed to handle message: HttpResponseError")
