"""Transport choice from the settings, and Service Bus failures mapped to 503 (no network needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from common.errors import Unavailable
from handoff.messages.contract import (
    Coordinates,
    MessageType,
    build_control_message,
    settlement_content,
)
from handoff.messages.contract import control_message as outbox_message
from handoff.messages.transport import (
    LoopbackTransport,
    SendRefused,
    SendUnconfirmed,
    ServiceBusTransport,
    UnconfiguredTransport,
    duplicate_window_from_env,
    encoded_size,
    to_trigger_message,
    transport_from_env,
)

FAKE = "Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=x;SharedAccessKey=eA=="


def control_message():
    coords = Coordinates(event_id="e-1", session_id="s-1", message_id="park-1", correlation_id="c-1")
    content = settlement_content(MessageType.HandoffFailedRequest, coords, error_text="no", error_type="T")
    return build_control_message(MessageType.HandoffFailedRequest, "Billing", coords, content)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"ServiceBusConnection": FAKE}, ServiceBusTransport),
        ({"ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net"}, ServiceBusTransport),
        ({"ServiceBusConnection": FAKE, "SETTLE_LOOPBACK": "true"}, ServiceBusTransport),
        ({"SETTLE_LOOPBACK": "true"}, LoopbackTransport),
        ({}, UnconfiguredTransport),
    ],
)
def test_the_transport_follows_the_settings(monkeypatch, settings, expected):
    for name in ("ServiceBusConnection", "ServiceBusConnection__fullyQualifiedNamespace", "SETTLE_LOOPBACK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    assert isinstance(transport_from_env(lambda msg: None), expected)


class FakeSender:
    """A sender whose link opens (or not) and whose send raises what it is told to."""

    def __init__(self, *, open_error: Exception | None = None, send_error: Exception | None = None) -> None:
        self.open_error = open_error
        self.send_error = send_error
        self.closed = False
        self.sent: list[object] = []

    def __enter__(self):
        if self.open_error:
            raise self.open_error
        return self

    def send_messages(self, message, timeout=None):
        if self.send_error:
            raise self.send_error
        self.sent.append(message)

    def close(self):
        self.closed = True


def _transport_with(sender: FakeSender) -> ServiceBusTransport:
    transport = ServiceBusTransport(connection_string=FAKE)
    transport._sender = lambda topic: sender  # type: ignore[method-assign,assignment,return-value]
    return transport


def test_a_link_that_cannot_be_opened_is_a_refusal_nothing_was_sent(monkeypatch):
    monkeypatch.setattr("handoff.messages.transport.time.sleep", lambda _s: None)
    sender = FakeSender(open_error=ConnectionError("connection refused"))
    with pytest.raises(SendRefused) as err:
        _transport_with(sender).send("Billing", control_message())
    assert "Billing" in err.value.detail and isinstance(err.value, Unavailable)


def _servicebus_errors():
    from azure.servicebus.exceptions import (
        MessageSizeExceededError,
        OperationTimeoutError,
        ServiceBusAuthorizationError,
        ServiceBusConnectionError,
        ServiceBusServerBusyError,
    )

    return [
        ("size", MessageSizeExceededError(message="too large"), SendRefused),
        ("unauthorized", ServiceBusAuthorizationError(message="no Send right"), SendRefused),
        ("server-busy", ServiceBusServerBusyError(message="busy"), SendRefused),
        ("timeout", OperationTimeoutError(message="Send operation timed out"), SendUnconfirmed),
        ("link-lost", ServiceBusConnectionError(message="link detached"), SendUnconfirmed),
        ("other", ConnectionError("reset by peer"), SendUnconfirmed),
    ]


@pytest.mark.parametrize(
    ("name", "error", "kind"), _servicebus_errors(), ids=[n for n, _, _ in _servicebus_errors()]
)
def test_send_failures_are_refusals_only_when_the_broker_said_no(name, error, kind):
    sender = FakeSender(send_error=error)
    transport = _transport_with(sender)
    with pytest.raises(kind):
        transport.send("Billing", control_message())


def test_a_successful_send_opens_the_link_first():
    sender = FakeSender()
    _transport_with(sender).send("Billing", control_message())
    assert len(sender.sent) == 1


@pytest.mark.parametrize(
    ("value", "window"),
    [
        (None, timedelta(minutes=10)),
        ("true", timedelta(minutes=10)),
        ("false", None),
        ("PT5M", timedelta(minutes=5)),
        ("PT1H30M", timedelta(minutes=90)),
    ],
)
def test_the_duplicate_detection_window_follows_the_setting(monkeypatch, value, window):
    if value is None:
        monkeypatch.delenv("HANDOFF_DUPLICATE_DETECTION", raising=False)
    else:
        monkeypatch.setenv("HANDOFF_DUPLICATE_DETECTION", value)
    assert duplicate_window_from_env() == window
    monkeypatch.setenv("ServiceBusConnection", FAKE)
    assert transport_from_env(lambda msg: None).duplicate_window == window


def test_a_malformed_duplicate_detection_setting_is_refused(monkeypatch):
    monkeypatch.setenv("HANDOFF_DUPLICATE_DETECTION", "sometimes")
    with pytest.raises(ValueError, match="HANDOFF_DUPLICATE_DETECTION"):
        duplicate_window_from_env()


def test_the_loopback_copy_is_what_the_fan_out_rule_forwards():
    message = control_message()
    copy = to_trigger_message(message, enqueued=datetime(2026, 11, 30, tzinfo=UTC))
    assert copy.message_id == message.message_id
    assert copy.session_id == "s-1" and copy.correlation_id == "c-1"
    assert copy.application_properties["To"] == "Billing"
    assert copy.application_properties["From"] == "Manager"
    assert copy.get_body() == b"".join(message.body)


def test_a_loopback_projection_failure_does_not_prove_nothing_was_projected():
    def down(_msg):
        raise ConnectionError("storage down")

    with pytest.raises(SendUnconfirmed):
        LoopbackTransport(down).send("Billing", control_message())


def test_the_size_of_a_message_is_measured_as_sent():
    coords = Coordinates(event_id="e-1", session_id="s-1", message_id="park-1")
    content = settlement_content(MessageType.HandoffCompletedRequest, coords, result_json='"' * 1000)
    message = outbox_message(MessageType.HandoffCompletedRequest, "Billing", coords, content)
    size = encoded_size(message)
    assert size > len(message.body.encode()) > 2000  # every quote escaped: twice the characters


@pytest.mark.parametrize("where", ["open", "send"])
def test_a_topic_settle_may_not_send_to_names_the_endpoints_parameter(monkeypatch, where):
    # Settle's identity is granted Data Sender per listed endpoint topic (infra `endpoints`); a
    # settlement to any other endpoint gets 401/403, and the error says why and what to change.
    from azure.servicebus.exceptions import ServiceBusAuthorizationError

    monkeypatch.setattr("handoff.messages.transport.time.sleep", lambda _s: None)
    error = ServiceBusAuthorizationError(message="Unauthorized access. 'Send' claim(s) are required")
    sender = FakeSender(**{f"{where}_error": error})
    with pytest.raises(SendRefused) as refused:
        _transport_with(sender).send("Shipping", control_message())
    text = str(refused.value)
    assert "'Shipping'" in text and "`endpoints`" in text and "Data Sender" in text
    assert sender.sent == []


def test_a_settlement_to_an_endpoint_settle_may_not_send_to_is_a_503_naming_the_parameter(
    call, resolve, flow, monkeypatch
):
    # End to end: the settle request's problem detail carries the transport's explanation.
    from azure.servicebus.exceptions import ServiceBusAuthorizationError

    from handoff import service
    from tests.support.handoff_flows import complete, parked

    monkeypatch.setattr("handoff.messages.transport.time.sleep", lambda _s: None)
    refusal = ServiceBusAuthorizationError(message="Unauthorized access. 'Send' claim(s) are required")
    service.use_transport(_transport_with(FakeSender(open_error=refusal)))
    try:
        parked(resolve, flow)
        refused = complete(call, flow)
    finally:
        service.reset()
    assert refused.status == 503 and refused.content_type.startswith("application/problem+json")
    assert "`endpoints` parameter" in refused.json["detail"] and repr(flow.endpoint) in refused.json["detail"]
