"""Every id reaches its handler as Azure routes it: through the route's twin, ids in the query string.

The deployed Functions host decodes ``%2F`` in the path before it matches a route, so an id holding ``/``
in a path segment is a 404 there. Every route with ids in its path therefore has a twin ``<name>_by_query``
whose route has no id segment; the ids travel in the query string, percent-encoded (``+`` as %2B), and the
worker hands them to the app decoded once. Requests here are built that way: the query string as a client
sends it, parsed as the host parses it, into the ``func.HttpRequest`` the worker gives the function.
"""

from __future__ import annotations

import re
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from common.errors import SettleError
from handoff import limits
from tests.conftest import Caller
from tests.support.handoff_flows import Flow

pytestmark = pytest.mark.usefixtures("settle_tables")

# One of each character a path segment cannot carry through the deployed host, or that a query string
# changes when it is not encoded: "/", "%", "+" (a space in a query), "?", "#", a space, non-ASCII.
HOSTILE_IDS = ("a/b/c", "100%", "1+1", "why?", "#7", "two words", "Ünïcødé-日本", "all/of %2F+?# ü")

# Routes with a path parameter that is not an id: a layout family and a console file are fixed names.
NOT_IDS = {"layout_change", "console_asset"}

# What a handler that reads its body before its ids is given (a valid body: only the ids are under test).
BODIES: dict[str, Any] = {
    "event_fail": {"errorText": "broken"},
    "event_settlement_resolve": {"messageId": "m-1", "resolution": "released", "reason": "checked"},
    "endpoint_bulk": {"action": "skip", "eventIds": ["e-1"]},
    "poison_dismiss": {"reason": "no fix will project it"},
    "handoff_lease_renew": {"eventId": "e-1", "leaseToken": "t-1"},
    "handoff_lease_release": {"eventId": "e-1", "leaseToken": "t-1"},
}


def route_of(fn: Any) -> str:
    return str(fn.get_trigger().route)


def methods_of(fn: Any) -> set[str]:
    return {str(getattr(m, "value", m)).upper() for m in fn.get_trigger().methods or ()}


def ids_of(route: str) -> list[str]:
    return re.findall(r"\{(\w+)\}", route)


def path_forms(functions: dict[str, Any]) -> dict[str, list[str]]:
    """Every HTTP function taking ids in its path, with those ids."""
    return {
        name: ids_of(route_of(fn))
        for name, fn in sorted(functions.items())
        if fn.get_trigger().type == "httpTrigger" and ids_of(route_of(fn)) and name not in NOT_IDS
    }


def as_the_worker_gives(values: dict[str, str]) -> dict[str, str]:
    """The query string a client sends for ``values`` (every reserved character percent-encoded, ``+`` as
    %2B), parsed as the host parses a query string: the params the worker hands the function."""
    sent = "&".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in values.items())
    return dict(urllib.parse.parse_qsl(sent, keep_blank_values=True))


class Reached(SettleError):
    status = 418
    slug = "reached"
    title = "The handler read every id"


@pytest.fixture
def read_ids(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[list[str]], list[tuple[str, str]]]]:
    """The ids the handler reads through its accessor (every one is bounded there), in the order read;
    the handler stops (418) once it has read those expected, before any storage call."""
    seen: list[tuple[str, str]] = []
    expected: list[str] = []
    bounded = limits.bounded

    def spy(value: str, field: str, maximum: int) -> str:
        checked = bounded(value, field, maximum)
        if field in expected:
            seen.append((field, value))
            if {f for f, _ in seen} >= set(expected):
                raise Reached("every id read")
        return checked

    def expect(names: list[str]) -> list[tuple[str, str]]:
        seen.clear()
        expected[:] = names
        return seen

    monkeypatch.setattr(limits, "bounded", spy)
    yield expect


def test_every_route_with_ids_in_its_path_has_a_twin_with_none(functions: dict[str, Any]) -> None:
    forms = path_forms(functions)
    assert len(forms) == 19
    for name in forms:
        twin = functions.get(f"{name}_by_query")
        assert twin is not None, f"{name} has no twin taking its ids in the query string"
        assert "{" not in route_of(twin), name
        path, query = functions[name].get_trigger(), twin.get_trigger()
        assert methods_of(twin) == methods_of(functions[name]), name
        assert query.auth_level == path.auth_level, name


