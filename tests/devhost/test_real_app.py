"""The development host serving Settle's own ``function_app.app`` (a separate process, real HTTP).

Given the host started with a function key against the test Azurite (loopback transport), the
meta endpoints, error answers, key handling and the admin endpoint behave as documented.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.support.children import HostProcess, StartHost

KEY = "real-app-key-" + uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def host(start_host: StartHost) -> HostProcess:
    return start_host(env={"SETTLE_DEV_FUNCTION_KEY": KEY})


def served(host: HostProcess) -> str:
    return host.output().split("listening on", 1)[0]


def test_health_and_openapi_are_open(host: HostProcess) -> None:
    health = httpx.get(f"{host.base_url}/api/v1/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    document = httpx.get(f"{host.base_url}/api/v1/openapi.json")
    assert document.status_code == 200
    assert document.json()["openapi"].startswith("3.")


def test_unknown_route_is_404_problem_json(host: HostProcess) -> None:
    response = httpx.get(f"{host.base_url}/api/v1/no-such-thing")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")


def test_wrong_method_is_405(host: HostProcess) -> None:
    response = httpx.post(f"{host.base_url}/api/v1/health")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"


def test_function_level_operations_need_the_key(host: HostProcess) -> None:
    url = f"{host.base_url}/api/v1/state/get"
    assert "state_get" in served(host) or "/api/v1/state/get" in served(host), (
        "state/functions.py does not register POST /api/v1/state/get yet"
    )
    assert httpx.post(url, json={}).status_code == 401
    with_key = httpx.post(url, json={}, headers={"x-functions-key": KEY})
    assert with_key.status_code == 400  # reached the function, which names the missing field
    assert with_key.headers["content-type"].startswith("application/problem+json")


def test_admin_endpoint_runs_the_catch_up_timer(host: HostProcess) -> None:
    assert "state_catchup: timerTrigger" in served(host), "state/functions.py has no state_catchup timer yet"
    response = httpx.post(
        f"{host.base_url}/admin/functions/state_catchup", json={}, headers={"x-functions-key": KEY}
    )
    assert response.status_code == 202, response.text


def test_admin_endpoint_feeds_the_resolver(host: HostProcess) -> None:
    assert "resolver: serviceBusTrigger" in served(host), "handoff/functions.py has no resolver yet"
    event_id = f"evt-{uuid.uuid4().hex[:8]}"
    response = httpx.post(
        f"{host.base_url}/admin/functions/resolver",
        headers={"x-functions-key": KEY},
        json={
            "messageId": f"InvoiceCreated-{event_id}",
            "sessionId": "INV-1",
            "correlationId": "corr-1",
            "applicationProperties": {
                "MessageType": "EventRequest",
                "To": "Billing",
                "From": "Erp",
                "EventId": event_id,
                "EventTypeId": "InvoiceCreated",
            },
            "body": {
                "EventContent": {"EventTypeId": "InvoiceCreated", "EventJson": "{}"},
                "ErrorContent": None,
            },
        },
    )
    assert response.status_code == 202, response.text
    row = httpx.get(f"{host.base_url}/api/v1/events/Billing/{event_id}", headers={"x-functions-key": KEY})
    assert row.status_code == 200, row.text
    assert row.json()["resolutionStatus"] == "Pending"


def test_a_chunked_post_is_411_as_in_azure_and_the_same_body_with_content_length_works(
    host: HostProcess,
) -> None:
    body = b'{"key": {"tenantId": 1, "scopeId": 4, "entityId": 1, "itemEntityKey": "i", "itemKey": "k"}}'

    def chunks():
        yield body[:10]
        yield body[10:]

    headers = {"x-functions-key": KEY, "content-type": "application/json"}
    chunked = httpx.post(f"{host.base_url}/api/v1/state/exists", content=chunks(), headers=headers)
    assert chunked.status_code == 411
    assert chunked.headers["content-type"] == "application/problem+json; charset=utf-8"
    whole = httpx.post(f"{host.base_url}/api/v1/state/exists", content=body, headers=headers)
    assert whole.status_code == 200
    assert whole.headers["content-type"] == "application/json; charset=utf-8"
