"""Settle's OpenTelemetry signals: one span per decision, a few metrics, trace ids on log lines.

Off, and free, unless configured. Whether it is on is decided once per process, on first use (never at
import), from the environment:

* ``APPLICATIONINSIGHTS_CONNECTION_STRING``: the Azure Monitor OpenTelemetry distro exports traces,
  metrics and Settle's logs to Application Insights, authenticated with Entra ID: the managed identity
  named by ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` (``ClientId=<id>;Authorization=AAD``, what
  ``infra/`` sets; the component accepts no key).
* ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` (``console``, ``otlp``, ``none``; a list is
  allowed) or ``OTEL_EXPORTER_OTLP_ENDPOINT``: the OpenTelemetry SDK with those exporters (OTLP over
  HTTP/protobuf, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables). Together with the
  connection string, both receive the data (as the Functions host does with both configured).
* Neither, or ``SETTLE_TELEMETRY=off``, or ``OTEL_SDK_DISABLED=true``: nothing. No ``opentelemetry``
  module is imported and every function here returns at once (``tests/telemetry/test_export.py``).

Unlike the SDK's own default (``otlp``), an unset ``OTEL_TRACES_EXPORTER`` exports nothing: telemetry is
opt-in, so an app without a destination pays nothing for it.

What is recorded never includes a payload, a token or a secret: spans carry ids (tenant, scope, entity,
item keys, NimBus event/message/session ids), outcomes, statuses and counts; a failure is recorded by its
exception type and problem slug, never its message (a validation message may quote the input).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from azure.core.pipeline.policies import SansIOHTTPPolicy

from common.roundtrips import ROUND_TRIPS
from common.settings import env, env_flag

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Link, Tracer, TracerProvider

log = logging.getLogger("settle.telemetry")

AttrValue = str | bool | int | float
Attributes = Mapping[str, AttrValue | None]

SWITCH = "SETTLE_TELEMETRY"
APP_INSIGHTS = "APPLICATIONINSIGHTS_CONNECTION_STRING"
APP_INSIGHTS_AUTH = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
SERVICE_NAME = "settle"
INSTRUMENTATION_SCOPE = "settle"

# W3C trace context, as azure-servicebus writes it on the messages it sends (``Diagnostic-Id`` holds the
# same ``traceparent`` value for consumers that only know the older property).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
DIAGNOSTIC_ID = "Diagnostic-Id"

OUTCOME = "settle.outcome"
ROUND_TRIP_ATTRIBUTE = "settle.storage.round_trips"
MAX_ATTRIBUTE_CHARS = 256

# Span attributes copied onto Settle's log lines (ids that find one item; never a payload).
LOG_KEYS = (
    "settle.tenant_id",
    "settle.scope",
    "settle.entity_id",
    "settle.entity_execution_id",
    "settle.item_entity_key",
    "settle.item_key",
    "nimbus.endpoint",
    "nimbus.event_id",
    "nimbus.message_id",
    "nimbus.session_id",
    OUTCOME,
)

# Seconds; storage operations take milliseconds, a throttled one several seconds.
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Instrument(NamedTuple):
    kind: str  # counter, histogram or gauge
    unit: str
    description: str


# Every metric Settle records (docs/observability.md explains each).
INSTRUMENTS: dict[str, Instrument] = {
    "settle.state.locks": Instrument(
        "counter", "{lock}", "Lock requests by outcome: acquired, takeover, replayed, refused."
    ),
    "settle.state.operations": Instrument("counter", "{operation}", "State operations by op and outcome."),
    "settle.state.duration": Instrument("histogram", "s", "Duration of state operations by op and outcome."),
    "settle.catchup.expired_locks": Instrument(
        "counter", "{lock}", "Expired locks catch-up turned Failed (their holder never recorded an outcome)."
    ),
    "settle.resolver.messages": Instrument(
        "counter", "{message}", "Resolver messages by message type and outcome (applied, poison, ...)."
    ),
    "settle.handoff.settlements": Instrument(
        "counter", "{settlement}", "Settlement requests by kind (complete, fail) and outcome."
    ),
    "settle.reconciler.claims": Instrument(
        "counter", "{claim}", "Open settlement claims the reconciler followed up, by what happened."
    ),
    "settle.handoff.parked": Instrument(
        "gauge", "{hand-off}", "Parked hand-offs per endpoint, counted on each sweeper tick."
    ),
    "settle.handoff.overdue": Instrument(
        "gauge", "{hand-off}", "Parked hand-offs past their ExpectedBy per endpoint, on each sweeper tick."
    ),
    "settle.operator.actions": Instrument(
        "counter", "{action}", "Operator actions (resubmit, skip, complete, fail, replay) by outcome."
    ),
    "settle.storage.retries": Instrument(
        "counter", "{request}", "Table Storage requests the SDK sent again (throttling, timeouts, 5xx)."
    ),
}


# -- the handle a ``span`` block gets --------------------------------------------------------------


class SpanHandle:
    """What instrumented code may do with the current Settle span (a no-op when telemetry is off)."""

    recording = False

    @property
    def outcome(self) -> str | None:
        """The outcome set so far on this span (by anyone), if any."""
        return None

    def set(self, key: str, value: AttrValue | None) -> None:
        """One attribute (``None`` is skipped; long text is cut)."""

    def update(self, attributes: Attributes) -> None:
        for key, value in attributes.items():
            self.set(key, value)

    def set_outcome(self, outcome: str) -> None:
        self.set(OUTCOME, outcome)

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        """A point-in-time event on the span (e.g. one lock catch-up expired)."""

    def failed(self, error: BaseException, *, slug: str | None = None) -> None:
        """Mark the span failed: its exception type and problem slug, never the message."""


class _NoSpan(SpanHandle):
    """Shared by every caller while telemetry is off: it keeps nothing."""


class _Span(SpanHandle):
    recording = True

    def __init__(self, span: Any) -> None:
        self._span = span

    @property
    def outcome(self) -> str | None:
        value = (getattr(self._span, "attributes", None) or {}).get(OUTCOME)
        return None if value is None else str(value)

    def set(self, key: str, value: AttrValue | None) -> None:
        if value is None:
            return
        if isinstance(value, str) and len(value) > MAX_ATTRIBUTE_CHARS:
            value = value[:MAX_ATTRIBUTE_CHARS]
        self._span.set_attribute(key, value)

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        clean = {k: v for k, v in (attributes or {}).items() if v is not None}
        self._span.add_event(name, clean)

    def failed(self, error: BaseException, *, slug: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.set("error.type", type(error).__name__)
        self.set_outcome(slug or "error")
        self._span.set_status(Status(StatusCode.ERROR, slug or type(error).__name__))


NO_SPAN: SpanHandle = _NoSpan()


# -- process state ---------------------------------------------------------------------------------


class _Telemetry:
    """The providers Settle records into, and its instruments (created on first use)."""

    def __init__(self, tracer: Tracer, meter_provider: MeterProvider, *, owns_azure_tracing: bool) -> None:
        self.tracer = tracer
        self.meter_provider = meter_provider
        self.owns_azure_tracing = owns_azure_tracing
        self.instruments: dict[str, Any] = {}
        self.lock = threading.Lock()

    def instrument(self, name: str) -> Any:
        found = self.instruments.get(name)
        if found is not None:
            return found
        spec = INSTRUMENTS[name]
        with self.lock:
            found = self.instruments.get(name)
            if found is None:
                meter = self.meter_provider.get_meter(INSTRUMENTATION_SCOPE)
                if spec.kind == "counter":
                    found = meter.create_counter(name, unit=spec.unit, description=spec.description)
                elif spec.kind == "histogram":
                    found = meter.create_histogram(
                        name,
                        unit=spec.unit,
                        description=spec.description,
                        explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
                    )
                else:
                    found = meter.create_gauge(name, unit=spec.unit, description=spec.description)
                self.instruments[name] = found
        return found


_UNDECIDED: Any = object()
_state: _Telemetry | Any | None = _UNDECIDED
_decide_lock = threading.Lock()


def _active() -> _Telemetry | None:
    global _state
    if _state is _UNDECIDED:
        with _decide_lock:
            if _state is _UNDECIDED:
                try:
                    _state = _from_env()
                except Exception:
                    # Telemetry must never take the app down: say why and run without it.
                    log.exception("telemetry could not be configured; Settle runs without it")
                    _state = None
    return _state


def enabled() -> bool:
    """Whether spans and metrics are being recorded (decides from the environment on first call)."""
    return _active() is not None


def use(*, tracer_provider: TracerProvider, meter_provider: MeterProvider) -> None:
    """Record into these providers from now on (tests: in-memory exporters; also turns on the Azure SDK's
    storage spans, which go to the *global* tracer provider)."""
    global _state
    with _decide_lock:
        _state = _enable(tracer_provider, meter_provider)


def reset() -> None:
    """Forget the decision (the next use decides again from the environment); stops storage spans."""
    global _state
    with _decide_lock:
        if isinstance(_state, _Telemetry) and _state.owns_azure_tracing:
            from azure.core.settings import settings

            settings.tracing_implementation = None
        _state = _UNDECIDED


def _enable(tracer_provider: TracerProvider, meter_provider: MeterProvider) -> _Telemetry:
    from azure.core.settings import settings

    owns = False
    if settings.tracing_implementation() is None:
        # Table calls become child spans (azure-core's OpenTelemetry plugin; the distro does the same).
        from azure.core.tracing.ext.opentelemetry_span import OpenTelemetrySpan

        settings.tracing_implementation = OpenTelemetrySpan
        owns = True
    _install_log_correlation()
    return _Telemetry(
        tracer=tracer_provider.get_tracer(INSTRUMENTATION_SCOPE),
        meter_provider=meter_provider,
        owns_azure_tracing=owns,
    )


# -- configuration from the environment -------------------------------------------------------------


def _exporters(raw: str | None) -> list[str]:
    return [part.strip().lower() for part in (raw or "").split(",") if part.strip()]


class Plan(NamedTuple):
    """What the environment asks for (pure: decided without importing anything)."""

    app_insights: str | None
    traces: tuple[str, ...]
    metrics: tuple[str, ...]

    @property
    def on(self) -> bool:
        return bool(self.app_insights or self.traces or self.metrics)


def plan_from_env() -> Plan:
    """Read the switches; an OTLP endpoint alone means OTLP (the SDK's default exporter)."""
    if (env(SWITCH) or "").strip().lower() in {"off", "false", "0", "no"} or env_flag(SDK_DISABLED):
        return Plan(None, (), ())
    otlp = bool(env(OTLP_ENDPOINT) or env(OTLP_TRACES_ENDPOINT) or env(OTLP_METRICS_ENDPOINT))
    traces = _exporters(env(TRACES_EXPORTER)) or (["otlp"] if otlp else [])
    metrics = _exporters(env(METRICS_EXPORTER)) or (["otlp"] if otlp else [])
    return Plan(
        app_insights=env(APP_INSIGHTS),
        traces=tuple(e for e in traces if e != "none"),
        metrics=tuple(e for e in metrics if e != "none"),
    )


def credential_from_env() -> Any:
    """The Entra ID credential ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` names, or None (key auth).

    ``Authorization=AAD`` alone: the system-assigned identity; with ``ClientId=<id>``: that user-assigned
    identity (Settle's, as ``infra/`` configures it).
    """
    raw = env(APP_INSIGHTS_AUTH)
    if not raw:
        return None
    parts = dict(p.split("=", 1) for p in raw.split(";") if "=" in p)
    fields = {k.strip().lower(): v.strip() for k, v in parts.items()}
    if fields.get("authorization", "").upper() != "AAD":
        log.warning(
            "%s is set but does not say Authorization=AAD; sending without Entra ID", APP_INSIGHTS_AUTH
        )
        return None
    from azure.identity import ManagedIdentityCredential

    client_id = fields.get("clientid") or None
    return ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()


def _from_env() -> _Telemetry | None:
    plan = plan_from_env()
    if not plan.on:
        return None
    from opentelemetry import metrics, trace

    span_processors = [_span_processor(name) for name in plan.traces]
    metric_readers = [_metric_reader(name) for name in plan.metrics]
    if plan.app_insights:
        _configure_azure_monitor(plan.app_insights, span_processors, metric_readers)
    else:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        resource = _resource()
        tracer_provider = TracerProvider(resource=resource)
        for processor in span_processors:
            tracer_provider.add_span_processor(processor)
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=metric_readers))
    log.info(
        "telemetry on: %s",
        ", ".join(
            (["Application Insights"] if plan.app_insights else [])
            + [f"traces={','.join(plan.traces)}"] * bool(plan.traces)
            + [f"metrics={','.join(plan.metrics)}"] * bool(plan.metrics)
        ),
    )
    return _enable(trace.get_tracer_provider(), metrics.get_meter_provider())


