"""Telemetry on, recording into the OpenTelemetry SDK's in-memory exporter and metric reader.

The Azure SDK's storage spans go to the *global* tracer provider, which can be set once per process: it
is set once here, with a span exporter every test starts with empty. Metrics get a fresh meter provider
(and reader) per test, so each test reads only its own values.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common import telemetry

_EXPORTER = InMemorySpanExporter()
_PROVIDER: TracerProvider | None = None


def _tracer_provider() -> TracerProvider:
    global _PROVIDER
    if _PROVIDER is None:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):  # set by an earlier module of this process
            _PROVIDER = current
        else:
            _PROVIDER = TracerProvider()
            trace.set_tracer_provider(_PROVIDER)
        _PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return _PROVIDER


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_of(span: ReadableSpan) -> Any:
    assert span.parent is not None, f"{span.name} has no parent"
    return span.parent


# The invocation context a host hands the worker in the tests that check Settle's spans continue it.
HOST_TRACE = "0af7651916cd43dd8448eb211c80319c"
HOST_SPAN = "b7ad6b7169203331"


def child_of_host(span: ReadableSpan) -> None:
    """``span`` is in the host's trace, a direct child of the host's invocation span."""
    assert f"{span.context.trace_id:032x}" == HOST_TRACE, span.name
    assert f"{parent_of(span).span_id:016x}" == HOST_SPAN, span.name


@dataclass
class Recorded:
    """What telemetry recorded during one test."""

    reader: InMemoryMetricReader

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = list(_EXPORTER.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        [only] = self.spans(name)
        return only

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        parent_id = parent.context.span_id
        return [s for s in self.spans() if s.parent is not None and s.parent.span_id == parent_id]

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, data point) of metric ``name`` as the reader collects it now."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found += [(dict(p.attributes or {}), p) for p in metric.data.data_points]
        return found

    def value(self, name: str, **attributes: Any) -> float:
        """Sum (counter), count (histogram) or value (gauge) over points whose attributes include these."""
        total = 0.0
        for attrs, point in self.points(name):
            if all(attrs.get(k) == v for k, v in attributes.items()):
                total += point.count if hasattr(point, "bucket_counts") else point.value
        return total


@pytest.fixture
def otel() -> Iterator[Recorded]:
    provider = _tracer_provider()
    reader = InMemoryMetricReader()
    _EXPORTER.clear()
    telemetry.use(tracer_provider=provider, meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        yield Recorded(reader)
    finally:
        telemetry.reset()
        _EXPORTER.clear()


# The hand-off suites' fixtures (a fresh flow, the resolver function as the host calls it).
from tests.handoff.conftest import flow, resolve  # noqa: E402, F401
