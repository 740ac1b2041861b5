"""How control messages leave Settle: Service Bus, the in-process loopback, or nothing (503).

* :class:`ServiceBusTransport` (``ServiceBusConnection`` = a connection string, or
  ``ServiceBusConnection__fullyQualifiedNamespace`` [+ ``__clientId``] for a managed identity): one
  ``ServiceBusClient`` per process, one sender per topic, created on first use and reused; every call
  bounded by a timeout.
* :class:`LoopbackTransport` (``SETTLE_LOOPBACK=true``, **a learning transport for local runs and
  tests**): hands the message to the resolver in-process exactly as NimBus's fan-out rule forwards its
  copy (the ``to-{endpoint}`` rule has no action, so the copy's properties are the sent ones). No
  subscriber exists behind it: the terminal response never comes by itself.
* :class:`UnconfiguredTransport`: neither configured; every send is a 503 saying what to set.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from common.clock import utcnow
from common.errors import Unavailable
from common.settings import env, env_flag

if TYPE_CHECKING:
    import azure.functions as func
    from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSender

log = logging.getLogger("settle.transport")

CONNECTION = "ServiceBusConnection"
_SEND_TIMEOUT_S = 10.0


class Transport(Protocol):
    """Sends one control message to an endpoint's topic, or raises :class:`Unavailable`."""

    name: str

    def send(self, topic: str, message: ServiceBusMessage) -> None: ...


def message_body(message: ServiceBusMessage) -> bytes:
    body: Any = message.body
    if isinstance(body, bytes | str):
        return body.encode() if isinstance(body, str) else body
    return b"".join(bytes(part) for part in body)


def to_trigger_message(message: ServiceBusMessage, *, enqueued: datetime) -> func.ServiceBusMessage:
    """The copy the resolver's trigger would receive for ``message``."""
    from azure.functions.servicebus import ServiceBusMessage as TriggerMessage

    props = {
        str(k if isinstance(k, str) else k.decode()): v
        for k, v in (message.application_properties or {}).items()
    }
    return TriggerMessage(
        body=message_body(message),
        message_id=str(message.message_id),
        session_id=message.session_id,
        correlation_id=message.correlation_id,
        application_properties=props,
        user_properties=dict(props),
        enqueued_time_utc=enqueued,
        delivery_count=1,
    )


class ServiceBusTransport:
    """azure-servicebus sender(s) on one namespace."""

    name = "servicebus"

    def __init__(
        self,
        *,
        connection_string: str | None = None,
        fully_qualified_namespace: str | None = None,
        client_id: str | None = None,
    ) -> None:
        if not connection_string and not fully_qualified_namespace:
            raise ValueError("a connection string or a fully qualified namespace is required")
        self._connection_string = connection_string
        self._namespace = fully_qualified_namespace
        self._client_id = client_id
        self._lock = threading.Lock()
        self._client: ServiceBusClient | None = None
        self._senders: dict[str, ServiceBusSender] = {}

    def _sender(self, topic: str) -> ServiceBusSender:
        sender = self._senders.get(topic)
        if sender is not None:
            return sender
        with self._lock:
            if self._client is None:
                from azure.servicebus import ServiceBusClient

                options: dict[str, Any] = {
                    "retry_total": 2,
                    "retry_backoff_factor": 0.5,
                    "retry_backoff_max": 4,
                }
                if self._connection_string:
                    self._client = ServiceBusClient.from_connection_string(self._connection_string, **options)
                else:
                    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

                    credential: Any = (
                        ManagedIdentityCredential(client_id=self._client_id)
                        if self._client_id
                        else DefaultAzureCredential()
                    )
                    assert self._namespace is not None
                    self._client = ServiceBusClient(self._namespace, credential, **options)
            sender = self._senders.get(topic)
            if sender is None:
                sender = self._client.get_topic_sender(topic_name=topic, socket_timeout=_SEND_TIMEOUT_S)
                self._senders[topic] = sender
        return sender

    def _drop(self, topic: str) -> None:
        with self._lock:
            sender = self._senders.pop(topic, None)
        if sender is not None:
            try:
                sender.close()
            except Exception:
                log.debug("closing a failed sender", exc_info=True)

    def send(self, topic: str, message: ServiceBusMessage) -> None:
        try:
            self._sender(topic).send_messages(message, timeout=_SEND_TIMEOUT_S)
        except Exception as exc:
            self._drop(topic)  # a broken link is rebuilt on the next send
            raise Unavailable(f"Service Bus did not accept the message for topic {topic!r}: {exc}") from exc

    def schedule_copy(
        self, msg: func.ServiceBusMessage, *, delay_s: float, throttle_retry_count: int
    ) -> None:
        """NimBus ``ScheduleRedelivery``: same body, MessageId, session, properties + ThrottleRetryCount."""
        from azure.servicebus import ServiceBusMessage

        from handoff.contract import Prop, properties_of

        props: dict[str | bytes, Any] = {str(k): v for k, v in properties_of(msg).items()}
        props[Prop.THROTTLE_RETRY_COUNT] = throttle_retry_count
        copy = ServiceBusMessage(
            msg.get_body(),
            message_id=msg.message_id,
            session_id=msg.session_id,
            correlation_id=msg.correlation_id,
            application_properties=props,
        )
        topic = env("RESOLVER_TOPIC", "Resolver") or "Resolver"
        at = datetime.now(UTC) + timedelta(seconds=delay_s)
        self._sender(topic).schedule_messages(copy, at, timeout=_SEND_TIMEOUT_S)

    def close(self) -> None:
        with self._lock:
            for sender in self._senders.values():
                sender.close()
            self._senders.clear()
            if self._client is not None:
                self._client.close()
                self._client = None


class LoopbackTransport:
    """Learning transport: the resolver projects the forwarded copy in-process (local runs and tests)."""

    name = "loopback"

    def __init__(self, deliver: Callable[[func.ServiceBusMessage], object]) -> None:
        self._deliver = deliver

    def send(self, topic: str, message: ServiceBusMessage) -> None:
        try:
            self._deliver(to_trigger_message(message, enqueued=utcnow()))
        except Unavailable:
            raise
        except Exception as exc:
            raise Unavailable(f"The loopback resolver could not project the message: {exc}") from exc


class UnconfiguredTransport:
    """No Service Bus and no loopback: settlement is unavailable, and says what to configure."""

    name = "none"

    def send(self, topic: str, message: ServiceBusMessage) -> None:
        raise Unavailable(
            "No Service Bus is configured for settlement: set ServiceBusConnection (a connection string) or "
            "ServiceBusConnection__fullyQualifiedNamespace (managed identity), or SETTLE_LOOPBACK=true "
            "for local runs."
        )


def transport_from_env(loopback: Callable[[func.ServiceBusMessage], object]) -> Transport:
    """Service Bus when configured, else the loopback when ``SETTLE_LOOPBACK`` is on, else 503s."""
    connection = env(CONNECTION)
    namespace = env(f"{CONNECTION}__fullyQualifiedNamespace")
    if connection or namespace:
        return ServiceBusTransport(
            connection_string=connection,
            fully_qualified_namespace=namespace,
            client_id=env(f"{CONNECTION}__clientId"),
        )
    if env_flag("SETTLE_LOOPBACK"):
        log.warning("SETTLE_LOOPBACK: control messages are projected in-process (learning transport)")
        return LoopbackTransport(loopback)
    return UnconfiguredTransport()
