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

A send either succeeds, or raises :class:`SendRefused` when it is *certain* that nothing reached the
broker (the link could not be opened, the broker refused the message), or raises anything else: then the
message may or may not have been accepted (a timeout or a lost link during the send) and settlement
treats it as possibly sent. ``duplicate_window`` is how long the endpoint topics drop a repeated
MessageId (``HANDOFF_DUPLICATE_DETECTION``), or None when they do not: it decides whether an identical
re-send is safe.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from common.clock import utcnow
from common.errors import Unavailable
from common.settings import env, env_flag
from handoff.messages.contract import Prop, properties_of

if TYPE_CHECKING:
    import azure.functions as func
    from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSender

    from handoff.messages.outbound import OutboxMessage

log = logging.getLogger("settle.transport")

CONNECTION = "ServiceBusConnection"
DUPLICATE_DETECTION = "HANDOFF_DUPLICATE_DETECTION"
# What infra/ provisions on endpoint topics (requiresDuplicateDetection, PT10M).
DEFAULT_DUPLICATE_WINDOW = timedelta(minutes=10)
# The loopback's "broker" is the resolver itself: its history (EventId + MessageId) drops a repeated
# message for as long as the row exists.
LOOPBACK_WINDOW = timedelta(days=3650)
# Service Bus Standard: 256 KB per message, properties (system and user) included (Microsoft's quota table;
# reference/azure-practice.md). The broker adds system properties of its own; keep room for them.
SERVICE_BUS_MAX_MESSAGE_BYTES = 256 * 1024
_BROKER_PROPERTIES_ALLOWANCE = 2 * 1024
MAX_SEND_BYTES = SERVICE_BUS_MAX_MESSAGE_BYTES - _BROKER_PROPERTIES_ALLOWANCE
_SEND_TIMEOUT_S = 10.0
_OPEN_ATTEMPTS = 3
# Opening the link (with its retries) may take this long; a send whose link took longer is not attempted
# (SendRefused: nothing left). So a send starts within this of the call and is bounded by its timeout:
# ``SEND_WORST_CASE`` is how long after the deadline check a copy can still reach the broker, which the
# re-send margin (``handoff.settlement.timing.RESEND_MARGIN``) must exceed.
_OPEN_BUDGET_S = 15.0
SEND_WORST_CASE = timedelta(seconds=_OPEN_BUDGET_S + _SEND_TIMEOUT_S)
# With azure-core tracing on (Settle's telemetry turns it on), azure-servicebus writes the context of its
# own ``ServiceBus.message`` span into each message it sends or schedules, under these bytes keys, unless
# the message has them already (``setdefault``). Settle's context written under str keys would go on the
# wire next to the SDK's, the same AMQP string twice with two values; under the SDK's keys it is kept.
_SDK_TRACE_KEYS = {
    "traceparent": b"traceparent",
    "Diagnostic-Id": b"Diagnostic-Id",
    "tracestate": b"tracestate",
}


class SendRefused(Unavailable):
    """Nothing reached the broker: the send can be forgotten and tried again from scratch (503)."""


class SendUnconfirmed(Unavailable):
    """The send failed in a way that does not prove the broker did not accept the message."""


class Transport(Protocol):
    """Sends one control message to an endpoint's topic (see the module docstring for failures)."""

    name: str

    @property
    def duplicate_window(self) -> timedelta | None: ...

    def send(self, topic: str, message: ServiceBusMessage) -> None: ...


def duplicate_window_from_env() -> timedelta | None:
    """``HANDOFF_DUPLICATE_DETECTION``: ``true`` (default: PT10M as infra/ provisions), ``false`` (topics
    without duplicate detection, e.g. provisioned by NimBus), or the topics' window as an ISO-8601
    duration (``PT5M``: the Service Bus emulator's maximum)."""
    raw = (env(DUPLICATE_DETECTION) or "true").strip()
    if raw.lower() in {"1", "true", "yes", "on"}:
        return DEFAULT_DUPLICATE_WINDOW
    if raw.lower() in {"0", "false", "no", "off"}:
        return None
    match = re.fullmatch(r"P(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)", raw.upper())
    if match and any(match.groups()):
        hours, minutes, seconds = (int(g or 0) for g in match.groups())
        return timedelta(hours=hours, minutes=minutes, seconds=seconds)
    raise ValueError(f"{DUPLICATE_DETECTION} must be true, false or a duration like PT10M; got {raw!r}")


def encoded_size(message: OutboxMessage) -> int:
    """Bytes of ``message`` as the SDK encodes it for the wire (body, system and application properties)."""
    from azure.servicebus import ServiceBusMessageBatch

    # The SDK's own size accounting, offline; a batch adds a few bytes of envelope (a safe overestimate).
    batch = ServiceBusMessageBatch(max_size_in_bytes=2**31 - 1)
    batch.add_message(message.to_service_bus())
    return int(batch.size_in_bytes)


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


def keep_trace_context(message: ServiceBusMessage) -> ServiceBusMessage:
    """Move the message's ``traceparent``/``Diagnostic-Id``/``tracestate`` to the keys azure-servicebus
    checks before adding its own, so the message leaves with one value each: the one it carries."""
    props = message.application_properties
    if props:
        for text, raw in _SDK_TRACE_KEYS.items():
            if text in props:
                props[raw] = props.pop(text)
    return message