def _resource() -> Any:
    from opentelemetry.sdk.resources import Resource

    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win when set (Resource.create reads them).
    return Resource.create({} if env(OTEL_SERVICE_NAME) else {"service.name": SERVICE_NAME})


def _span_processor(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

        return SimpleSpanProcessor(ConsoleSpanExporter())  # printed as each span ends (make run)
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        return BatchSpanProcessor(OTLPSpanExporter())
    raise ValueError(f"{TRACES_EXPORTER}: Settle supports console, otlp and none; got {name!r}")


def _metric_reader(name: str) -> Any:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return PeriodicExportingMetricReader(OTLPMetricExporter())
    raise ValueError(f"{METRICS_EXPORTER}: Settle supports console, otlp and none; got {name!r}")


def _configure_azure_monitor(connection_string: str, span_processors: list[Any], readers: list[Any]) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        # The worker configured the distro already (PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY): record
        # into it rather than configure a second pipeline.
        log.info("telemetry: using the OpenTelemetry pipeline the worker configured")
        return
    from azure.monitor.opentelemetry import configure_azure_monitor

    credential = credential_from_env()
    if credential is None:
        log.warning(
            "%s is not set: Application Insights rejects telemetry when local auth is disabled",
            APP_INSIGHTS_AUTH,
        )
    configure_azure_monitor(
        connection_string=connection_string,
        credential=credential,
        logger_name="settle",  # Settle's own log lines, with their span's ids
        span_processors=span_processors,
        metric_readers=readers,
        # Table calls are already spans through the Azure SDK plugin; their HTTP requests would repeat them.
        instrumentation_options={
            "requests": {"enabled": False},
            "urllib": {"enabled": False},
            "urllib3": {"enabled": False},
        },
    )


# -- spans ----------------------------------------------------------------------------------------


def _extract(carrier: Mapping[str, Any] | None) -> Context | None:
    """The remote context of a W3C ``traceparent`` (else ``Diagnostic-Id``) in ``carrier``, if valid."""
    if not carrier:
        return None
    parent = _text(carrier.get(TRACEPARENT)) or _text(carrier.get(DIAGNOSTIC_ID))
    if not parent:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    fields = {TRACEPARENT: parent}
    state = _text(carrier.get(TRACESTATE))
    if state:
        fields[TRACESTATE] = state
    try:  # a malformed header from the wire is no parent, never an error
        context = TraceContextTextMapPropagator().extract(fields)
        return context if trace.get_current_span(context).get_span_context().is_valid else None
    except Exception:
        return None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    return value.strip() if isinstance(value, str) and value.strip() else None


def _links(carriers: Sequence[Mapping[str, Any] | None]) -> list[Link]:
    from opentelemetry import trace
    from opentelemetry.trace import Link

    links = []
    for carrier in carriers:
        context = _extract(carrier)
        if context is not None:
            links.append(Link(trace.get_current_span(context).get_span_context()))
    return links


@contextmanager
def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    carrier: Mapping[str, Any] | None = None,
    continue_carrier: bool = False,
    links: Sequence[Mapping[str, Any] | None] = (),
) -> Iterator[SpanHandle]:
    """A Settle span around the block (current while it runs), or a no-op handle when telemetry is off.

    ``carrier`` holds W3C trace context (HTTP headers, message properties). By default it is the parent
    only when nothing is current (the Functions worker attaches the host's invocation when it can);
    ``continue_carrier``: it is the parent whenever it is valid (the resolver continues the trace of the
    message it projects), and the current span, if any, becomes a link. ``links``: more carriers to link.
    The span records the storage round trips made inside it (``settle.storage.round_trips``).
    """
    state = _active()
    if state is None:
        yield NO_SPAN
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    remote = _extract(carrier)
    parent = None
    link_carriers = list(links)
    if remote is not None and (continue_carrier or not current.get_span_context().is_valid):
        parent = remote
        if continue_carrier and current.get_span_context().is_valid:
            link_carriers.append({TRACEPARENT: _traceparent(current.get_span_context())})
    with (
        state.tracer.start_as_current_span(
            name,
            context=parent,
            links=_links(link_carriers),
            record_exception=False,  # its message may quote input: see failed()
            set_status_on_exception=False,
        ) as otel_span,
        ROUND_TRIPS.measure() as tally,
    ):
        handle = _Span(otel_span)
        handle.update(attributes or {})
        try:
            yield handle
        except BaseException as exc:
            if handle.outcome is None:
                handle.failed(exc)
            raise
        finally:
            handle.set(ROUND_TRIP_ATTRIBUTE, tally.requests)


