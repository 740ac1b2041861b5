"""Telemetry's configuration from the environment: which exporters the switches ask for, and the
OpenTelemetry pipeline (the Azure Monitor distro, or the SDK with console/OTLP exporters) they build.

``common.telemetry`` is the interface (its docstring lists the switches); this module decides nothing about
whether telemetry is on for the process (``common.telemetry_core`` does, once). Every ``opentelemetry`` and
exporter import here is function-local: an app with telemetry off never imports them (cold start).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from common.settings import env, env_flag

log = logging.getLogger("settle.telemetry")

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


def install_exporters(plan: Plan) -> tuple[Any, Any]:
    """Build the pipeline ``plan`` asks for (it is on) and return the global (tracer, meter) providers."""
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
    return trace.get_tracer_provider(), metrics.get_meter_provider()


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
