"""Settle's spans: one per decision, continuing the trace of the request or message that caused it.

``common.telemetry`` is the interface (its docstring says when telemetry is on and what is never
recorded). ``opentelemetry`` is imported only inside functions that run once telemetry is on (cold start:
a span while it is off is a shared no-op handle).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from common.roundtrips import ROUND_TRIPS
from common.telemetry_core import (
    MAX_ATTRIBUTE_CHARS,
    OUTCOME,
    ROUND_TRIP_ATTRIBUTE,
    Attributes,
    AttrValue,
    active,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link


# W3C trace context, as azure-servicebus writes it on the messages it sends (``Diagnostic-Id`` holds the
# same ``traceparent`` value for consumers that only know the older property).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
DIAGNOSTIC_ID = "Diagnostic-Id"


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
    state = active()
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
    if active() is None:
        return NO_SPAN
    from opentelemetry import trace

    otel_span = trace.get_current_span()
    return _Span(otel_span) if otel_span.is_recording() else NO_SPAN


def annotate(attributes: Attributes) -> None:
    """Attributes on the current span (nothing when off)."""
    if active() is not None:
        current().update(attributes)


@contextmanager
def incoming(carrier: Mapping[str, Any] | None) -> Iterator[None]:
    """Make ``carrier``'s trace context current for the block when nothing is (an HTTP request)."""
    if active() is None or not carrier:
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
    if active() is None or not parent:
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
    if active() is None:
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
