"""GET /api/v1/state/meta: the seeds' lookup lists, so a client never hard-codes scopes or statuses."""

from __future__ import annotations

from typing import Any

from common.roundtrips import ROUND_TRIPS

EXPECTED: dict[str, Any] = {
    "scopes": [
        {"id": 1, "name": "App"},
        {"id": 2, "name": "Process"},
        {"id": 3, "name": "Thread"},
        {"id": 4, "name": "Element"},
        {"id": 5, "name": "ProcessExecution"},
        {"id": 6, "name": "ThreadExecution"},
        {"id": 7, "name": "ElementExecution"},
    ],
    "statuses": [
        {"code": 0, "name": "None"},
        {"code": 1, "name": "Processed"},
        {"code": 2, "name": "Processing"},
        {"code": 3, "name": "Failed"},
        {"code": 4, "name": "Skipped"},
        {"code": 5, "name": "Superseded"},
        {"code": 6, "name": "Expired"},
    ],
    "handlers": ["built-in", "null"],
    "existsStatuses": ["Processed", "Skipped"],
    "settableStatuses": ["Processed", "Skipped", "Failed"],
}


def test_meta_answers_the_exact_lookup_lists_anonymously_without_storage(call, functions):
    with ROUND_TRIPS.measure() as tally:
        result = call("state_meta", method="GET")
    assert result.status == 200 and result.content_type.startswith("application/json")
    assert result.json == EXPECTED
    assert tally.requests == 0
    trigger = functions["state_meta"].get_trigger()
    assert trigger.auth_level.value == "anonymous" and trigger.route == "v1/state/meta"


def test_meta_is_in_the_openapi_document_with_its_model(call):
    doc = call("openapi_document", method="GET").json
    operation = doc["paths"]["/api/v1/state/meta"]["get"]
    assert "security" not in operation
    ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    assert set(schema["properties"]) == set(EXPECTED)


def test_the_names_meta_serves_are_the_ones_the_api_accepts(state, key):
    # every scope name and every settable status name from meta works in a request
    for scope in EXPECTED["scopes"]:
        k = {**key, "scope": scope["name"], "itemKey": f"{key['itemKey']}-{scope['id']}"}
        k.pop("scopeId")
        if scope["id"] >= 5:
            k["entityExecutionId"] = 1
        assert state.exists(k).status == 200
    for name in EXPECTED["settableStatuses"]:
        k = {**key, "itemKey": f"{key['itemKey']}-{name}"}
        assert state.set(k, status=name, error="x" if name == "Failed" else None).json["status"] == name
