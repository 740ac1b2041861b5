"""Feeding a Service Bus trigger from a real namespace or the emulator (no bus here: fakes of the SDK).

The receive loop itself needs a namespace; what can go wrong without one is tested here: when it runs
at all, what it reads from the binding and settings, how an SDK message becomes the function's
``ServiceBusMessage``, and complete-on-success / abandon-on-exception.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from devtools.host import (
    BusReceiver,
    BusSource,
    ServiceBusFunction,
    admin_message_from_received,
    build_service_bus_message,
)

BINDING = {
    "connection": "ServiceBusConnection",
    "topicName": "%RESOLVER_TOPIC%",
    "subscriptionName": "%RESOLVER_SUBSCRIPTION%",
    "isSessionsEnabled": True,
}
SETTINGS = {"RESOLVER_TOPIC": "Resolver", "RESOLVER_SUBSCRIPTION": "Resolver"}


@dataclass
class FakeReceived:
    """The public attributes of ``azure.servicebus.ServiceBusReceivedMessage`` the host reads."""

    body: Any = field(default_factory=lambda: iter([b'{"Event', b'Content":null}']))
    message_id: str = "m-1"
    session_id: str | None = "INV-1"
    correlation_id: str | None = "c-1"
    content_type: str | None = "application/json"
    subject: str | None = None
    to: str | None = None
    reply_to: str | None = None
    application_properties: dict[Any, Any] = field(
        default_factory=lambda: {b"MessageType": b"EventRequest", b"RetryCount": 0}
    )
    enqueued_time_utc: datetime | None = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    delivery_count: int | None = 0
    sequence_number: int | None = 42


def test_no_connection_means_no_receiver() -> None:
    assert BusSource.resolve(BINDING, SETTINGS) is None


def test_a_connection_string_resolves_the_entity_from_settings() -> None:
    source = BusSource.resolve(BINDING, {**SETTINGS, "ServiceBusConnection": "Endpoint=sb://x/;..."})
    assert source is not None
    assert (source.topic, source.subscription, source.sessions) == ("Resolver", "Resolver", True)
    assert source.connection_string == "Endpoint=sb://x/;..."


def test_an_identity_connection_uses_the_namespace_and_client_id() -> None:
    settings = {
        **SETTINGS,
        "ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net",
        "ServiceBusConnection__clientId": "client-1",
    }
    source = BusSource.resolve(BINDING, settings)
    assert source is not None
    assert (source.connection_string, source.namespace, source.client_id) == (
        None,
        "ns.servicebus.windows.net",
        "client-1",
    )


def test_an_sdk_message_becomes_the_functions_message() -> None:
    message = build_service_bus_message(admin_message_from_received(FakeReceived()))
    assert message.get_body() == b'{"EventContent":null}'
    assert message.message_id == "m-1"
    assert message.session_id == "INV-1"
    assert message.correlation_id == "c-1"
    assert message.application_properties == {"MessageType": "EventRequest", "RetryCount": 0}
    assert message.delivery_count == 1  # the first delivery, counted as the Functions host counts it
    assert message.sequence_number == 42
    assert message.enqueued_time_utc == datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class FakeReceiver:
    def __init__(self, batches: list[list[FakeReceived]]) -> None:
        self.batches = batches
        self.completed: list[str] = []
        self.abandoned: list[str] = []

    def receive_messages(self, max_message_count: int, max_wait_time: float) -> list[FakeReceived]:
        return self.batches.pop(0) if self.batches else []

    def complete_message(self, message: FakeReceived) -> None:
        self.completed.append(message.message_id)

    def abandon_message(self, message: FakeReceived) -> None:
        self.abandoned.append(message.message_id)


def test_success_completes_and_an_exception_abandons() -> None:
    seen: list[str] = []

    def resolver(msg: Any) -> None:
        seen.append(msg.message_id)
        if msg.application_properties.get("MessageType") == "Bad":
            raise ValueError("poison")

    function = ServiceBusFunction("resolver", "msg", resolver, dict(BINDING))
    source = BusSource.resolve(BINDING, {**SETTINGS, "ServiceBusConnection": "x"})
    assert source is not None
    receiver = FakeReceiver(
        [
            [FakeReceived(message_id="ok-1")],
            [FakeReceived(message_id="bad-1", application_properties={"MessageType": "Bad"})],
        ]
    )
    BusReceiver(function, source, threading.Event())._drain(receiver)
    assert seen == ["ok-1", "bad-1"]
    assert receiver.completed == ["ok-1"]
    assert receiver.abandoned == ["bad-1"]
