"""Telemetry's process state and its cheap signals: whether it is on (decided once per process), the
instruments and the metric calls, the storage-retry counter, and trace ids on Settle's log lines.

``common.telemetry`` is the interface (its docstring says when telemetry is on and what is never
recorded); spans are in ``common.telemetry_spans``, the exporters in ``common.telemetry_setup``.
``opentelemetry`` is imported only inside functions that run once telemetry is on (cold start: off is free).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from azure.core.pipeline.policies import SansIOHTTPPolicy

from common.telemetry_setup import install_exporters, plan_from_env

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Tracer, TracerProvider

log = logging.getLogger("settle.telemetry")

AttrValue = str | bool | int | float
Attributes = Mapping[str, AttrValue | None]

INSTRUMENTATION_SCOPE = "settle"

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


def active() -> _Telemetry | None:
    """The recording state, or None while telemetry is off (decides from the environment on first call)."""
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
    return active() is not None


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


def _from_env() -> _Telemetry | None:
    plan = plan_from_env()
    if not plan.on:
        return None
    tracer_provider, meter_provider = install_exporters(plan)
    return _enable(tracer_provider, meter_provider)


# -- metrics --------------------------------------------------------------------------------------


def add(name: str, value: int = 1, **attributes: AttrValue | None) -> None:
    """Add to counter ``name`` (one of :data:`INSTRUMENTS`)."""
    state = active()
    if state is not None:
        state.instrument(name).add(value, _clean(attributes))


def record(name: str, value: float, **attributes: AttrValue | None) -> None:
    """Record one value of histogram ``name``."""
    state = active()
    if state is not None:
        state.instrument(name).record(value, _clean(attributes))


def gauge(name: str, value: float, **attributes: AttrValue | None) -> None:
    """Set gauge ``name`` for these attributes."""
    state = active()
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
        if active() is None:
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
            if record.name.startswith("settle") and active() is not None:
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
