"""The trace context of a control message as it goes on the wire: through Settle's own
``ServiceBusTransport`` and the SDK's ``ServiceBusSender.send_messages`` (only the AMQP transfer is
intercepted), and in from the host the way the Functions runtime hands a message to the worker
(``ServiceBusMessageInConverter.decode`` over JSON trigger metadata).

With telemetry on, azure-core tracing is on, and azure-servicebus writes ``traceparent`` and
``Diagnostic-Id`` of its own ``ServiceBus.message`` span into every message it sends, unless the
message already has them under the SDK's own (bytes) keys. The wire allows one value per key.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.functions import meta
from azure.functions.servicebus import ServiceBusMessageInConverter

from handoff import service
from handoff.messages.transport import ServiceBusTransport
from tests.support.handoff_flows import Flow, complete, parked
from tests.telemetry.conftest import Recorded, parent_of

# A namespace that is never reached: the SDK builds its client and sender offline.
FAKE_NAMESPACE = (
    "Endpoint=sb://settle-test.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=a2V5"
)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class WireCapture(ServiceBusTransport):
    """Settle's Service Bus transport; the link is never opened and the AMQP transfer is captured."""

    def __init__(self) -> None:
        super().__init__(connection_string=FAKE_NAMESPACE)
        self.wire: list[Any] = []  # the pyamqp messages the SDK would transfer

    def _open(self, topic: str) -> Any:
        sender = self._sender(topic)
        sender._send = lambda message, **_: self.wire.append(message._message)
        return sender

    def _sender(self, topic: str) -> Any:
        from azure.servicebus._pyamqp._decode import decode_payload

        sender: Any = super()._sender(topic)

        def scheduled(operation: Any, body: dict[Any, Any], *args: Any, **kwargs: Any) -> list[int]:
            for entry in body["messages"]:
                self.wire.append(decode_payload(memoryview(entry["message"])))
            return [1]

        sender._mgmt_request_response_with_retry = scheduled
        return sender


def wire_properties(amqp_message: Any) -> list[tuple[str, Any]]:
    """The application-properties map as the SDK encodes it (AMQP strings: bytes and str keys alike)."""
    from azure.servicebus._pyamqp._encode import encode_application_properties

    encoded = encode_application_properties(amqp_message.application_properties)
    pairs = []
    for key, value in encoded["VALUE"]:
        text = key["VALUE"]
        pairs.append((text.decode() if isinstance(text, bytes) else text, value))
    return pairs


@pytest.fixture
def wire(fresh_tables: str) -> Iterator[WireCapture]:
    transport = WireCapture()
    service.use_transport(transport)
    yield transport
    service.reset()


def test_a_sent_control_message_has_one_traceparent_and_it_is_the_settlement_s(
    otel: Recorded, call, resolve, flow: Flow, wire: WireCapture
):
    parked(resolve, flow)
    assert complete(call, flow).status == 202
    settled = otel.span("settle.handoff.complete")
    [amqp_message] = wire.wire

    pairs = wire_properties(amqp_message)
    names = [name for name, _ in pairs]
    assert len(names) == len(set(names)), f"a property twice on the wire: {sorted(names)}"
    props = dict(pairs)
    flags = int(settled.context.trace_flags)
    expected = f"00-{settled.context.trace_id:032x}-{settled.context.span_id:016x}-{flags:02x}"
    assert props["traceparent"] == expected
    assert props["Diagnostic-Id"] == expected
    assert props["MessageType"] == "HandoffCompletedRequest"


def test_a_redelivery_copy_keeps_the_context_of_the_message_it_copies(otel: Recorded, flow: Flow):
    from common import telemetry

    transport = WireCapture()
    original = flow.request(traceparent=TRACEPARENT, **{"Diagnostic-Id": TRACEPARENT})
    with telemetry.span("settle.resolver.project"):  # the resolver schedules it from inside its span
        transport.schedule_copy(original, delay_s=30, throttle_retry_count=1)
    [amqp_message] = transport.wire
    pairs = [
        (k.decode() if isinstance(k, bytes) else k, v) for k, v in amqp_message.application_properties.items()
    ]
    names = [name for name, _ in pairs]
    assert len(names) == len(set(names)), f"a property twice on the wire: {sorted(names)}"
    props = {k: v.decode() if isinstance(v, bytes) else v for k, v in pairs}
    assert props["traceparent"] == TRACEPARENT and props["Diagnostic-Id"] == TRACEPARENT
    assert props["ThrottleRetryCount"] == 1


def host_delivery(properties: dict[str, Any], *, body: bytes, message_id: str) -> Any:
    """The message the worker passes to the resolver: the host's JSON trigger metadata, decoded."""
    metadata = {
        "ApplicationProperties": meta.Datum(json.dumps(properties), "json"),
        "UserProperties": meta.Datum(json.dumps(properties), "json"),
        "MessageId": meta.Datum(message_id, "string"),
        "SessionId": meta.Datum("session-1", "string"),
        "DeliveryCount": meta.Datum(1, "int"),
        "EnqueuedTimeUtc": meta.Datum(datetime.now(UTC).isoformat(), "string"),
    }
    return ServiceBusMessageInConverter.decode(meta.Datum(body, "bytes"), trigger_metadata=metadata)


@pytest.mark.parametrize("header", ["traceparent", "Diagnostic-Id"])
def test_the_resolver_continues_the_context_of_a_message_as_the_host_delivers_it(
    otel: Recorded, resolve, flow: Flow, header: str
):
    template = flow.request()
    properties = dict(template.application_properties) | {header: TRACEPARENT}
    message = host_delivery(properties, body=template.get_body(), message_id="req-" + uuid.uuid4().hex)
    assert isinstance(message.application_properties[header], str)  # JSON: text, never bytes
    resolve(message)
    span = otel.span("settle.resolver.project")
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{parent_of(span).span_id:016x}" == "00f067aa0ba902b7"
    assert dict(span.attributes or {})["settle.outcome"] == "applied"
