"""A small development host for the Settle function app (a development tool, never deployed).

``python -m devtools.host --port 7071`` serves ``function_app.app`` where Azure Functions Core Tools is
not installed. It is not the Functions host: it exists so a newcomer (and our tests) can reach the same
functions at the same URLs with nothing but Python and Azurite. ``.funcignore`` excludes ``devtools/``.

What it does, all derived from the app's own metadata (``app.get_functions()``), so a new function
needs no change here:

* HTTP functions at ``/{routePrefix}/{route}`` (prefix from ``host.json``, default ``api``), with route
  templates (``{id}``, ``{id:guid}``, ``{name?}``, ``{*rest}``), the declared methods (405 + ``Allow``
  otherwise), query, headers and body passed in a ``func.HttpRequest``. Repeated query parameters are
  joined with ``,`` in ``req.params`` (what the Functions host does); ``req.url`` keeps the full query
  string so a function can read every value with ``urllib.parse.parse_qs``.
* Auth levels: ``anonymous`` functions are open. ``function``/``admin`` functions (and the admin endpoint)
  need ``x-functions-key: <key>`` or ``?code=<key>`` when ``SETTLE_DEV_FUNCTION_KEY`` is set (401
  otherwise); when it is not set they are open and the host prints a warning at start. (Core Tools
  itself ignores auth levels locally; the key is there so a client's key handling can be exercised.)
* Timers on their NCRONTAB schedule (six fields, ``%SETTING%`` resolved from the settings), called with
  ``azure.functions.timer.TimerRequest(past_due=...)``; ``run_on_startup`` is honoured.
* ``POST /admin/functions/{name}``: invoke a timer, or a Service Bus trigger with a message built from
  JSON: ``{"input": ...}`` (the Functions host's shape: the body) or ``{"body": ..., "messageId": ...,
  "sessionId": ..., "correlationId": ..., "applicationProperties": {...}, "enqueuedTimeUtc": ...,
  "deliveryCount": ...}``. Answers 202 like the host, or 500 problem+json with the exception message.
* Service Bus triggers also receive from their topic/subscription when their connection setting
  (``ServiceBusConnection`` or ``ServiceBusConnection__fullyQualifiedNamespace``) is set: a real
  namespace or the emulator. Unset (the loopback default), the admin endpoint is their only input.
* ``local.settings.json`` ``Values`` become environment variables (never overriding ones already set);
  ``AzureWebJobs.<name>.Disabled=true`` disables a function as on Azure.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import contextlib
import inspect
import json
import logging
import os
import re
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devtools import indexing
from devtools.indexing import IndexedFunction

ROOT = Path(__file__).resolve().parent.parent
FUNCTION_KEY_SETTING = "SETTLE_DEV_FUNCTION_KEY"
PROBLEM = "application/problem+json"
BANNER = (
    "Settle development host: a development tool, NOT the Azure Functions host and never deployed. "
    "Use `func start` (Azure Functions Core Tools) where it is installed."
)

log = logging.getLogger("settle.devhost")


# --------------------------------------------------------------------------------------------------
# Settings


def read_settings(path: Path) -> dict[str, str]:
    """The ``Values`` of a ``local.settings.json`` file (empty when the file is absent)."""
    if not path.exists():
        return {}
    document = json.loads(path.read_text(encoding="utf-8"))
    values = document.get("Values") or {}
    return {str(k): "" if v is None else str(v) for k, v in values.items()}


def apply_settings(values: Mapping[str, str], environ: dict[str, str] | None = None) -> list[str]:
    """Copy settings into the environment without overriding variables already set; returns the names set."""
    target = os.environ if environ is None else environ
    applied = []
    for name, value in values.items():
        if name not in target:
            target[name] = value
            applied.append(name)
    return applied


def route_prefix(host_json: Path) -> str:
    """``extensions.http.routePrefix`` of ``host.json`` (``api`` when absent, as the host does)."""
    if not host_json.exists():
        return "api"
    document = json.loads(host_json.read_text(encoding="utf-8"))
    prefix = document.get("extensions", {}).get("http", {}).get("routePrefix", "api")
    return str(prefix).strip("/")


_SETTING_RE = re.compile(r"%([^%]+)%")


def resolve_expression(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Resolve ``%NAME%`` expressions from app settings (a missing setting is an error, as on Azure)."""
    source = os.environ if environ is None else environ

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in source:
            raise KeyError(f"app setting {name!r} (used as %{name}%) is not set")
        return source[name]

    return _SETTING_RE.sub(lookup, text)


