"""Invoking a function as the worker does: its trigger value, and the ``context`` with the host's trace.

Also the Service Bus message the worker builds (``azure.functions.servicebus.ServiceBusMessage``) from the
JSON of the admin endpoint or from a received message.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from azure.functions.servicebus import ServiceBusMessage
from pydantic import BaseModel, ConfigDict, Field

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TraceContext:
    """The W3C context the Functions host hands each invocation (``context.trace_context``)."""

    trace_parent: str
    trace_state: str = ""
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class InvocationContext:
    """What the worker passes as ``context``: the invocation's id, its function and the host's trace."""

    function_name: str
    trace_context: TraceContext
    invocation_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_directory: str = str(ROOT)


_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def host_trace(caller: str | None = None, state: str | None = None) -> TraceContext:
    """The context of the host's own invocation activity: a child of the caller's ``traceparent`` (an HTTP
    header, a message's Diagnostic-Id) when it is valid, else the root of a new trace, as the Functions
    host makes it."""
    match = _TRACEPARENT.match((caller or "").strip().lower())
    trace_id = match.group(1) if match and set(match.group(1)) != {"0"} else uuid.uuid4().hex
    flags = match.group(3) if match else "01"
    span_id = uuid.uuid4().hex[:16]
    return TraceContext(f"00-{trace_id}-{span_id}-{flags}", (state or "") if match else "")


def message_context(name: str, message: Any) -> InvocationContext:
    """The host continues a message's trace (its ``traceparent``, else ``Diagnostic-Id``)."""
    props = getattr(message, "application_properties", None) or {}
    caller = props.get("traceparent") or props.get("Diagnostic-Id")
    state = props.get("tracestate")
    return InvocationContext(name, host_trace(str(caller) if caller else None, str(state) if state else None))


def invoke(
    user_function: Callable[..., Any], arg_name: str, value: Any, context: InvocationContext | None = None
) -> Any:
    """Call a user function (sync or async) with its trigger argument, and ``context`` when it takes one."""
    arguments = {arg_name: value}
    if context is not None and "context" in inspect.signature(user_function).parameters:
        arguments["context"] = context
    result = user_function(**arguments)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


# --------------------------------------------------------------------------------------------------
# Service Bus messages from JSON (the admin endpoint)


class AdminMessage(BaseModel):
    """Body of ``POST /admin/functions/{name}`` for a Service Bus trigger."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    input: Any = None
    body: Any = None
    message_id: str | None = Field(default=None, alias="messageId")
    session_id: str | None = Field(default=None, alias="sessionId")
    correlation_id: str | None = Field(default=None, alias="correlationId")
    content_type: str | None = Field(default=None, alias="contentType")
    subject: str | None = None
    to: str | None = None
    reply_to: str | None = Field(default=None, alias="replyTo")
    application_properties: dict[str, Any] = Field(default_factory=dict, alias="applicationProperties")
    enqueued_time_utc: datetime | None = Field(default=None, alias="enqueuedTimeUtc")
    delivery_count: int = Field(default=1, ge=1, alias="deliveryCount")
    sequence_number: int | None = Field(default=None, alias="sequenceNumber")


def body_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_sequence = iter(range(1, sys.maxsize))
_sequence_lock = threading.Lock()


def build_service_bus_message(payload: AdminMessage) -> Any:
    """An ``azure.functions.servicebus.ServiceBusMessage`` as the worker would build it."""

    raw = payload.body if payload.body is not None else payload.input
    body = body_bytes(raw)
    with _sequence_lock:
        sequence = payload.sequence_number or next(_sequence)
    now = datetime.now(UTC)
    enqueued = payload.enqueued_time_utc or now
    if enqueued.tzinfo is None:
        enqueued = enqueued.replace(tzinfo=UTC)
    message_id = payload.message_id or uuid.uuid4().hex
    properties = dict(payload.application_properties)
    metadata = {
        "MessageId": message_id,
        "SessionId": payload.session_id,
        "CorrelationId": payload.correlation_id,
        "DeliveryCount": payload.delivery_count,
        "EnqueuedTimeUtc": enqueued.isoformat(),
        "SequenceNumber": sequence,
        "ApplicationProperties": properties,
        "UserProperties": properties,
    }
    return ServiceBusMessage(
        body=body,
        message_id=message_id,
        session_id=payload.session_id,
        correlation_id=payload.correlation_id,
        content_type=payload.content_type or ("application/json" if body[:1] in (b"{", b"[") else None),
        subject=payload.subject,
        label=payload.subject,
        to=payload.to,
        reply_to=payload.reply_to,
        application_properties=properties,
        user_properties=properties,
        enqueued_time_utc=enqueued,
        delivery_count=payload.delivery_count,
        sequence_number=sequence,
        enqueued_sequence_number=sequence,
        lock_token=str(uuid.uuid4()),
        locked_until=now + timedelta(seconds=30),
        expires_at_utc=enqueued + timedelta(days=14),
        trigger_metadata=metadata,
    )
