"""Where telemetry goes, decided from the environment; and that it costs nothing when it goes nowhere.

The Application Insights path is checked in a fresh interpreter against a stand-in for the distro's
``configure_azure_monitor`` (the real one would reach Azure): what matters is what Settle passes to it.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

import pytest

from common import telemetry
from tests.support.probes import TELEMETRY_ENV, clean_env, run_probe
from tests.telemetry.conftest import Recorded, attrs

ROOT = Path(__file__).resolve().parents[2]


# A first invocation of each kind, as the worker makes it: index the app, a lock, a resolver message.
FIRST_INVOCATIONS = """
import json, sys, uuid
from datetime import datetime, timezone
import azure.functions as func
from azure.functions.servicebus import ServiceBusMessage
import function_app
from common import telemetry

functions = {str(f.get_function_name()): f for f in function_app.app.get_functions()}
key = {"tenantId": 1, "scopeId": 4, "entityId": 1, "itemEntityKey": "invoice", "itemKey": uuid.uuid4().hex}
request = func.HttpRequest("POST", "http://localhost/api/v1/state/lock", headers={}, params={},
                           route_params={}, body=json.dumps({"key": key}).encode())
assert functions["state_lock"].get_user_function()(request).status_code == 200
event_id = str(uuid.uuid4())
functions["resolver"].get_user_function()(ServiceBusMessage(
    body=b'{"EventContent": {"EventTypeId": "T", "EventJson": "{}"}}', message_id="m-" + event_id,
    session_id="s", enqueued_time_utc=datetime.now(timezone.utc), delivery_count=1, user_properties={},
    application_properties={"MessageType": "EventRequest", "EventId": event_id, "To": "Billing",
                            "EventTypeId": "T"}))
