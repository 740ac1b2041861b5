"""Hostile input on every HTTP function, generated from the served OpenAPI document.

Each function is called through its entry point (as the worker calls it) with bodies and parameters
drawn from its OpenAPI schema, then mutated: wrong types, missing and extra fields, out-of-range
numbers, OData and key-breaking text, arbitrary JSON, bytes that are not JSON. Promises: never a 5xx,
and every error is ``application/problem+json`` with a type, a title and the HTTP status.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Caller
from tests.reliability.tally import TALLY, sized

pytestmark = pytest.mark.slow

AREA = "http fuzz"
HOSTILE_TEXT = [
    "' or 1 eq 1",
    "x' or PartitionKey ge '",
    "PartitionKey ge ''",
    "a/b\\c#d?e",
    "|c",
    "%41%",
    "~",
    "\x00\x1f\x7f",
    "\ud800",
    "\U0001f600",
    "",
    " ",
    "x" * 1100,
    "null",
    "$batch",
]
text = st.one_of(st.text(max_size=30), st.sampled_from(HOSTILE_TEXT))
# Route and query values come from a URL the host decoded: valid Unicode, so no lone surrogates (JSON
# bodies can carry them as \ud800 escapes, and do).
url_text = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=30),
    st.sampled_from([t for t in HOSTILE_TEXT if "\ud800" not in t]),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def from_schema(schema: dict[str, Any], components: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that fit ``schema`` (JSON Schema as pydantic emits it), mostly; hostile text throughout."""
    schema = _resolve(schema, components)
    if depth > 6:
        return st.none()
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return st.one_of([from_schema(s, components, depth + 1) for s in schema[key]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: from_schema(v, components, depth + 1) for k, v in props.items() if k in required},
            optional={
                k: from_schema(v, components, depth + 1) for k, v in props.items() if k not in required
            },
        )
    if kind == "string":
        if schema.get("format") == "date-time":
            return st.one_of(st.datetimes().map(lambda d: d.isoformat() + "Z"), text)
        return st.one_of(
            st.text(min_size=schema.get("minLength", 0), max_size=40), st.sampled_from(HOSTILE_TEXT)
        )
    if kind == "integer":
        low, high = schema.get("minimum", -(2**40)), schema.get("maximum", 2**40)
        return st.one_of(st.integers(low, high), st.integers(low - 2, low), st.integers(high, high + 2))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), components, depth + 1), max_size=3)
    return json_values


def mutate(value: Any) -> st.SearchStrategy[Any]:
    """The generated value, or one field of it replaced, dropped or added."""
    if not isinstance(value, dict) or not value:
        return st.just(value)
    keys = sorted(value)
    return st.one_of(
        st.just(value),
        st.sampled_from(keys).flatmap(lambda k: json_values.map(lambda v: {**value, k: v})),
        st.sampled_from(keys).map(lambda k: {n: v for n, v in value.items() if n != k}),
        st.tuples(text, json_values).map(lambda kv: {**value, kv[0]: kv[1]}),
    )


def check_answer(name: str, status: int, content_type: str, body: bytes, sent: Any) -> None:
    where = f"{name} with {sent!r:.300}"
    TALLY.check(AREA, status < 500, f"{where}: answered {status} {body!r:.300}")
    if status >= 400:
        TALLY.check(
            AREA, content_type.startswith("application/problem+json"), f"{where}: {status} as {content_type}"
        )
        problem = json.loads(body)
        TALLY.check(
            AREA,
            isinstance(problem, dict)
            and problem.get("status") == status
            and bool(problem.get("type"))
            and bool(problem.get("title")),
            f"{where}: problem {problem!r:.300}",
        )


@pytest.fixture(scope="module")
def openapi(functions: dict[str, Any]) -> dict[str, Any]:
    result = Caller(functions)("openapi_document", method="GET")
    assert result.status == 200
    document: dict[str, Any] = result.json
    return document


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (op["operationId"], method, op) for ops in document["paths"].values() for method, op in ops.items()
    ]


def test_the_openapi_document_documents_every_http_function(openapi, functions):
    documented = {name for name, _, _ in operations(openapi)}
    http = {n for n, f in functions.items() if type(f.get_trigger()).__name__ == "HttpTrigger"}
    TALLY.check(AREA, documented == http, f"documented {sorted(documented)} vs functions {sorted(http)}")


@settings(
    max_examples=sized(500, 20),
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_no_generated_body_or_parameter_gets_a_5xx_and_every_error_is_problem_json(
    faulty_tables, openapi, functions, data
):
    call = Caller(functions)
    components = openapi["components"]["schemas"]
    for name, method, op in operations(openapi):
        body: Any = None
        raw: bytes | None = None
        route: dict[str, str] = {}
        params: dict[str, str] = {}
        for parameter in op.get("parameters", []):
            value = data.draw(
                st.one_of(url_text, st.from_regex(r"[A-Za-z0-9-]{1,20}", fullmatch=True)),
                label=parameter["name"],
            )
            if parameter["name"] == "waitSeconds":  # long-polling is bounded separately; keep fuzzing fast
                value = data.draw(st.sampled_from(["0", "-1", "nan", "-inf", "abc", "0.1", ""]))
            if parameter["in"] == "path":
                route[parameter["name"]] = value
            elif parameter.get("required") or data.draw(st.booleans()):
                params[parameter["name"]] = value
        schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        if schema is not None:
            kind = data.draw(st.sampled_from(["schema", "mutated", "json", "bytes"]), label="kind")
            if kind == "bytes":
                raw = data.draw(st.binary(max_size=60), label="raw")
            elif kind == "json":
                body = data.draw(json_values, label="json")
            else:
                body = data.draw(from_schema(schema, components), label="body")
                if kind == "mutated":
                    body = data.draw(mutate(body), label="mutated")
        result = call(name, body, method=method.upper(), raw=raw, route_params=route, params=params)
        TALLY.add(AREA, operations=1, fuzz_cases=1)
        check_answer(name, result.status, result.content_type, result.body, raw if raw is not None else body)