def _not_authorized(topic: str, exc: Exception) -> str:
    """A refusal of Settle's identity (401/403): in Azure, Data Sender is granted per endpoint topic."""
    return (
        f"Service Bus refused Settle's identity on topic {topic!r} ({exc}): Azure Service Bus Data Sender is "
        "granted only on the endpoint topics the deployment lists in its `endpoints` parameter; add "
        f"{topic!r} there and redeploy (infra/README: Deploy)"
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
        duplicate_window: timedelta | None = DEFAULT_DUPLICATE_WINDOW,
    ) -> None:
        if not connection_string and not fully_qualified_namespace:
            raise ValueError("a connection string or a fully qualified namespace is required")
        self._connection_string = connection_string
        self._namespace = fully_qualified_namespace
        self._client_id = client_id
        self.duplicate_window = duplicate_window
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

                # No SDK retries: a send retried inside the SDK after a timeout is a second copy, which
                # only duplicate detection could drop. Opening the link is retried here instead.
                options: dict[str, Any] = {"retry_total": 0}
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

    def _open(self, topic: str) -> ServiceBusSender:
        """The topic's sender with its link open (retried: failing here sends nothing)."""
        for attempt in range(1, _OPEN_ATTEMPTS + 1):
            try:
                sender = self._sender(topic)
                return sender.__enter__()  # opens the link (the context-manager entry of the SDK)
            except Exception:
                self._drop(topic)
                if attempt == _OPEN_ATTEMPTS:
                    raise
                time.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    def send(self, topic: str, message: ServiceBusMessage) -> None:
        from azure.servicebus.exceptions import (
            MessageSizeExceededError,
            MessagingEntityDisabledError,
            MessagingEntityNotFoundError,
            ServiceBusAuthenticationError,
            ServiceBusAuthorizationError,
            ServiceBusQuotaExceededError,
            ServiceBusServerBusyError,
        )

        started = time.monotonic()
        try:
            sender = self._open(topic)
        except (ServiceBusAuthenticationError, ServiceBusAuthorizationError) as exc:
            raise SendRefused(_not_authorized(topic, exc)) from exc
        except Exception as exc:
            raise SendRefused(f"Service Bus could not be reached for topic {topic!r}: {exc}") from exc
        if time.monotonic() - started > _OPEN_BUDGET_S:
            raise SendRefused(
                f"Opening the link to topic {topic!r} took over {_OPEN_BUDGET_S:.0f} s; nothing was sent "
                "(a late send could land outside the duplicate-detection window)."
            )
        try:
            sender.send_messages(keep_trace_context(message), timeout=_SEND_TIMEOUT_S)
        except (ServiceBusAuthenticationError, ServiceBusAuthorizationError) as exc:
            raise SendRefused(_not_authorized(topic, exc)) from exc
        except (
            MessageSizeExceededError,
            MessagingEntityDisabledError,
            MessagingEntityNotFoundError,
            ServiceBusQuotaExceededError,
            ServiceBusServerBusyError,
        ) as exc:
            # The broker answered, and its answer was no: the message is not in the topic.
            raise SendRefused(f"Service Bus refused the message for topic {topic!r}: {exc}") from exc
        except Exception as exc:
            self._drop(topic)  # a broken link is rebuilt on the next send
            raise SendUnconfirmed(
                f"Sending to topic {topic!r} failed after the message left ({type(exc).__name__}: {exc})"
            ) from exc

    def schedule_copy(
        self, msg: func.ServiceBusMessage, *, delay_s: float, throttle_retry_count: int
    ) -> None:
        """NimBus ``ScheduleRedelivery``: same body, MessageId, session, properties + ThrottleRetryCount."""
        from azure.servicebus import ServiceBusMessage

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
        self._sender(topic).schedule_messages(keep_trace_context(copy), at, timeout=_SEND_TIMEOUT_S)

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
    duplicate_window: timedelta | None = LOOPBACK_WINDOW

    def __init__(self, deliver: Callable[[func.ServiceBusMessage], object]) -> None:
        self._deliver = deliver

    def send(self, topic: str, message: ServiceBusMessage) -> None:
        try:
            self._deliver(to_trigger_message(message, enqueued=utcnow()))
        except Exception as exc:
            # The projection may have applied before its answer was lost: not a proof of "nothing sent".
            raise SendUnconfirmed(f"The loopback resolver could not project the message: {exc}") from exc


class UnconfiguredTransport:
    """No Service Bus and no loopback: settlement is unavailable, and says what to configure."""

    name = "none"
    duplicate_window: timedelta | None = None

    def send(self, topic: str, message: ServiceBusMessage) -> None:
        raise SendRefused(
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
            duplicate_window=duplicate_window_from_env(),
        )
    if env_flag("SETTLE_LOOPBACK"):
        log.warning("SETTLE_LOOPBACK: control messages are projected in-process (learning transport)")
        return LoopbackTransport(loopback)
    return UnconfiguredTransport()
