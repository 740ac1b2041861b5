"""Transport choice from the settings, and Service Bus failures mapped to 503 (no network needed)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from common.errors import Unavailable
from handoff.contract import Coordinates, MessageType, build_control_message, settlement_content
from handoff.transport import (
    LoopbackTransport,
    ServiceBusTransport,
    UnconfiguredTransport,
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


class BrokenSender:
    closed = False

    def send_messages(self, message, timeout=None):
        raise ConnectionError("link detached")

    def close(self):
        self.closed = True


def test_a_service_bus_failure_is_503_and_the_sender_is_rebuilt_next_time():
    transport = ServiceBusTransport(connection_string=FAKE)
    broken = BrokenSender()
    transport._senders["Billing"] = broken  # type: ignore[assignment]
    with pytest.raises(Unavailable) as err:
        transport.send("Billing", control_message())
    assert "Billing" in err.value.detail
    assert broken.closed and "Billing" not in transport._senders


def test_the_loopback_copy_is_what_the_fan_out_rule_forwards():
    message = control_message()
    copy = to_trigger_message(message, enqueued=datetime(2026, 11, 30, tzinfo=UTC))
    assert copy.message_id == message.message_id
    assert copy.session_id == "s-1" and copy.correlation_id == "c-1"
    assert copy.application_properties["To"] == "Billing"
    assert copy.application_properties["From"] == "Manager"
    assert copy.get_body() == b"".join(message.body)


def test_a_loopback_projection_failure_is_503():
    def down(_msg):
        raise ConnectionError("storage down")

    with pytest.raises(Unavailable):
        LoopbackTransport(down).send("Billing", control_message())
