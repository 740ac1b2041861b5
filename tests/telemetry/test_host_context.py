"""One trace per request: every span Settle makes in an invocation is a child of the Functions host's
invocation context (``context.trace_context``), for HTTP, Service Bus and timers.

The worker runs a sync function in its thread pool, where the host's context is not current: without
reading ``context`` each invocation's spans started a trace of their own in Application Insights.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import azure.functions as func
import pytest

from devtools import host, indexing
from tests.support.handoff_flows import Flow
from tests.telemetry.conftest import HOST_SPAN, HOST_TRACE, Recorded, child_of_host, parent_of

pytestmark = pytest.mark.usefixtures("settle_tables")

HOST = host.InvocationContext("test", host.TraceContext(f"00-{HOST_TRACE}-{HOST_SPAN}-01"))
CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _key() -> dict[str, Any]:
    return {
        "tenantId": 7,
        "scopeId": 4,
        "entityId": 5,
        "itemEntityKey": "invoice",
        "itemKey": uuid.uuid4().hex,
    }


def test_an_http_function_s_spans_are_children_of_the_host_invocation_not_of_the_raw_header(
    otel: Recorded, functions: dict[str, Any]
) -> None:
    # Given a request whose traceparent the host already continued in its own invocation context
    req = func.HttpRequest(
        "POST",
        "http://localhost/api/v1/state/lock",
        headers={"traceparent": CALLER},
        body=json.dumps({"key": _key()}).encode(),
    )
    # When the worker invokes the function with that context
    answer = functions["state_lock"].get_user_function()(req, context=HOST)
    # Then the operation's span is a child of the host's invocation, in the host's trace
    assert answer.status_code == 200
    child_of_host(otel.span("settle.state.lock"))


def test_the_resolver_s_projection_is_a_child_of_the_host_invocation(
    otel: Recorded, functions: dict[str, Any], flow: Flow
) -> None:
    functions["resolver"].get_user_function()(flow.request(traceparent=CALLER), context=HOST)
    child_of_host(otel.span("settle.resolver.project"))


def test_a_timer_s_spans_are_children_of_the_host_invocation(
    otel: Recorded, functions: dict[str, Any]
) -> None:
    from azure.functions.timer import TimerRequest

    functions["handoff_sweeper"].get_user_function()(TimerRequest(past_due=False), context=HOST)
    child_of_host(otel.span("settle.sweeper.run"))


def test_without_a_host_context_the_request_s_own_traceparent_is_the_parent(
    otel: Recorded, functions: dict[str, Any]
) -> None:
    req = func.HttpRequest(
        "POST",
        "http://localhost/api/v1/state/lock",
        headers={"traceparent": CALLER},
        body=json.dumps({"key": _key()}).encode(),
    )
    functions["state_lock"].get_user_function()(req)
    span = otel.span("settle.state.lock")
    assert f"{span.context.trace_id:032x}" == CALLER.split("-")[1]
    assert f"{parent_of(span).span_id:016x}" == CALLER.split("-")[2]


def test_the_development_host_hands_the_caller_s_trace_over_as_the_deployed_host_does(otel: Recorded) -> None:
    # Given the development host serving the app (in this process)
    devhost = host.DevHost(host.build_function_table(indexing.index(), "api", environ={}), prefix="api")
    body = json.dumps({"key": _key()}).encode()
    # When a caller sends its traceparent
    answer = devhost.handle(
        "POST",
        "/api/v1/state/lock",
        {"traceparent": CALLER, "content-length": str(len(body))},
        body,
        "http://h",
    )
    assert answer.status == 200, answer.body
    # Then Settle's span is in the caller's trace, under the host's own invocation span (a new span id,
    # as the Functions host makes), never directly under the caller's span
    span = otel.span("settle.state.lock")
    assert f"{span.context.trace_id:032x}" == CALLER.split("-")[1]
    assert parent_of(span).is_remote
    assert f"{parent_of(span).span_id:016x}" != CALLER.split("-")[2]
