"""Service Bus triggers fed from a real namespace or the emulator (only when a connection is configured).

``azure.servicebus`` and ``azure.identity`` are imported inside the receiver: the development host starts
without them when no connection is configured.

Service Bus and identity imports are inside the functions that use them, so the development host loads them
only when it receives from a real namespace.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devtools.appsettings import resolve_expression
from devtools.calls import Calls, DirectCalls, FunctionFailed
from devtools.functiontable import ServiceBusFunction
from devtools.invocation import AdminMessage, build_service_bus_message

log = logging.getLogger("settle.devhost")


def _text_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)


def admin_message_from_received(received: Any) -> AdminMessage:
    """An :class:`AdminMessage` from an ``azure.servicebus.ServiceBusReceivedMessage`` (duck-typed)."""
    body = received.body
    if isinstance(body, bytes | bytearray | str):
        raw: bytes | str = bytes(body) if not isinstance(body, str) else body
    else:  # a data body is an iterable of byte sections
        raw = b"".join(bytes(section) for section in body)
    properties = {
        _text_or_none(key) or "": (value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
        for key, value in (received.application_properties or {}).items()
    }
    return AdminMessage(
        body=raw,
        message_id=_text_or_none(received.message_id),
        session_id=_text_or_none(received.session_id),
        correlation_id=_text_or_none(received.correlation_id),
        content_type=_text_or_none(received.content_type),
        subject=_text_or_none(received.subject),
        to=_text_or_none(received.to),
        reply_to=_text_or_none(received.reply_to),
        application_properties=properties,
        enqueued_time_utc=received.enqueued_time_utc,
        # The AMQP header counts earlier attempts (0 on the first delivery); the Functions host, through
        # the .NET SDK, reports attempts including this one.
        delivery_count=(received.delivery_count or 0) + 1,
        sequence_number=received.sequence_number,
    )


@dataclass(frozen=True)
class BusSource:
    """Where a Service Bus trigger's messages come from, resolved from its binding and the settings."""

    connection_string: str | None
    namespace: str | None
    client_id: str | None
    topic: str | None
    subscription: str | None
    queue: str | None
    sessions: bool

    @classmethod
    def resolve(cls, binding: Mapping[str, Any], environ: Mapping[str, str]) -> BusSource | None:
        """``None`` when the trigger's connection is not configured (the loopback/admin-only default)."""
        name = str(binding.get("connection") or "AzureWebJobsServiceBus")
        connection = environ.get(name) or None
        namespace = environ.get(f"{name}__fullyQualifiedNamespace") or None
        if connection is None and namespace is None:
            return None

        def setting(key: str) -> str | None:
            value = binding.get(key)
            return resolve_expression(str(value), environ) if value else None

        return cls(
            connection_string=connection,
            namespace=namespace,
            client_id=environ.get(f"{name}__clientId") or None,
            topic=setting("topicName"),
            subscription=setting("subscriptionName"),
            queue=setting("queueName"),
            sessions=bool(binding.get("isSessionsEnabled")),
        )

    def describe(self) -> str:
        entity = self.queue or f"{self.topic}/{self.subscription}"
        where = self.namespace or "the connection string's namespace"
        return f"{entity} on {where}" + (" (sessions)" if self.sessions else "")


class BusReceiver:
    """Feeds one Service Bus trigger from its entity: complete on success, abandon on an exception.

    One message at a time, session by session (like ``maxConcurrentSessions: 1``): enough for
    development, and it keeps a session's order. Every SDK call has a timeout.
    """

    WAIT_SECONDS = 5

    def __init__(
        self,
        function: ServiceBusFunction,
        source: BusSource,
        stop: threading.Event,
        calls: Calls | None = None,
    ) -> None:
        self.calls: Calls = calls or DirectCalls()
        self.function = function
        self.source = source
        self.stop = stop

    def _client(self) -> Any:
        from azure.servicebus import ServiceBusClient

        if self.source.connection_string:
            return ServiceBusClient.from_connection_string(self.source.connection_string)
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential(managed_identity_client_id=self.source.client_id)
        assert self.source.namespace is not None
        return ServiceBusClient(self.source.namespace, credential)

    def _receiver(self, client: Any) -> Any:
        from azure.servicebus import NEXT_AVAILABLE_SESSION

        session = NEXT_AVAILABLE_SESSION if self.source.sessions else None
        if self.source.queue:
            return client.get_queue_receiver(
                self.source.queue, session_id=session, max_wait_time=self.WAIT_SECONDS
            )
        return client.get_subscription_receiver(
            self.source.topic, self.source.subscription, session_id=session, max_wait_time=self.WAIT_SECONDS
        )

    def run(self) -> None:
        from azure.servicebus.exceptions import OperationTimeoutError

        while not self.stop.is_set():
            try:
                with self._client() as client, self._receiver(client) as receiver:
                    self._drain(receiver)
            except OperationTimeoutError:
                continue  # no session had messages within the wait
            except Exception as exc:
                log.warning("%s: receiving failed (%s); retrying in 5 s", self.function.name, exc)
                self.stop.wait(5)

    def _drain(self, receiver: Any) -> None:
        while not self.stop.is_set():
            batch = receiver.receive_messages(max_message_count=1, max_wait_time=self.WAIT_SECONDS)
            if not batch:
                return  # idle: a session receiver moves on to the next session
            for received in batch:
                message = build_service_bus_message(admin_message_from_received(received))
                try:
                    self.calls.service_bus(self.function, message)
                except Exception as exc:
                    trace = exc.stack_trace if isinstance(exc, FunctionFailed) else traceback.format_exc()
                    log.error("%s raised; abandoning:\n%s", self.function.name, trace)
                    receiver.abandon_message(received)
                else:
                    receiver.complete_message(received)
                    log.info("%s: completed message %s", self.function.name, received.message_id)
