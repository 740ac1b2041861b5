"""The opt-in timeout sweeper fails parked events past ExpectedBy, once, through the settlement path."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from azure.functions.timer import TimerRequest

from handoff import service

from .conftest import Flow, event_of


def iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")


def test_an_overdue_handoff_is_failed_once_with_timeout_expired(
    call, resolve, flow: Flow, transport, monkeypatch
):
    # Given one overdue and one not-yet-due hand-off
    resolve(flow.request())
    resolve(flow.park(expected_by=iso(datetime.now(UTC) - timedelta(minutes=1))))
    due_later = Flow(endpoint=flow.endpoint, event_id=flow.event_id + "-later")
    resolve(due_later.request())
    resolve(due_later.park(expected_by=iso(datetime.now(UTC) + timedelta(hours=1))))
    monkeypatch.setenv("HANDOFF_SWEEPER_ENABLED", "true")
    sweeper = call.functions["handoff_sweeper"].get_user_function()
    # When the timer fires twice
    sweeper(TimerRequest(past_due=False))
    sweeper(TimerRequest(past_due=False))
    # Then exactly one HandoffFailedRequest was sent, for the overdue event, with errorType TimeoutExpired
    sent = [
        m for topic, m in transport.sent if topic == flow.endpoint
    ]  # other tests' endpoints share the tables
    assert [str(m.application_properties["EventId"]) for m in sent] == [flow.event_id]
    error = json.loads(b"".join(sent[0].body))["ErrorContent"]
    assert error["ErrorType"] == "TimeoutExpired" and "ExpectedBy" in error["ErrorText"]
    [audit] = event_of(call, flow)["audits"]
    assert (audit["auditType"], audit["auditorName"]) == ("FailHandoff", "Sweeper")


def test_the_sweeper_does_nothing_unless_enabled(call, resolve, flow: Flow, transport, monkeypatch):
    resolve(flow.request())
    resolve(flow.park(expected_by=iso(datetime.now(UTC) - timedelta(minutes=1))))
    monkeypatch.delenv("HANDOFF_SWEEPER_ENABLED", raising=False)
    call.functions["handoff_sweeper"].get_user_function()(TimerRequest(past_due=False))
    assert [t for t, _ in transport.sent if t == flow.endpoint] == []


def test_the_sweeper_never_takes_over_an_expired_claim(resolve, flow: Flow, transport):
    resolve(flow.request())
    resolve(flow.park(expected_by=iso(datetime.now(UTC) - timedelta(minutes=1))))
    sweeper = service.sweeper()
    assert flow.event_id in sweeper.sweep().failed
    sweeper.clock = lambda: datetime.now(UTC) + timedelta(minutes=10)
    service.settlement_service().clock = sweeper.clock
    assert flow.event_id in sweeper.sweep().skipped
    assert len([t for t, _ in transport.sent if t == flow.endpoint]) == 1