def current() -> SpanHandle:
    """The current Settle span, to annotate it from deeper code (a no-op handle when off)."""
    if _active() is None:
        return NO_SPAN
    from opentelemetry import trace

    otel_span = trace.get_current_span()
    return _Span(otel_span) if otel_span.is_recording() else NO_SPAN


def annotate(attributes: Attributes) -> None:
    """Attributes on the current span (nothing when off)."""
    if _active() is not None:
        current().update(attributes)


@contextmanager
def incoming(carrier: Mapping[str, Any] | None) -> Iterator[None]:
    """Make ``carrier``'s trace context current for the block when nothing is (an HTTP request)."""
    if _active() is None or not carrier:
        yield
        return
    from opentelemetry import context as context_api
    from opentelemetry import trace

    remote = None if trace.get_current_span().get_span_context().is_valid else _extract(carrier)
    if remote is None:
        yield
        return
    token = context_api.attach(remote)
    try:
        yield
    finally:
        context_api.detach(token)


# Set while the Functions host's invocation context is current (see ``invocation``): the host already made
# that context a child of the caller's (an HTTP traceparent, a message's Diagnostic-Id), so it wins.
_FROM_HOST: contextvars.ContextVar[bool] = contextvars.ContextVar("settle_host_invocation", default=False)


