"""Settle through the pinned Python runtime's own code, with the host's wire messages.

Given ``azure_functions_runtime`` (the version ``requirements.txt`` pins, the one Azure runs the app on)
initialised, indexing ``function_app.py`` and loading every function as the host asks it to, when the
host's ``InvocationRequest`` messages arrive (HTTP as ``RpcHttp``, Service Bus with the extension's trigger
metadata, timers as the host's JSON, each with the host's ``trace_context``), then the app answers as the
in-process and development-host suites say it does: statuses and bodies, the resolver's projection in
storage, and every span in the host's trace.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from devtools import indexing
from devtools.routing import decode_path
from devtools.worker import Worker
from handoff.messages.contract import MessageType
from tests.support.handoff_flows import Flow
from tests.telemetry.conftest import HOST_SPAN, HOST_TRACE, Recorded, child_of_host

pytestmark = pytest.mark.usefixtures("settle_tables")

BINDINGS = Path(__file__).with_name("host_bindings.json")
HOST = f"00-{HOST_TRACE}-{HOST_SPAN}-01"
# Ids as other systems write them: every reserved character a path can carry once decoded.
AWKWARD = ["JOB 2026", "100%", "100%25", "a+b", "why?", "hash#1", "été-€", "a%2Fb"]


def _key() -> dict[str, Any]:
    return {
        "tenantId": 7,
        "scopeId": 4,
        "entityId": 5,
        "itemEntityKey": "invoice",
        "itemKey": uuid.uuid4().hex,
    }


def _segment(value: str) -> str:
    """A path segment as a client escapes it (every reserved character, ``/`` included)."""
    from urllib.parse import quote

    return quote(value, safe="")


# -- start-up ---------------------------------------------------------------------------------------------


def test_the_runtime_indexes_and_loads_every_function_the_host_is_told_of(worker: Worker) -> None:
    indexed = {f.name: f for f in indexing.index()}
    assert set(worker.metadata) == set(indexed)
    assert set(worker.metadata) == set(json.loads(BINDINGS.read_text(encoding="utf-8")))
    for name, metadata in worker.metadata.items():
        # What the host reads off the wire is what the development host and the tests build from.
        assert [json.loads(raw) for raw in metadata.raw_bindings] == list(indexed[name].bindings), name
        assert metadata.properties["worker_indexed"] == "True"
        assert metadata.language == "python"


# -- HTTP -----------------------------------------------------------------------------------------------


def _sample_target(template: str) -> str:
    def value(match: re.Match[str]) -> str:
        spec = match.group(1)
        if ":int" in spec or ":long" in spec:
            return "1"
        if ":guid" in spec:
            return str(uuid.uuid4())
        return "state" if spec.startswith("family") else "x1"

    return "/api/" + re.sub(r"\{([^}]*)\}", value, template)


def test_every_http_function_answers_through_the_runtime_without_a_server_error(worker: Worker) -> None:
    http = {n: worker.trigger(n) for n in worker.metadata if worker.trigger(n)["type"] == "httpTrigger"}
    assert len(http) > 30
    failures = []
    for name, trigger in sorted(http.items()):
        method = str((trigger.get("methods") or ["GET"])[0]).upper()
        body = b"{}" if method in {"POST", "PUT", "PATCH"} else None
        answer = worker.http(name, method, _sample_target(str(trigger["route"])), body=body, traceparent=HOST)
        if not answer.succeeded:
            failures.append(f"{name}: the invocation failed: {answer.error}")
        elif answer.status >= 500:
            failures.append(f"{name}: {answer.status} {answer.body[:200]!r}")
        elif (
            "json" in answer.headers.get("content-type", "")
            and "charset=utf-8" not in answer.headers["content-type"]
        ):
            failures.append(f"{name}: {answer.headers['content-type']} names no charset")
    assert not failures, "\n".join(failures)


def test_a_state_record_round_trips_through_the_runtime(worker: Worker, otel: Recorded) -> None:
    key = _key()
    locked = worker.http(
        "state_lock",
        "POST",
        "/api/v1/state/lock",
        json_body={"key": key},
        headers={"Content-Type": "application/json", "X-Agent-Id": "worker-suite"},
        traceparent=HOST,
    )
    assert locked.succeeded, locked.error
    assert locked.status == 200, locked.body
    assert locked.headers["content-type"].startswith("application/json")
    assert "charset=utf-8" in locked.headers["content-type"]
    token = locked.json["lockToken"]
    child_of_host(otel.span("settle.state.lock"))

    done = worker.http(
        "state_set",
        "POST",
        "/api/v1/state/set",
        json_body={"key": key, "status": "Processed", "lockToken": token, "data": {"n": 1}},
    )
    assert done.status == 200, done.body
    got = worker.http("state_get", "POST", "/api/v1/state/get", json_body={"key": key})
    assert got.status == 200, got.body
    assert got.json["status"] == "Processed"


def test_bad_input_through_the_runtime_is_a_400_naming_the_field(worker: Worker) -> None:
    answer = worker.http("state_get", "POST", "/api/v1/state/get", json_body={})
    assert answer.status == 400
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert "key" in json.dumps(answer.json)


def test_a_body_starting_with_a_byte_order_mark_is_read(worker: Worker) -> None:
    body = "\ufeff".encode() + json.dumps({"key": _key()}).encode()
    answer = worker.http("state_lock", "POST", "/api/v1/state/lock", body=body)
    assert answer.status == 200, answer.body


# -- Service Bus: the resolver --------------------------------------------------------------------------


def test_the_resolver_projects_through_the_runtime_with_the_extensions_metadata(
    worker: Worker, flow: Flow, otel: Recorded
) -> None:
    for message in (flow.request(), flow.park(expected_by="2026-12-01T09:00:00.0000000Z")):
        answer = worker.service_bus("resolver", message, traceparent=HOST)
        assert answer.succeeded, answer.error
    projections = otel.spans("settle.resolver.project")
    assert len(projections) == 2
    for span in projections:
        child_of_host(span)
    row = worker.http("event_get", "GET", f"/api/v1/events/{flow.endpoint}/{flow.event_id}")
    assert row.status == 200, row.body
    event = row.json
    assert (event["resolutionStatus"], event["pendingSubStatus"]) == ("Pending", "Handoff")
    assert event["externalJobId"] == "job-1"
    assert event["expectedBy"].startswith("2026-12-01T09:00:00")
    assert event["lastMessageId"] == "park-1" and event["parentMessageId"] == "req-1"
    job = worker.http("handoff_job", "GET", f"/api/v1/handoffs/{flow.endpoint}/jobs/job-1")
    assert job.status == 200 and job.json["coordinates"]["messageId"] == "park-1"


def test_a_settlement_request_through_the_runtime_leaves_the_queue(worker: Worker, flow: Flow) -> None:
    for message in (
        flow.request(),
        flow.park(),
        flow.control(MessageType.HandoffCompletedRequest, message_id="settle-1", parent="park-1"),
    ):
        assert worker.service_bus("resolver", message).succeeded
    event = worker.http("event_get", "GET", f"/api/v1/events/{flow.endpoint}/{flow.event_id}").json
    assert (event["resolutionStatus"], event["pendingSubStatus"]) == ("Pending", None)
    assert worker.http("handoff_next", "GET", f"/api/v1/handoffs/{flow.endpoint}/next").status == 204


@pytest.mark.parametrize("job", AWKWARD)
def test_ids_with_reserved_characters_reach_the_function_decoded_once(worker: Worker, job: str) -> None:
    flow = Flow(endpoint="Billing-" + uuid.uuid4().hex[:8], event_id=str(uuid.uuid4()))
    assert worker.service_bus("resolver", flow.request()).succeeded
    assert worker.service_bus("resolver", flow.park(job=job)).succeeded
    target = f"/api/v1/handoffs/{flow.endpoint}/jobs/{_segment(job)}"
    found = worker.http("handoff_job", "GET", target)
    assert found.status == 200, found.body
    assert found.json["coordinates"]["messageId"] == "park-1"


def test_an_id_with_a_slash_is_not_routed_to_a_single_segment_parameter(worker: Worker) -> None:
    # The host decodes %2F before matching: no route with one segment per id matches, as in Azure.
    route = worker.route("handoff_job")
    assert route.match(decode_path("/api/v1/handoffs/Billing/jobs/JOB%2F2026")) is None
    assert route.match(decode_path("/api/v1/handoffs/Billing/jobs/JOB%252F2026")) == {
        "endpointId": "Billing",
        "externalJobId": "JOB%2F2026",
    }


# -- timers ---------------------------------------------------------------------------------------------


def test_every_timer_runs_through_the_runtime_in_the_hosts_trace(
    worker: Worker, otel: Recorded, fresh_tables: str
) -> None:
    # Tables of its own, so the timers' work is this test's alone (a layout re-read beside a call is
    # tested in tests/telemetry/test_layout_refresh_trace.py).
    timers = [n for n in worker.metadata if worker.trigger(n)["type"] == "timerTrigger"]
    assert timers
    for name in timers:
        answer = worker.timer(name, traceparent=HOST)
        assert answer.succeeded, f"{name}: {answer.error}"
    child_of_host(otel.span("settle.sweeper.run"))
    spans = otel.spans()
    assert spans
    traces = [(s.name, f"{s.context.trace_id:032x}") for s in spans]
    foreign = [(name, trace) for name, trace in traces if trace != HOST_TRACE]
    assert not foreign, f"spans outside the host's trace: {foreign}"


def test_the_suite_covers_every_trigger_the_app_declares(worker: Worker) -> None:
    # HTTP functions are all invoked above, timers all, and the resolver is the one Service Bus trigger:
    # a new trigger type, or a second Service Bus function, needs its own conformance test here.
    kinds: dict[str, list[str]] = {}
    for name in worker.metadata:
        kinds.setdefault(str(worker.trigger(name)["type"]), []).append(name)
    assert set(kinds) == {"httpTrigger", "timerTrigger", "serviceBusTrigger"}
    assert kinds["serviceBusTrigger"] == ["resolver"]
