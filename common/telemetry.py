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

The code is in three modules, all reached through this one (callers import ``common.telemetry`` only):
``common.telemetry_core`` (on or off, metrics, the storage-retry counter, trace ids on log lines),
``common.telemetry_spans`` (spans and trace context) and ``common.telemetry_setup`` (the exporters).
"""

from __future__ import annotations

from common.telemetry_core import (
    INSTRUMENTATION_SCOPE,
    INSTRUMENTS,
    LOG_KEYS,
    MAX_ATTRIBUTE_CHARS,
    OUTCOME,
    ROUND_TRIP_ATTRIBUTE,
    STORAGE_RETRIES,
    Attributes,
    AttrValue,
    Instrument,
    Stopwatch,
    StorageRetries,
    add,
    enabled,
    gauge,
    record,
    reset,
    state_operation,
    use,
)
from common.telemetry_setup import (
    APP_INSIGHTS,
    APP_INSIGHTS_AUTH,
    METRICS_EXPORTER,
    OTEL_SERVICE_NAME,
    OTLP_ENDPOINT,
    OTLP_METRICS_ENDPOINT,
    OTLP_TRACES_ENDPOINT,
    SDK_DISABLED,
    SERVICE_NAME,
    SWITCH,
    TRACES_EXPORTER,
    Plan,
    credential_from_env,
    plan_from_env,
)
from common.telemetry_spans import (
    DIAGNOSTIC_ID,
    NO_SPAN,
    TRACEPARENT,
    TRACESTATE,
    SpanHandle,
    annotate,
    current,
    host_invocation_current,
    incoming,
    invocation,
    span,
    trace_properties,
)

__all__ = [
    "APP_INSIGHTS",
    "APP_INSIGHTS_AUTH",
    "DIAGNOSTIC_ID",
    "INSTRUMENTATION_SCOPE",
    "INSTRUMENTS",
    "LOG_KEYS",
    "MAX_ATTRIBUTE_CHARS",
    "METRICS_EXPORTER",
    "NO_SPAN",
    "OTEL_SERVICE_NAME",
    "OTLP_ENDPOINT",
    "OTLP_METRICS_ENDPOINT",
    "OTLP_TRACES_ENDPOINT",
    "OUTCOME",
    "ROUND_TRIP_ATTRIBUTE",
    "SDK_DISABLED",
    "SERVICE_NAME",
    "STORAGE_RETRIES",
    "SWITCH",
    "TRACEPARENT",
    "TRACESTATE",
    "TRACES_EXPORTER",
    "AttrValue",
    "Attributes",
    "Instrument",
    "Plan",
    "SpanHandle",
    "Stopwatch",
    "StorageRetries",
    "add",
    "annotate",
    "credential_from_env",
    "current",
    "enabled",
    "gauge",
    "host_invocation_current",
    "incoming",
    "invocation",
    "plan_from_env",
    "record",
    "reset",
    "span",
    "state_operation",
    "trace_properties",
    "use",
]