prefixes = ("opentelemetry", "azure.monitor", "azure.core.tracing.ext")
loaded = sorted(m for m in sys.modules if m.startswith(prefixes))
print("RESULT " + json.dumps({"enabled": telemetry.enabled(), "loaded": loaded}))
"""


def test_no_opentelemetry_module_is_imported_when_telemetry_is_off(azurite_connection: str):
    result = run_probe(FIRST_INVOCATIONS, clean_env(azurite_connection))
    assert result == {"enabled": False, "loaded": []}


def test_the_no_cost_check_sees_telemetry_when_it_is_on(azurite_connection: str):
    # The adversary of the test above: the same probe with console export loads the SDK.
    result = run_probe(FIRST_INVOCATIONS, clean_env(azurite_connection, OTEL_TRACES_EXPORTER="console"))
    assert result["enabled"] is True
    assert "opentelemetry.sdk.trace" in result["loaded"]
    assert "azure.core.tracing.ext.opentelemetry_span" in result["loaded"]  # storage calls become spans


def test_the_switch_turns_telemetry_off_whatever_else_is_set(azurite_connection: str):
    environ = clean_env(azurite_connection, OTEL_TRACES_EXPORTER="console", SETTLE_TELEMETRY="off")
    assert run_probe(FIRST_INVOCATIONS, environ) == {"enabled": False, "loaded": []}


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, (None, (), ())),
        ({"OTEL_TRACES_EXPORTER": "console"}, (None, ("console",), ())),
        (
            {"OTEL_TRACES_EXPORTER": "console, otlp", "OTEL_METRICS_EXPORTER": "none"},
            (None, ("console", "otlp"), ()),
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, (None, ("otlp",), ("otlp",))),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_METRICS_EXPORTER": "none"},
            (None, ("otlp",), ()),
        ),
        ({"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=x"}, ("InstrumentationKey=x", (), ())),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, (None, (), ())),
        ({"OTEL_TRACES_EXPORTER": "console", "SETTLE_TELEMETRY": "off"}, (None, (), ())),
    ],
)
def test_the_plan_follows_the_standard_variables(monkeypatch, variables, expected):
    for name in list(os.environ):
        if name.startswith(TELEMETRY_ENV):
            monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    plan = telemetry.plan_from_env()
    assert (plan.app_insights, plan.traces, plan.metrics) == expected
    assert plan.on is any(expected)


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        (
            "ClientId=11111111-2222-3333-4444-555555555555;Authorization=AAD",
            {"client_id": "11111111-2222-3333-4444-555555555555"},
        ),
        ("Authorization=AAD", {}),
        (None, None),
        ("Authorization=Key", None),
    ],
)
def test_the_entra_credential_is_the_identity_the_authentication_string_names(monkeypatch, auth, expected):
    import azure.identity

    monkeypatch.setattr(azure.identity, "ManagedIdentityCredential", lambda **kw: kw)
    if auth is None:
        monkeypatch.delenv("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", raising=False)
    else:
        monkeypatch.setenv("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", auth)
    assert telemetry.credential_from_env() == expected


def test_application_insights_gets_the_managed_identity_and_the_otel_exporters_too(azurite_connection: str):
    code = """
    import json, sys, types
    import azure.identity
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    class Credential:
        def __init__(self, client_id=None):
            self.client_id = client_id

    azure.identity.ManagedIdentityCredential = Credential
    seen = {}

    def configure_azure_monitor(**kwargs):  # stands for the distro: it sets the global providers
        seen.update(kwargs)
        provider = TracerProvider()
        for processor in kwargs.get("span_processors", []):
            provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=kwargs.get("metric_readers", [])))

    distro = types.SimpleNamespace(configure_azure_monitor=configure_azure_monitor)
    sys.modules["azure.monitor.opentelemetry"] = distro
    from common import telemetry
    enabled = telemetry.enabled()
    print("RESULT " + json.dumps({
        "enabled": enabled,
        "connection_string": seen["connection_string"],
        "client_id": seen["credential"].client_id,
        "logger_name": seen["logger_name"],
        "span_processors": [type(p).__name__ for p in seen["span_processors"]],
        "metric_readers": len(seen["metric_readers"]),
        "disabled": sorted(k for k, v in seen["instrumentation_options"].items() if not v["enabled"]),
    }))
    """
    environ = clean_env(
        azurite_connection,
        APPLICATIONINSIGHTS_CONNECTION_STRING="InstrumentationKey=00000000-0000-0000-0000-000000000000",
        APPLICATIONINSIGHTS_AUTHENTICATION_STRING="ClientId=client-of-the-uami;Authorization=AAD",
        OTEL_TRACES_EXPORTER="console",
    )
    assert run_probe(code, environ) == {
        "enabled": True,
        "connection_string": "InstrumentationKey=00000000-0000-0000-0000-000000000000",
        "client_id": "client-of-the-uami",
        "logger_name": "settle",
        "span_processors": ["SimpleSpanProcessor"],
        "metric_readers": 0,
        "disabled": ["requests", "urllib", "urllib3"],
    }


def test_a_broken_configuration_leaves_settle_running_without_telemetry(azurite_connection: str):
    environ = clean_env(azurite_connection, OTEL_TRACES_EXPORTER="zipkin")  # not shipped with Settle
    assert run_probe(FIRST_INVOCATIONS, environ)["enabled"] is False


def test_settle_s_log_lines_carry_the_trace_span_and_item_ids(otel: Recorded, caplog):
    caplog.set_level(logging.INFO)
    with telemetry.span("settle.test.op", {"settle.item_key": "INV-7", "nimbus.event_id": "ev-1"}) as span:
        logging.getLogger("settle.test").info("projected %s", "something")
    logging.getLogger("settle.test").info("outside any span")
    logging.getLogger("other.library").info("not Settle's")
    inside, outside, other = caplog.records
    recorded = otel.span("settle.test.op")
    trace_id, span_id = f"{recorded.context.trace_id:032x}", f"{recorded.context.span_id:016x}"
    ids = f"trace_id={trace_id} span_id={span_id} settle.item_key=INV-7 nimbus.event_id=ev-1"
    assert inside.getMessage() == f"projected something [{ids}]"
    assert vars(inside)["trace_id"] == trace_id and vars(inside)["settle.item_key"] == "INV-7"
    assert outside.getMessage() == "outside any span"
    assert other.getMessage() == "not Settle's"
    assert span.recording


SECRET_DATA = "s3cr3t-payload-" + uuid.uuid4().hex


def test_no_payload_token_or_error_text_reaches_a_span_an_event_or_a_log_line(
    otel: Recorded, call, caplog, resolve, flow
):
    caplog.set_level(logging.DEBUG)
    key = {
        "tenantId": 1,
        "scopeId": 4,
        "entityId": 5,
        "itemEntityKey": "invoice",
        "itemKey": "INV-" + uuid.uuid4().hex,
    }
    token = call("state_lock", {"key": key}).json["lockToken"]
    body = {"key": key, "status": "Processed", "data": {"secret": SECRET_DATA}, "lockToken": token}
    assert call("state_set", body).status == 200
    assert call("state_set", {**body, "data": {"other": SECRET_DATA}, "lockToken": token}).status == 409
    assert (
        call("state_set", {"key": key, "status": SECRET_DATA}).status == 400
    )  # echoed by pydantic's message
    resolve(flow.request(event_json=json.dumps({"secret": SECRET_DATA})))

    recorded = []
    for span in otel.spans():
        recorded += [str(v) for v in attrs(span).values()]
        recorded += [str(v) for event in span.events for v in (event.attributes or {}).values()]
        recorded.append(span.status.description or "")
    recorded += [r.getMessage() for r in caplog.records]
    assert recorded and not [text for text in recorded if SECRET_DATA in text or token in text]


def test_no_settlement_result_or_error_text_reaches_a_span_an_event_or_a_log_line(
    otel: Recorded, call, caplog, resolve, fresh_tables
):
    from handoff import service
    from tests.handoff.conftest import CaptureTransport
    from tests.support.handoff_flows import Flow, complete, fail, parked

    transport = CaptureTransport()
    service.use_transport(transport)
    try:
        caplog.set_level(logging.DEBUG)
        done, failed = (
            Flow(endpoint="Billing-" + uuid.uuid4().hex[:8], event_id=str(uuid.uuid4())) for _ in "ab"
        )
        parked(resolve, done)
        parked(resolve, failed)
        assert complete(call, done, result={"secret": SECRET_DATA}).status == 202
        assert fail(call, failed, errorText="rejected: " + SECRET_DATA).status == 202
        assert len(transport.sent) == 2
        from handoff.messages.transport import message_body

        # The secret did go through: it is in both control messages, and nowhere else.
        assert all(SECRET_DATA in message_body(m).decode() for _, m in transport.sent)
    finally:
        service.reset()

    recorded = []
    for span in otel.spans():
        recorded += [str(v) for v in attrs(span).values()]
        recorded += [str(v) for event in span.events for v in (event.attributes or {}).values()]
        recorded.append(span.status.description or "")
    recorded += [r.getMessage() for r in caplog.records]
    assert otel.spans("settle.handoff.complete") and otel.spans("settle.handoff.fail")
    assert recorded and not [text for text in recorded if SECRET_DATA in text]
