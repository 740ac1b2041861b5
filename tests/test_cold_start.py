"""What a cold start loads: the first invocations of a new instance (index the app, a state lock, a resolver
message) load none of the modules that only the operator API and the hand-off HTTP API need.

Their pydantic models are most of Settle's import time (a cold start was 1.6x the SDK floor); the
OpenAPI document names them lazily and each handler imports them when it is first called. Whether the cold
start meets its target is the benchmark's to say (``bench/coldstart.py``); this test holds the structure.
"""

from __future__ import annotations

from tests.support.probes import clean_env, run_probe

# Loaded only when an operator or a hand-off agent calls its API (or the OpenAPI document is asked for).
NOT_AT_COLD_START = (
    "handoff.models",
    "handoff.receive.receiver",
    "handoff.settlement.settler",
    "management.models",
    "management.actions",
    "management.find",
    "management.bulk",
    "handoff.storage.overview",
    "management.poison",
    "management.audits",
    "management.records",
)

FIRST_INVOCATIONS = """
import json, sys, uuid
from datetime import datetime, timezone
import azure.functions as func
from azure.functions.servicebus import ServiceBusMessage
import function_app

functions = {str(f.get_function_name()): f for f in function_app.app.get_functions()}
indexed = sorted(m for m in sys.modules if m in WATCHED)
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
first = sorted(m for m in sys.modules if m in WATCHED)
document = functions["openapi_document"].get_user_function()(func.HttpRequest(
    "GET", "http://localhost/api/openapi.json", headers={}, params={}, route_params={}, body=b""))
assert document.status_code == 200
schemas = json.loads(document.get_body())["components"]["schemas"]
print("RESULT " + json.dumps({"indexed": indexed, "first": first, "schemas": sorted(schemas)}))
"""


def test_the_first_invocations_load_no_operator_or_handoff_api_module(azurite_connection: str) -> None:
    code = FIRST_INVOCATIONS.replace("WATCHED", repr(NOT_AT_COLD_START))
    result = run_probe(code, clean_env(azurite_connection))
    assert result["indexed"] == []
    assert result["first"] == []
    # The OpenAPI document still names the models of those APIs (they are imported when it is built).
    for model in ("EndpointsOverview", "PoisonPage", "SettlementAccepted", "LeasedHandoffView", "EventView"):
        assert any(name.startswith(model) for name in result["schemas"]), model