# --------------------------------------------------------------------------------------------------
# NCRONTAB (the six-field cron of Azure Functions timers: second minute hour day month day-of-week)

_MONTHS = {name: i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {name: i for i, name in enumerate(["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"])}


def _field_values(text: str, low: int, high: int, names: Mapping[str, int]) -> frozenset[int]:
    values: set[int] = set()

    def number(token: str) -> int:
        for name, value in names.items():
            if token.lower() == name.lower():
                return value
        if not token.isdigit():
            raise ValueError(f"not a number: {token!r}")
        return int(token)

    for part in text.split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/", 1)
            step = int(step_text)
            if step < 1:
                raise ValueError("step must be >= 1")
        if part == "*":
            start, end = low, high
        elif "-" in part:
            first, last = part.split("-", 1)
            start, end = number(first), number(last)
        else:
            start = number(part)
            end = high if step > 1 else start
        if high == 6 and end == 7:  # Sunday written as 7
            end = 6 if start != 7 else 0
            start = 0 if start == 7 else start
        if not (low <= start <= high and low <= end <= high) or start > end:
            raise ValueError(f"{part!r} is outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Schedule:
    """A parsed NCRONTAB expression; ``next_after`` gives the next occurrence (UTC, whole seconds)."""

    expression: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday

    @classmethod
    def parse(cls, expression: str) -> Schedule:
        fields = expression.split()
        if len(fields) != 6:
            raise ValueError(
                f"NCRONTAB needs six fields (second minute hour day month day-of-week); got {expression!r}"
            )
        second, minute, hour, day, month, weekday = fields
        return cls(
            expression=expression,
            seconds=_field_values(second, 0, 59, {}),
            minutes=_field_values(minute, 0, 59, {}),
            hours=_field_values(hour, 0, 23, {}),
            days=_field_values(day, 1, 31, {}),
            months=_field_values(month, 1, 12, _MONTHS),
            weekdays=_field_values(weekday, 0, 6, _DAYS),
        )

    def _day_matches(self, moment: datetime) -> bool:
        # NCrontab (the library the Functions host uses) requires both day fields to match.
        weekday = (moment.weekday() + 1) % 7
        return moment.day in self.days and moment.month in self.months and weekday in self.weekdays

    def next_after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment``."""
        candidate = moment.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)
        limit = candidate + timedelta(days=366 * 5)
        while candidate < limit:
            if not self._day_matches(candidate):
                candidate = candidate.replace(hour=0, minute=0, second=0) + timedelta(days=1)
                continue
            if candidate.hour not in self.hours:
                candidate = candidate.replace(minute=0, second=0) + timedelta(hours=1)
                continue
            if candidate.minute not in self.minutes:
                candidate = candidate.replace(second=0) + timedelta(minutes=1)
                continue
            if candidate.second not in self.seconds:
                candidate += timedelta(seconds=1)
                continue
            return candidate
        raise ValueError(f"{self.expression!r} never fires")


# --------------------------------------------------------------------------------------------------
# Route templates (the ASP.NET-style templates of HTTP triggers)

_CONSTRAINTS: dict[str, str] = {
    "guid": r"[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}",
    "int": r"-?\d+",
    "long": r"-?\d+",
    "decimal": r"-?\d+(?:\.\d+)?",
    "double": r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
    "float": r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
    "bool": r"(?i:true|false)",
    "alpha": r"[A-Za-z]+",
    "datetime": r"[^/]+",
}
_PARAM_RE = re.compile(r"^\{(?P<star>\*{1,2})?(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<rest>[^}]*)\}$")


def _segment_pattern(segment: str) -> tuple[str, str | None, bool]:
    """Regex for one template segment; returns (pattern, parameter name, optional)."""
    match = _PARAM_RE.match(segment)
    if match is None:
        if "{" in segment:
            raise ValueError(f"route segments mixing text and parameters are not supported: {segment!r}")
        return re.escape(segment), None, False
    name, rest, star = match.group("name"), match.group("rest"), match.group("star")
    optional = rest.endswith("?")
    rest = rest.rstrip("?")
    if "=" in rest:  # a default value makes the parameter optional
        rest = rest.split("=", 1)[0]
        optional = True
    pattern = r".*" if star else r"[^/]+"
    extra: list[str] = []
    for constraint in filter(None, rest.split(":")):
        kind, _, argument = constraint.partition("(")
        argument = argument.rstrip(")")
        if kind in _CONSTRAINTS:
            pattern = _CONSTRAINTS[kind]
        elif kind in {"minlength", "maxlength", "length"}:
            bounds = argument.split(",")
            if kind == "minlength":
                extra.append(f"(?=[^/]{{{int(bounds[0])},}}(?:/|$))")
            elif kind == "maxlength":
                extra.append(f"(?![^/]{{{int(bounds[0]) + 1},}})")
            else:
                lo, hi = (bounds[0], bounds[0]) if len(bounds) == 1 else bounds
                extra.append(f"(?=[^/]{{{int(lo)},{int(hi)}}}(?:/|$))")
        elif kind in {"min", "max", "range"}:
            pattern = r"-?\d+"  # checked numerically after matching
        elif kind == "regex":
            pattern = f"(?:{argument})"
        else:
            raise ValueError(f"unsupported route constraint {kind!r} in {segment!r}")
    return "".join(extra) + f"(?P<{name}>{pattern})", name, optional


@dataclass(frozen=True)
class RouteTemplate:
    """A compiled route template such as ``v1/handoffs/{endpointId}/jobs/{externalJobId}``."""

    template: str
    regex: re.Pattern[str]
    parameters: tuple[str, ...]
    ranges: tuple[tuple[str, int | None, int | None], ...]

    @classmethod
    def compile(cls, template: str, prefix: str = "") -> RouteTemplate:
        segments = [s for s in (prefix.strip("/") + "/" + template.strip("/")).split("/") if s]
        regex = ""
        names: list[str] = []
        ranges: list[tuple[str, int | None, int | None]] = []
        for segment in segments:
            pattern, name, optional = _segment_pattern(segment)
            if name is not None:
                names.append(name)
                for kind, lo, hi in re.findall(r":(min|max|range)\((-?\d+)(?:,(-?\d+))?\)", segment):
                    if kind == "min":
                        ranges.append((name, int(lo), None))
                    elif kind == "max":
                        ranges.append((name, None, int(lo)))
                    else:
                        ranges.append((name, int(lo), int(hi)))
            regex += f"(?:/{pattern})?" if optional else f"/{pattern}"
        # Literals match case-insensitively, as in ASP.NET routing; parameter values keep their case.
        return cls(template, re.compile(f"^{regex}/?$", re.IGNORECASE), tuple(names), tuple(ranges))

    def match(self, path: str) -> dict[str, str] | None:
        """Route parameters (percent-decoded) when ``path`` matches, else ``None``."""
        found = self.regex.match(path)
        if found is None:
            return None
        params = {k: unquote(v) for k, v in found.groupdict().items() if v is not None}
        for name, lo, hi in self.ranges:
            if name in params:
                value = int(params[name])
                if (lo is not None and value < lo) or (hi is not None and value > hi):
                    return None
        return params


# --------------------------------------------------------------------------------------------------
# The function table, from the app's metadata


@dataclass
class HttpFunction:
    name: str
    methods: tuple[str, ...]  # empty: every method
    auth_level: str  # anonymous | function | admin
    route: RouteTemplate
    arg_name: str
    user_function: Callable[..., Any]


@dataclass
class TimerFunction:
    name: str
    schedule_expression: str
    run_on_startup: bool
    arg_name: str
    user_function: Callable[..., Any]


@dataclass
class ServiceBusFunction:
    name: str
    arg_name: str
    user_function: Callable[..., Any]
    binding: dict[str, Any] = field(default_factory=dict)


@dataclass
class FunctionTable:
    http: list[HttpFunction]
    timers: dict[str, TimerFunction]
    service_bus: dict[str, ServiceBusFunction]
    other: dict[str, str]  # name -> trigger type we cannot host

    @property
    def names(self) -> set[str]:
        return {f.name for f in self.http} | set(self.timers) | set(self.service_bus) | set(self.other)


def _disabled(name: str, environ: Mapping[str, str]) -> bool:
    return environ.get(f"AzureWebJobs.{name}.Disabled", "").strip().lower() in {"1", "true"}


def build_function_table(
    functions: Iterable[IndexedFunction], prefix: str, environ: Mapping[str, str] | None = None
) -> FunctionTable:
    """Classify the functions the worker accepted by trigger, from the raw bindings it sends the host."""
    env = os.environ if environ is None else environ
    table = FunctionTable(http=[], timers={}, service_bus={}, other={})
    for fn in functions:
        name = fn.name
        if _disabled(name, env):
            log.info("function %s is disabled by AzureWebJobs.%s.Disabled", name, name)
            continue
        trigger = fn.trigger
        kind = fn.trigger_type
        arg_name = str(trigger["name"])
        if kind == "httpTrigger":
            methods = tuple(str(m).upper() for m in (trigger.get("methods") or ()))
            route = RouteTemplate.compile(str(trigger.get("route") or name), prefix)
            auth = str(trigger.get("authLevel") or "function").lower()
            table.http.append(HttpFunction(name, methods, auth, route, arg_name, fn.user_function))
        elif kind == "timerTrigger":
            table.timers[name] = TimerFunction(
                name, str(trigger["schedule"]), bool(trigger.get("runOnStartup")), arg_name, fn.user_function
            )
        elif kind == "serviceBusTrigger":
            binding = {k: v for k, v in trigger.items() if v is not None}
            table.service_bus[name] = ServiceBusFunction(name, arg_name, fn.user_function, binding)
        else:
            table.other[name] = kind
    # Literal routes win over parameterised ones (as in ASP.NET routing): fewer parameters first.
    table.http.sort(key=lambda f: (len(f.route.parameters), -len(f.route.template)))
    return table


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


def _message_context(name: str, message: Any) -> InvocationContext:
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


def _body_bytes(value: Any) -> bytes:
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
    from azure.functions.servicebus import ServiceBusMessage

    raw = payload.body if payload.body is not None else payload.input
    body = _body_bytes(raw)
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


# --------------------------------------------------------------------------------------------------
# Service Bus triggers fed from a real namespace or the emulator (only when a connection is configured)


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

    def __init__(self, function: ServiceBusFunction, source: BusSource, stop: threading.Event) -> None:
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
                    context = _message_context(self.function.name, message)
                    invoke(self.function.user_function, self.function.arg_name, message, context)
                except Exception:
                    log.error("%s raised; abandoning:\n%s", self.function.name, traceback.format_exc())
                    receiver.abandon_message(received)
                else:
                    receiver.complete_message(received)
                    log.info("%s: completed message %s", self.function.name, received.message_id)


# --------------------------------------------------------------------------------------------------
# HTTP plumbing


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    function: str = "-"


def problem(status: int, title: str, detail: str, **extra: Any) -> Answer:
    document = {"type": f"urn:settle:problem:devhost-{status}", "title": title, "status": status}
    document["detail"] = detail
    document.update(extra)
    body = json.dumps(document).encode("utf-8")
    return Answer(status, [("Content-Type", f"{PROBLEM}; charset=utf-8")], body)


def _from_function_response(response: Any, name: str) -> Answer:
    import azure.functions as func

    if response is None:
        return Answer(204, [], b"", name)
    if not isinstance(response, func.HttpResponse):
        text = response if isinstance(response, str | bytes) else json.dumps(response)
        return Answer(200, [("Content-Type", "text/plain; charset=utf-8")], _body_bytes(text), name)
    headers = [(str(k), str(v)) for k, v in response.headers.items()]
    if response.mimetype and not any(k.lower() == "content-type" for k, _ in headers):
        mimetype = response.mimetype
        if response.charset and "charset" not in mimetype:
            mimetype += f"; charset={response.charset}"
        headers.append(("Content-Type", mimetype))
    return Answer(response.status_code, headers, response.get_body() or b"", name)


class _Server(ThreadingHTTPServer):
    # socketserver's default backlog is 5: a burst of clients (agents, a load test) got connection resets
    # that they retried as failures. A thread per connection serves them; the backlog holds the burst.
    request_queue_size = 128


class DevHost:
    """The function table plus what serves it: routing, auth, timers and the admin endpoint."""

    def __init__(
        self,
        table: FunctionTable,
        *,
        prefix: str = "api",
        function_key: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.table = table
        self.prefix = prefix
        self.function_key = function_key or None
        self.environ = os.environ if environ is None else environ
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: ThreadingHTTPServer | None = None
        # One invocation of a timer at a time (the host's singleton lock): schedule and admin endpoint wait.
        self._timer_locks = {name: threading.Lock() for name in table.timers}

    @classmethod
    def from_module(
        cls,
        module: str = "function_app",
        *,
        host_json: Path = ROOT / "host.json",
        function_key: str | None = None,
    ) -> DevHost:
        """Serve what the Python worker accepts of ``module``'s app (:func:`devtools.indexing.index`): a
        function the real worker rejects is refused here too (:class:`~devtools.indexing.IndexingFailed`)."""
        prefix = route_prefix(host_json)
        table = build_function_table(indexing.index_module(module), prefix)
        key = function_key if function_key is not None else os.environ.get(FUNCTION_KEY_SETTING)
        return cls(table, prefix=prefix, function_key=key)

    # -- HTTP --------------------------------------------------------------------------------------

    def _authorised(self, level: str, headers: Mapping[str, str], query: list[tuple[str, str]]) -> bool:
        if level == "anonymous" or self.function_key is None:
            return True
        given = headers.get("x-functions-key") or next((v for k, v in query if k == "code"), None)
        return given == self.function_key

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes, base: str) -> Answer:
        """Answer one HTTP request (``target`` is the request line's path and query)."""
        import azure.functions as func

        parts = urlsplit(target)
        path = parts.path or "/"
        query = parse_qsl(parts.query, keep_blank_values=True)
        lower = {k.lower(): v for k, v in headers.items()}
        if path.rstrip("/").startswith("/admin/functions/"):
            return self._admin(method, path, lower, query, body)

        allowed: set[str] = set()
        for fn in self.table.http:
            route_params = fn.route.match(path)
            if route_params is None:
                continue
            if fn.methods and method not in fn.methods:
                allowed.update(fn.methods)
                continue
            if not self._authorised(fn.auth_level, lower, query):
                return Answer(401, [], b"", fn.name)
            params: dict[str, str] = {}
            for key, value in query:
                # The Functions host joins repeated values with ","; req.url keeps every value.
                params[key] = f"{params[key]},{value}" if key in params else value
            request = func.HttpRequest(
                method,
                base + target,
                headers=dict(lower),
                params=params,
                route_params=route_params,
                body=body,
            )
            try:
                trace = host_trace(lower.get("traceparent"), lower.get("tracestate"))
                response = invoke(fn.user_function, fn.arg_name, request, InvocationContext(fn.name, trace))
            except Exception as exc:
                log.error("function %s raised:\n%s", fn.name, traceback.format_exc())
                answer = problem(500, "Function failed", f"{type(exc).__name__}: {exc}", function=fn.name)
                answer.function = fn.name
                return answer
            return _from_function_response(response, fn.name)
        if allowed:
            answer = problem(405, "Method not allowed", f"{method} is not allowed on {path}.")
            answer.headers.append(("Allow", ", ".join(sorted(allowed))))
            return answer
        return problem(404, "Not found", f"No function is routed at {path}.")

    def _admin(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        query: list[tuple[str, str]],
        body: bytes,
    ) -> Answer:
        name = unquote(path.rstrip("/").rsplit("/", 1)[-1])
        if method != "POST":
            answer = problem(405, "Method not allowed", "The admin endpoint takes POST.")
            answer.headers.append(("Allow", "POST"))
            return answer
        if not self._authorised("admin", headers, query):
            return Answer(401, [], b"", name)
        if name not in self.table.names:
            return problem(404, "Not found", f"No function named {name!r}.")
        try:
            payload = AdminMessage.model_validate_json(body or b"{}")
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return problem(400, "Invalid input", f"{where}: {first['msg']}", field=where)
        try:
            if name in self.table.timers:
                self.run_timer(name, past_due=False)
            elif name in self.table.service_bus:
                fn = self.table.service_bus[name]
                message = build_service_bus_message(payload)
                invoke(fn.user_function, fn.arg_name, message, _message_context(fn.name, message))
            else:
                kind = self.table.other[name]
                return problem(400, "Not invocable", f"{name} has a {kind} the development host cannot feed.")
        except Exception as exc:
            log.error("function %s raised:\n%s", name, traceback.format_exc())
            answer = problem(500, "Function failed", f"{type(exc).__name__}: {exc}", function=name)
            answer.function = name
            return answer
        return Answer(202, [], b"", name)

    # -- timers ------------------------------------------------------------------------------------

    def run_timer(self, name: str, *, past_due: bool) -> None:
        """Invoke timer function ``name`` once."""
        from azure.functions.timer import TimerRequest

        fn = self.table.timers[name]
        with self._timer_locks[name]:
            invoke(
                fn.user_function,
                fn.arg_name,
                TimerRequest(past_due=past_due),
                InvocationContext(name, host_trace()),
            )

    def _timer_loop(self, fn: TimerFunction, schedule: Schedule) -> None:
        if fn.run_on_startup:
            self._safe_timer(fn.name, past_due=False)
        due = schedule.next_after(datetime.now(UTC))
        while not self._stop.is_set():
            wait = (due - datetime.now(UTC)).total_seconds()
            if wait > 0 and self._stop.wait(min(wait, 1.0)):
                return
            if wait > 0:
                continue
            # Late by more than a few seconds (a suspended laptop): tell the function, as the host does.
            late = (datetime.now(UTC) - due).total_seconds() > 5
            self._safe_timer(fn.name, past_due=late)
            due = schedule.next_after(datetime.now(UTC))

    def _safe_timer(self, name: str, *, past_due: bool) -> None:
        started = time.perf_counter()
        try:
            self.run_timer(name, past_due=past_due)
        except Exception:
            log.error("timer %s raised:\n%s", name, traceback.format_exc())
            return
        log.info(
            "timer %s ran in %.0f ms (past_due=%s)", name, (time.perf_counter() - started) * 1000, past_due
        )

    def start_timers(self) -> dict[str, Schedule]:
        """Start one thread per timer; returns the schedules (timers with unresolvable ones are skipped)."""
        schedules: dict[str, Schedule] = {}
        for fn in self.table.timers.values():
            try:
                schedule = Schedule.parse(resolve_expression(fn.schedule_expression, self.environ))
            except (KeyError, ValueError) as exc:
                log.error("timer %s not scheduled: %s", fn.name, exc)
                continue
            schedules[fn.name] = schedule
            thread = threading.Thread(
                target=self._timer_loop, args=(fn, schedule), name=f"timer-{fn.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return schedules

    # -- serving -----------------------------------------------------------------------------------

    def make_server(self, host: str, port: int) -> ThreadingHTTPServer:
        devhost = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "SettleDevHost/1.0"

            def _serve(self) -> None:
                started = time.perf_counter()
                body = self._body()
                host_header = self.headers.get("Host") or f"{host}:{port}"
                answer = devhost.handle(
                    self.command, self.path, dict(self.headers.items()), body, f"http://{host_header}"
                )
                self.send_response(answer.status)
                for key, value in answer.headers:
                    if key.lower() not in {"content-length", "connection", "transfer-encoding"}:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer.body)
                elapsed = (time.perf_counter() - started) * 1000
                log.info(
                    "%s %s -> %d %.1f ms [%s]",
                    self.command,
                    self.path,
                    answer.status,
                    elapsed,
                    answer.function,
                )

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    # Azure's Functions host forwards a body only when Content-Length is over 0: a chunked
                    # body never reaches the function there, so it does not here either. It is read (the
                    # connection stays usable) and dropped; the headers still say it was chunked.
                    while True:
                        size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b""
                        self.rfile.read(size)
                        self.rfile.readline()  # the CRLF after each chunk
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # one line per request is ours
                return

        server = _Server((host, port), Handler)
        server.daemon_threads = True
        self._server = server
        return server

    def start_receivers(self) -> dict[str, BusSource]:
        """Feed each Service Bus trigger whose connection is configured (none by default: loopback)."""
        sources: dict[str, BusSource] = {}
        for fn in self.table.service_bus.values():
            try:
                source = BusSource.resolve(fn.binding, self.environ)
            except KeyError as exc:
                log.error("%s not fed from Service Bus: %s", fn.name, exc)
                continue
            if source is None:
                continue
            sources[fn.name] = source
            receiver = BusReceiver(fn, source, self._stop)
            thread = threading.Thread(target=receiver.run, name=f"bus-{fn.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return sources

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
        for thread in self._threads:
            thread.join(timeout=5)

    def describe(self, base: str) -> list[str]:
        """The lines printed at start: every function and where it is."""
        lines = []
        for fn in sorted(self.table.http, key=lambda f: f.route.template):
            methods = ",".join(fn.methods) or "*"
            route = fn.route.template.strip("/")
            path = f"/{self.prefix}/{route}" if self.prefix else f"/{route}"
            lines.append(f"  {fn.name}: [{methods}] {base}{path}  (auth: {fn.auth_level})")
        for timer in self.table.timers.values():
            lines.append(f"  {timer.name}: timerTrigger {timer.schedule_expression}")
        for bus in self.table.service_bus.values():
            lines.append(f"  {bus.name}: serviceBusTrigger (POST {base}/admin/functions/{bus.name})")
        for name, kind in self.table.other.items():
            lines.append(f"  {name}: {kind} (not hosted by the development host)")
        return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7071)
    parser.add_argument("--settings", type=Path, default=ROOT / "local.settings.json")
    parser.add_argument("--no-timers", action="store_true", help="do not run timers on their schedules")
    parser.add_argument(
        "--app",
        default="function_app",
        help="module whose FunctionApp is served (found as the worker finds it)",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s [dev-host] %(message)s", stream=sys.stdout)
    # host.json keeps Azure.Core at Warning; the SDKs' per-request INFO lines would drown ours.
    logging.getLogger("azure").setLevel(logging.WARNING)
    print(BANNER, flush=True)
    applied = apply_settings(read_settings(args.settings))
    log.info("settings: %d values from %s (environment variables win)", len(applied), args.settings)
    sys.path.insert(0, str(ROOT))
    module_name = args.app.partition(":")[0]
    try:
        devhost = DevHost.from_module(module_name, host_json=ROOT / "host.json")
    except indexing.IndexingFailed as exc:
        log.error("%s; the Functions host would serve none of them. Nothing is served.", exc)
        return 1
    if devhost.function_key is None:
        log.warning(
            "%s is not set: function-level HTTP functions are open (no key needed). "
            "Set it in local.settings.json to require x-functions-key / ?code=.",
            FUNCTION_KEY_SETTING,
        )
    server = devhost.make_server(args.host, args.port)
    base = f"http://{args.host}:{server.server_address[1]}"
    print("Functions:\n" + "\n".join(devhost.describe(base)), flush=True)
    if not args.no_timers:
        for name, schedule in devhost.start_timers().items():
            log.info(
                "timer %s: %s, next %s", name, schedule.expression, schedule.next_after(datetime.now(UTC))
            )
    receivers = devhost.start_receivers()
    for name, source in receivers.items():
        log.info("%s: receiving from %s", name, source.describe())
    for name in devhost.table.service_bus.keys() - receivers.keys():
        log.info(
            "%s: no Service Bus connection configured; feed it with POST /admin/functions/%s", name, name
        )

    def _stop(*_: object) -> None:
        threading.Thread(target=devhost.stop, daemon=True).start()

    import signal

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("listening on %s (Ctrl-C stops)", base)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.2)
    server.server_close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
