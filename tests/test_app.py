"""The function app as the host indexes it: health, OpenAPI, auth levels."""

from __future__ import annotations

from tests.support.routes import OPERATOR_ROUTES


def test_health_is_anonymous_and_answers_ok(call, functions):
    result = call("health", method="GET")
    assert result.status == 200
    assert result.json["status"] == "ok"
    assert functions["health"].get_trigger().auth_level.value == "anonymous"


def test_openapi_document_lists_every_http_function(call, functions):
    doc = call("openapi_document", method="GET").json
    assert doc["openapi"].startswith("3.")
    served = {
        (f"/api/{f.get_trigger().route}", m.value.lower())
        for f in functions.values()
        if f.get_trigger().type == "httpTrigger"
        for m in f.get_trigger().methods
    }
    documented = {(path, verb) for path, ops in doc["paths"].items() for verb in ops}
    assert served == documented


# ADR-0013: the console and the management API are anonymous for the Functions host; App Service
# authentication signs operators in and the code checks the principal (401/403, fail closed in Azure).


def test_only_health_openapi_the_state_lookups_and_the_operator_routes_are_anonymous(functions):
    anonymous = {
        name
        for name, f in functions.items()
        if f.get_trigger().type == "httpTrigger" and f.get_trigger().auth_level.value == "anonymous"
    }
    twins = {name for name in functions if name.endswith("_by_query")}
    assert anonymous - twins == {"health", "openapi_document", "state_meta"} | OPERATOR_ROUTES
    # A twin taking its path form's ids in the query string has its path form's auth level.
    assert anonymous & twins == {name for name in twins if name.removesuffix("_by_query") in OPERATOR_ROUTES}