def host_invocation_current() -> bool:
    """Whether the block runs inside the host's invocation context (``invocation``)."""
    return _FROM_HOST.get()


@contextmanager
def invocation(context: Any) -> Iterator[None]:
    """Make the Functions host's invocation context current for the block.

    The worker hands each invocation the host's W3C context in ``context.trace_context``, but runs a sync
    function in its thread pool where that context is not current, so without this every span Settle
    makes would start a trace of its own. ``context`` may be None (a direct call in a test): nothing
    changes, and a request's own ``traceparent`` is used as before (``incoming``).
    """
    trace_context = getattr(context, "trace_context", None)
    parent = _text(getattr(trace_context, "trace_parent", None))
    if _active() is None or not parent:
        yield
        return
    remote = _extract({TRACEPARENT: parent, TRACESTATE: _text(getattr(trace_context, "trace_state", None))})
    if remote is None:
        yield
        return
    from opentelemetry import context as context_api

    token = context_api.attach(remote)
    flag = _FROM_HOST.set(True)
    try:
        yield
    finally:
        _FROM_HOST.reset(flag)
        context_api.detach(token)


def _traceparent(span_context: Any) -> str:
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{int(span_context.trace_flags):02x}"


def trace_properties() -> dict[str, str]:
    """``traceparent`` and ``Diagnostic-Id`` (+ ``tracestate``) of the current span, for a message Settle
    sends; empty when telemetry is off or nothing is current."""
    if _active() is None:
        return {}
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    props: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(props)
    if TRACEPARENT in props:
        props[DIAGNOSTIC_ID] = props[TRACEPARENT]
    return props