def test_no_twin_shares_a_route_with_another_function(functions: dict[str, Any]) -> None:
    """A twin's route is literal; no other function of a method it serves may match it (segment by
    segment: a parameter matches any segment), nor may two twins share a route and method."""
    http = {n: f for n, f in functions.items() if f.get_trigger().type == "httpTrigger"}

    def matches(template: str, path: str) -> bool:
        t, p = template.split("/"), path.split("/")
        return len(t) == len(p) and all(a == b or a.startswith("{") for a, b in zip(t, p, strict=True))

    for name, twin in http.items():
        if not name.endswith("_by_query"):
            continue
        for other, fn in http.items():
            if other != name and methods_of(fn) & methods_of(twin):
                assert not matches(route_of(fn), route_of(twin)), f"{name} collides with {other}"


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
def test_an_id_with_any_character_reaches_every_handler_exactly_through_the_twin(
    functions: dict[str, Any], read_ids: Callable[[list[str]], list[tuple[str, str]]], hostile: str
) -> None:
    call = Caller(functions)
    for name, names in path_forms(functions).items():
        # Each id distinct (so a swap shows), each holding the hostile text; a day is never hostile: it
        # is 8 digits and checked as such before anything is read.
        values = {n: ("20261201" if n == "day" else f"{hostile}|{n}") for n in names}
        seen = read_ids(names)
        answer = call(
            f"{name}_by_query", BODIES.get(name), params={**as_the_worker_gives(values), "waitSeconds": "0"}
        )
        assert answer.status == 418, f"{name}: {answer.status} {answer.json}"
        assert dict(seen) == values, name


def test_a_twin_without_an_id_answers_400_naming_it(functions: dict[str, Any]) -> None:
    call = Caller(functions)
    for name, names in path_forms(functions).items():
        for missing in names:
            given = {n: "x" if n != "day" else "20261201" for n in names if n != missing}
            answer = call(f"{name}_by_query", BODIES.get(name), params=given)
            assert answer.status == 400, f"{name} without {missing}: {answer.status}"
            assert answer.json["field"] == missing, name


def test_a_twin_bounds_its_ids_as_the_path_form_does(functions: dict[str, Any]) -> None:
    call = Caller(functions)
    long = "x" * (limits.MAX_ENDPOINT_ID + 1)
    for name, names in path_forms(functions).items():
        if "endpointId" not in names:
            continue
        given = {n: long if n == "endpointId" else "x" for n in names}
        answer = call(f"{name}_by_query", BODIES.get(name), params=given)
        assert (answer.status, answer.json["field"]) == (400, "endpointId"), name


def test_the_openapi_document_lists_every_twin_with_its_ids_in_the_query(functions: dict[str, Any]) -> None:
    document = Caller(functions)("openapi_document", method="GET").json
    by_id = {op["operationId"]: op for ops in document["paths"].values() for op in ops.values()}
    paths = {op["operationId"]: path for path, ops in document["paths"].items() for op in ops.values()}
    for name, names in path_forms(functions).items():
        twin, path_form = by_id[f"{name}_by_query"], by_id[name]
        assert paths[f"{name}_by_query"] == "/api/" + route_of(functions[f"{name}_by_query"])
        required = {p["name"] for p in twin["parameters"] if p["in"] == "query" and p.get("required")}
        assert set(names) <= required, name
        assert not [p for p in twin.get("parameters", []) if p["in"] == "path"], name
        # The same body, answers and models as the path form.
        assert twin.get("requestBody") == path_form.get("requestBody"), name
        assert twin["responses"] == path_form["responses"], name
        assert twin.get("security") == path_form.get("security"), name


def test_a_parked_hand_off_with_hostile_ids_is_read_through_the_twins(functions: dict[str, Any]) -> None:
    # Given a hand-off parked on an endpoint, with an event id and a job id holding every hostile character
    suffix = uuid.uuid4().hex[:6]
    flow = Flow(endpoint=f"Billing/eu {suffix}", event_id=f"inv/2026/17 #1+1?%20 ü-{suffix}")
    job = f"JOB/2026/17 +x?#% {suffix}"
    resolve = functions["resolver"].get_user_function()  # as the host runs it for a delivered message
    resolve(flow.request())
    resolve(flow.park(job=job))
    call = Caller(functions)
    ids = {"endpointId": flow.endpoint, "eventId": flow.event_id}

    # When an agent and an operator read it through the twins, ids in the query string
    event = call("event_get_by_query", params=as_the_worker_gives(ids))
    operator = call("endpoint_event_by_query", params=as_the_worker_gives(ids))
    by_job = call(
        "handoff_job_by_query",
        params=as_the_worker_gives({"endpointId": flow.endpoint, "externalJobId": job}),
    )
    listed = call("endpoint_events_by_query", params=as_the_worker_gives({"endpointId": flow.endpoint}))
    offered = call("handoff_next_by_query", params=as_the_worker_gives({"endpointId": flow.endpoint}))

    # Then each answers with the event it names, exactly
    assert (event.status, event.json["eventId"]) == (200, flow.event_id)
    assert (operator.status, operator.json["eventId"]) == (200, flow.event_id)
    assert (by_job.status, by_job.json["externalJobId"]) == (200, job)
    assert by_job.json["coordinates"]["eventId"] == flow.event_id
    assert [e["eventId"] for e in listed.json["items"]] == [flow.event_id]
    assert (offered.status, offered.json["coordinates"]["eventId"]) == (200, flow.event_id)
    assert offered.json["endpointId"] == flow.endpoint
