"""Against a real Service Bus namespace: a settlement sends the pinned wire shape to the endpoint topic.

Runs only with ``pytest -m live`` and ``SETTLE_LIVE_SERVICEBUS`` holding a connection string whose
namespace has the endpoint topic ``SETTLE_LIVE_TOPIC`` (default ``Billing``) with a session-enabled
subscription ``SETTLE_LIVE_SUBSCRIPTION`` (default ``Billing``) whose rule accepts ``To = topic`` (the
NimBus topology that ``infra/`` and ``emulator/Config.json`` declare).
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from handoff import service
from handoff.messages.contract import Coordinates, MessageType, build_control_message, settlement_content
from handoff.messages.transport import ServiceBusTransport

pytestmark = pytest.mark.live

CONNECTION = os.environ.get("SETTLE_LIVE_SERVICEBUS")
requires_namespace = pytest.mark.skipif(
    not CONNECTION,
    reason="SETTLE_LIVE_SERVICEBUS is not set (a Service Bus connection string); live test skipped",
)


@requires_namespace
def test_a_control_message_arrives_with_the_pinned_wire_shape():
    from azure.servicebus import ServiceBusClient

    topic = os.environ.get("SETTLE_LIVE_TOPIC", "Billing")
    subscription = os.environ.get("SETTLE_LIVE_SUBSCRIPTION", "Billing")
    session = "live-" + uuid.uuid4().hex[:8]
    coords = Coordinates(
        event_id=str(uuid.uuid4()), session_id=session, message_id="park-1", event_type_id="Live.Test"
    )
    content = settlement_content(MessageType.HandoffCompletedRequest, coords, result_json='{"ok":true}')
    message = build_control_message(MessageType.HandoffCompletedRequest, topic, coords, content)
    transport = ServiceBusTransport(connection_string=CONNECTION)
    try:
        transport.send(topic, message)
    finally:
        transport.close()
    with (
        ServiceBusClient.from_connection_string(str(CONNECTION)) as client,
        client.get_subscription_receiver(
            topic, subscription, session_id=session, max_wait_time=30
        ) as receiver,
    ):
        [received] = receiver.receive_messages(max_message_count=1, max_wait_time=30)
        receiver.complete_message(received)
    props = {
        k.decode() if isinstance(k, bytes) else k: v
        for k, v in (received.application_properties or {}).items()
    }
    assert props["MessageType"] in (b"HandoffCompletedRequest", "HandoffCompletedRequest")
    assert str(received.message_id) == str(message.message_id)
    assert json.loads(str(received))["EventContent"]["EventJson"] == '{"ok":true}'
    service.reset()
