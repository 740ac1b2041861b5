"""Hostile input on every HTTP function, generated from the served OpenAPI document.

Each function is called through its entry point (as the worker calls it) with bodies and parameters
drawn from its OpenAPI schema. Most bodies are *valid-shaped*: they satisfy the schema and its
constraints (a key with a scope and, for scopes 5-7, an execution id; statuses a ``set`` accepts; lock
tokens Settle really issued, for the key they were issued for), so the call gets past validation and
reaches storage, where the interesting failures live; the keys' text is still hostile (OData, key
separators, control characters, lone surrogates). The rest are hostile-shaped: generated from the
schema with out-of-range values, then mutated (wrong types, missing and extra fields), arbitrary JSON,
bytes that are not JSON. Promises: never a 5xx, and every error is ``application/problem+json`` with a
type, a title and the HTTP status. Every valid-shaped case records whether it reached a storage request
(counted by the fault policy on the calling thread, not guessed); at least half of them must, for every
state operation (hostile-shaped cases are meant to be refused before storage, so counting them too put
the bar at the coin flip between the two halves).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Caller
from tests.reliability.faults import FaultPolicy
from tests.reliability.tally import TALLY, Tally, sized

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
    # What real senders and storage produce: other scripts' digits, DateTime extremes.
    "²",
    "١٢",
    "\uff11\uff12",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:00:00-05:00",
    "0001-01-01T00:00:00+05:00",
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
# What a valid-shaped body may carry where its schema allows any JSON: the same, with text in Unicode (a lone
# surrogate, in a key or a value, makes the whole body invalid JSON, refused before storage).
unicode_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
valid_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | unicode_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(unicode_text, inner, max_size=3),
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


def conforming(
    schema: dict[str, Any],
    components: dict[str, Any],
    overrides: dict[str, st.SearchStrategy[Any]],
    depth: int = 0,
) -> st.SearchStrategy[Any]:
    """Values that satisfy ``schema`` and its constraints (sizes, bounds, enums, required fields);
    ``overrides`` give the value of a named property where the schema says too little (a status a
    ``set`` accepts, a real lock token)."""
    schema = _resolve(schema, components)
    if depth > 6:
        return st.none()
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branches = [b for b in schema[key] if _resolve(b, components).get("type") != "null"]
            return st.one_of(
                [conforming(b, components, overrides, depth + 1) for b in branches or schema[key]]
            )
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))

        def value(name: str, sub: dict[str, Any]) -> st.SearchStrategy[Any]:
            return overrides[name] if name in overrides else conforming(sub, components, overrides, depth + 1)

        return st.fixed_dictionaries(
            {k: value(k, v) for k, v in props.items() if k in required},
            optional={k: value(k, v) for k, v in props.items() if k not in required},
        )
    if kind == "string":
        if schema.get("format") == "date-time":
            # Valid means what the API accepts: Table Storage holds instants from 1601-01-01 on (an earlier
            # one is refused with a 400 naming the field, and was ~45 % of the valid-shaped queries).
            return st.datetimes(min_value=datetime(1601, 1, 2), timezones=st.just(UTC)).map(
                lambda d: d.isoformat().replace("+00:00", "Z")
            )
        low = schema.get("minLength", 0)
        high = min(schema.get("maxLength", 20), max(low, 20))
        return st.one_of(
            st.text(VALID_CHARACTERS, min_size=low, max_size=high),
            st.sampled_from([t for t in KEY_TEXT if low <= len(t) <= high] or ["x" * low]),
        )
    if kind == "integer":
        return st.integers(schema.get("minimum", 0), schema.get("maximum", 10**9))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(conforming(schema.get("items", {}), components, overrides, depth + 1), max_size=3)
    return valid_json_values


# Hostile text that still makes a valid key: not empty, not too long for a Table key, and Unicode (a lone
# surrogate is not, and a body carrying one is refused as invalid JSON before anything else).
VALID_CHARACTERS = st.characters(exclude_categories=["Cs"])
KEY_TEXT = [t for t in HOSTILE_TEXT if t and len(t) < 100 and "\ud800" not in t]
key_text = st.one_of(
    st.sampled_from(["A", "B", "INV-1"]),
    st.sampled_from(KEY_TEXT),
    st.text(VALID_CHARACTERS, min_size=1, max_size=12),
)


@st.composite
def valid_keys(draw: st.DrawFn) -> dict[str, Any]:
    """A key that passes validation: few tenants/entities and a few repeated item keys, so calls meet
    records other calls wrote (locked, set, superseded) as often as new ones."""
    key: dict[str, Any] = {
        "tenantId": draw(st.sampled_from([1, 2, 2_147_483_647])),
        "scopeId": draw(st.integers(1, 7)),
        "entityId": draw(st.integers(0, 2)),
        "entityExecutionId": draw(st.integers(0, 2)),
        "itemEntityKey": draw(key_text),
        "itemKey": draw(key_text),
    }
    if draw(st.booleans()):
        key["subItemKey"] = draw(key_text)
        key["subItemEntityKey"] = draw(key_text)
    if draw(st.booleans()):
        key["sourceAppId"] = draw(st.integers(0, 9))
    return key


valid_handlers = st.one_of(
    st.just({"key": "built-in"}),
    st.fixed_dictionaries(
        {"key": st.just("built-in")},
        optional={
            "options": st.fixed_dictionaries(
                {},
                optional={"lockSeconds": st.integers(1, 3600), "retentionDays": st.integers(1, 3650)},
            )
        },
    ),
)
OUTCOMES = ["Processed", "Skipped", "Failed", 1, 4, 3]
STATUSES = ["None", "Processed", "Processing", "Failed", "Skipped", "Superseded", "Expired", 0, 1, 2, 3, 4]
# What query filters on: a record's current (effective) status; None and Superseded are a 400 there.
QUERY_STATUSES = ["Processed", "Processing", "Failed", "Skipped", "Expired", 1, 2, 3, 4, 6]

# Lock tokens Settle issued during this run, with the key each was issued for (fenced writes need both).
ISSUED: list[tuple[dict[str, Any], str]] = []
FENCED = {"state_set", "state_upsert", "state_release", "state_lock_extend"}
REACH_PERCENT = 95
STATE_OPERATIONS = {
    "state_exists",
    "state_lock",
    "state_lock_extend",
    "state_set",
    "state_upsert",
    "state_release",
    "state_get",
    "state_query",
    "state_history",
}
# Every generated call of an operation with a body is sent twice: once valid-shaped, once hostile-shaped
# (one of these kinds; "near" is a valid-shaped body with one field replaced, dropped or added).
HOSTILE_KINDS = ["near", "near", "schema", "mutated", "raw"]


def valid_body(data: st.DataObject, name: str, schema: dict[str, Any], components: dict[str, Any]) -> Any:
    overrides: dict[str, st.SearchStrategy[Any]] = {
        "key": valid_keys(),
        "handler": valid_handlers,
        "status": st.sampled_from(
            OUTCOMES if name == "state_set" else QUERY_STATUSES if name == "state_query" else STATUSES
        ),
        "continuationToken": st.none(),
        "scope": st.none(),
        "retentionSeconds": st.integers(1, 10**6),
    }
    body = data.draw(conforming(schema, components, overrides), label="valid")
    # Drawn whatever the pool holds, so the draws do not depend on state outside hypothesis.
    fenced, pick = data.draw(st.booleans(), label="fenced"), data.draw(st.integers(0, 2**16), label="pick")
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if v is not None or k == "data"}
        if name in FENCED and ISSUED and (name == "state_lock_extend" or fenced):
            key, token = ISSUED[pick % len(ISSUED)]
            body.update(key=key, lockToken=token)
        elif name in FENCED and name != "state_lock_extend":
            body.pop("lockToken", None)  # unfenced: a made-up token could never pass the fence
    return body


def check_answer(
    name: str, status: int, content_type: str, body: bytes, sent: Any, *, tally: Tally = TALLY
) -> None:
    """The checker: never a 5xx; every error is problem+json with its status, a type and a title."""
    where = f"{name} with {sent!r:.300}"
    tally.check(AREA, status < 500, f"{where}: answered {status} {body!r:.300}")
    if status >= 400:
        tally.check(
            AREA, content_type.startswith("application/problem+json"), f"{where}: {status} as {content_type}"
        )
        try:
            problem = json.loads(body)
        except ValueError:
            problem = None
        tally.check(
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


def hostile_body(
    data: st.DataObject, name: str, schema: dict[str, Any], components: dict[str, Any]
) -> tuple[Any, bytes | None]:
    kind = data.draw(st.sampled_from(HOSTILE_KINDS), label="kind")
    if kind == "raw":
        if data.draw(st.booleans()):
            return None, data.draw(st.binary(max_size=60), label="raw")
        return data.draw(json_values, label="json"), None
    if kind == "near":
        return data.draw(mutate(valid_body(data, name, schema, components)), label="near"), None
    body = data.draw(from_schema(schema, components), label="body")
    if kind == "mutated":
        body = data.draw(mutate(body), label="mutated")
    return body, None


def fuzz_one(data: st.DataObject, call: Caller, faults: FaultPolicy, openapi: dict[str, Any]) -> None:
    """Generated calls of every HTTP function (two per function with a body: valid- and hostile-shaped)."""
    components = openapi["components"]["schemas"]
    for name, method, op in operations(openapi):
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
        sends: list[tuple[Any, bytes | None]] = [(None, None)]
        if schema is not None:
            sends = [
                (valid_body(data, name, schema, components), None),
                hostile_body(data, name, schema, components),
            ]
        for shape, (body, raw) in enumerate(sends):
            with faults.plan() as plan:  # no fault: the plan only records this thread's storage requests
                result = call(name, body, method=method.upper(), raw=raw, route_params=route, params=params)
            TALLY.add(AREA, operations=1, fuzz_cases=1)
            if shape == 0:  # the valid-shaped send (hostile-shaped ones are meant to be refused)
                TALLY.reached(AREA, name, storage=bool(plan.requests))
            if name == "state_lock" and result.status == 200 and (result.json or {}).get("acquired"):
                ISSUED.append((body["key"], result.json["lockToken"]))
            check_answer(
                name, result.status, result.content_type, result.body, raw if raw is not None else body
            )


def test_no_generated_body_or_parameter_gets_a_5xx_and_most_reach_storage(faulty_tables, openapi, functions):
    call = Caller(functions)
    before = {op: list(counts) for (area, op), counts in TALLY.reach.items() if area == AREA}

    @settings(
        max_examples=sized(400, 40),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        fuzz_one(data, call, faulty_tables, openapi)

    # When every function is called with generated input
    fuzz()
    # Then (checked per call) never a 5xx, and, judged route by route, at least 95 % of the valid-shaped
    # cases of each state operation reached storage (valid input wrongly refused is a defect too)
    for (area, op), (reached, total) in sorted(TALLY.reach.items()):
        if area != AREA or op not in STATE_OPERATIONS:
            continue
        hit, tried = reached - before.get(op, [0, 0])[0], total - before.get(op, [0, 0])[1]
        TALLY.check(
            AREA,
            tried > 0 and 100 * hit >= REACH_PERCENT * tried,
            f"{op}: {hit} of {tried} cases reached storage",
        )


# --- the wire shapes a reviewer found, generated -----------------------------------------------------

NON_FINITE = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "1" + "0" * 400 + ".0",
    "1" + "0" * 300 + "e9",  # a short exponent on a long mantissa
    "-" + "9" * 308 + ".5e1",
]
EXTREME_TIMES = [
    "9999-12-31T23:00:00-05:00",
    "9999-12-31T23:59:59.9999999Z",
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+05:00",
    "1600-12-31T23:59:59Z",
    "1601-01-01T00:00:00Z",
]


@st.composite
def wire_shapes(draw: st.DrawFn) -> tuple[str, bytes, bool]:
    """(operation, raw body, must-be-400): non-finite numbers inside data, extreme query times, filters
    longer than any key (in scripts that cost more on the wire than they look)."""
    kind = draw(st.sampled_from(["number", "time", "filter"]))
    if kind == "number":
        number = draw(st.sampled_from(NON_FINITE))
        depth = draw(st.integers(0, 3))
        value = number
        for _ in range(depth):
            value = draw(st.sampled_from([f"[{value}]", f'{{"x": {value}}}', f"[1, {value}]"]))
        key = json.dumps({"tenantId": 1, "scopeId": 4, "entityId": 1, "itemEntityKey": "f", "itemKey": "n"})
        name = draw(st.sampled_from(["state_upsert", "state_set"]))
        status = ', "status": "Processed"' if name == "state_set" else ""
        return name, f'{{"key": {key}{status}, "data": {value}}}'.encode(), True
    if kind == "time":
        field = draw(st.sampled_from(["updatedFrom", "updatedTo"]))
        body = {"tenantId": 1, field: draw(st.sampled_from(EXTREME_TIMES))}
        return "state_query", json.dumps(body).encode(), False
    char = draw(st.sampled_from(["x", "中", "/", "%", "\U0001f600"]))
    length = draw(st.sampled_from([400, 600, 9_000, 100_000]))
    body = {"tenantId": 1, "scopeId": 4, "entityId": 1, "itemEntityKey": char * length}
    return "state_query", json.dumps(body).encode(), False


def test_wire_shapes_are_refused_by_name_or_answered_never_a_5xx(faulty_tables, functions):
    call = Caller(functions)

    @settings(max_examples=sized(120, 30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(shape=wire_shapes())
    def fuzz(shape: tuple[str, bytes, bool]) -> None:
        name, raw, refused = shape
        result = call(name, raw=raw)
        TALLY.add(AREA, operations=1, fuzz_cases=1)
        check_answer(name, result.status, result.content_type, result.body, raw[:200])
        if refused:
            TALLY.check(
                AREA,
                result.status == 400 and str((result.json or {}).get("field", "")).startswith("data"),
                f"{name} with {raw[:200]!r}: a number JSON cannot carry answered "
                f"{result.status} {result.body[:200]!r}",
            )

    fuzz()