# -- metrics --------------------------------------------------------------------------------------


def add(name: str, value: int = 1, **attributes: AttrValue | None) -> None:
    """Add to counter ``name`` (one of :data:`INSTRUMENTS`)."""
    state = _active()
    if state is not None:
        state.instrument(name).add(value, _clean(attributes))


def record(name: str, value: float, **attributes: AttrValue | None) -> None:
    """Record one value of histogram ``name``."""
    state = _active()
    if state is not None:
        state.instrument(name).record(value, _clean(attributes))


def gauge(name: str, value: float, **attributes: AttrValue | None) -> None:
    """Set gauge ``name`` for these attributes."""
    state = _active()
    if state is not None:
        state.instrument(name).set(value, _clean(attributes))


def _clean(attributes: Mapping[str, AttrValue | None]) -> dict[str, AttrValue]:
    return {k: v for k, v in attributes.items() if v is not None}


def state_operation(op: str, outcome: str, seconds: float) -> None:
    """``settle.state.operations`` and ``settle.state.duration`` for one state operation."""
    add("settle.state.operations", op=op, outcome=outcome)
    record("settle.state.duration", seconds, op=op, outcome=outcome)


class Stopwatch:
    """Seconds since it was made (for durations recorded with the outcome known only at the end)."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._start


# -- storage retries ------------------------------------------------------------------------------

_ATTEMPTED = "settle_telemetry_attempted"


class StorageRetries(SansIOHTTPPolicy[Any, Any]):
    """Counts requests the Table SDK sends again (it runs once per attempt, right after the retry policy)."""

    def on_request(self, request: Any) -> None:
        if _active() is None:
            return
        if request.context.get(_ATTEMPTED):
            add("settle.storage.retries", method=request.http_request.method)
        else:
            request.context[_ATTEMPTED] = True


STORAGE_RETRIES = StorageRetries()


# -- logs -----------------------------------------------------------------------------------------

_log_lock = threading.Lock()
_log_installed = False


def _install_log_correlation() -> None:
    """Settle's log records get ``trace_id``/``span_id`` and the span's item ids, in attributes and text."""
    global _log_installed
    with _log_lock:
        if _log_installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if record.name.startswith("settle") and _active() is not None:
                _correlate(record)
            return record

        logging.setLogRecordFactory(factory)
        _log_installed = True


def _correlate(record: logging.LogRecord) -> None:
    from opentelemetry import trace

    otel_span = trace.get_current_span()
    span_context = otel_span.get_span_context()
    if not span_context.is_valid:
        return
    ids: dict[str, Any] = {
        "trace_id": f"{span_context.trace_id:032x}",
        "span_id": f"{span_context.span_id:016x}",
    }
    attributes = getattr(otel_span, "attributes", None) or {}
    ids.update({key: attributes[key] for key in LOG_KEYS if key in attributes})
    for key, value in ids.items():
        setattr(record, key, value)
    if isinstance(record.msg, str):
        suffix = " [" + " ".join(f"{k}={v}" for k, v in ids.items()) + "]"
        record.msg += suffix.replace("%", "%%") if record.args else suffix
