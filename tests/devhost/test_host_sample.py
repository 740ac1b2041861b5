"""The development host's mechanics over real HTTP, against a small sample app in another process.

Given a development host serving ``tests/devhost/sample_app.py`` (a function key set, timers every
second), when a client talks HTTP to it, then routing, methods, auth, query/route/header/body passing,
timers and the admin endpoint behave as documented in ``docs/local-development.md``.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.children import HostProcess, StartHost

KEY = "dev-key-" + uuid.uuid4().hex[:8]
ITEM = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sample-out")


@pytest.fixture(scope="module")
def host(start_host: StartHost, out_dir: Path) -> HostProcess:
    return start_host(
        app="tests.devhost.sample_app:app",
        env={
            "SETTLE_DEV_FUNCTION_KEY": KEY,
            "DEVHOST_SAMPLE_OUT": str(out_dir),
            "SAMPLE_SCHEDULE": "*/1 * * * * *",
        },
    )


def records(out_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob(f"{kind}-*.json"))]


def test_route_parameters_query_headers_and_body_reach_the_function(host: HostProcess) -> None:
    response = httpx.put(
        f"{host.base_url}/api/v1/items/{ITEM}/widget?eventTypeId=A&eventTypeId=B&single=1",
        headers={"x-functions-key": KEY, "X-Sample": "yes", "Content-Type": "application/json"},
        content=b'{"hello":"world"}',
    )
    assert response.status_code == 200
    assert response.headers["x-echo"] == "1"
    echo = response.json()
    assert echo["method"] == "PUT"
    assert echo["routeParams"] == {"itemId": ITEM, "name": "widget"}
    # Repeated parameters are joined with "," (as the Functions host does); req.url keeps every value.
    assert echo["params"] == {"eventTypeId": "A,B", "single": "1"}
    assert echo["url"].endswith(f"/api/v1/items/{ITEM}/widget?eventTypeId=A&eventTypeId=B&single=1")
    assert echo["headers"] == {"x-sample": "yes", "content-type": "application/json"}
    assert echo["body"] == '{"hello":"world"}'


def test_optional_parameter_may_be_left_out_and_constraints_are_enforced(host: HostProcess) -> None:
    headers = {"x-functions-key": KEY}
    without_name = httpx.get(f"{host.base_url}/api/v1/items/{ITEM}", headers=headers)
    assert without_name.status_code == 200
    assert without_name.json()["routeParams"] == {"itemId": ITEM}

    not_a_guid = httpx.get(f"{host.base_url}/api/v1/items/not-a-guid", headers=headers)
    assert not_a_guid.status_code == 404
    assert not_a_guid.headers["content-type"].startswith("application/problem+json")


def test_a_literal_route_wins_over_a_parameterised_one(host: HostProcess) -> None:
    response = httpx.get(f"{host.base_url}/api/v1/items/special", headers={"x-functions-key": KEY})
    assert response.status_code == 200
    assert response.text == "special"


def test_unknown_route_is_404_problem_json(host: HostProcess) -> None:
    response = httpx.get(f"{host.base_url}/api/v1/nothing-here")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["status"] == 404


def test_wrong_method_is_405_with_allow(host: HostProcess) -> None:
    response = httpx.delete(f"{host.base_url}/api/v1/items/{ITEM}", headers={"x-functions-key": KEY})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, PUT"
    assert response.headers["content-type"].startswith("application/problem+json")


def test_function_level_needs_the_key_from_header_or_code(host: HostProcess) -> None:
    url = f"{host.base_url}/api/v1/items/{ITEM}"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"x-functions-key": "wrong"}).status_code == 401
    assert httpx.get(url, headers={"x-functions-key": KEY}).status_code == 200
    assert httpx.get(url, params={"code": KEY}).status_code == 200


def test_anonymous_functions_are_open_even_with_a_key_set(host: HostProcess) -> None:
    response = httpx.post(f"{host.base_url}/api/v1/open/7", content=b"x")
    assert response.status_code == 200
    assert response.json()["routeParams"] == {"count": "7"}


def test_an_exception_in_a_function_is_a_500_problem_naming_it(host: HostProcess) -> None:
    response = httpx.get(f"{host.base_url}/api/v1/boom")
    assert response.status_code == 500
    assert "the sample function failed on purpose" in response.json()["detail"]
    assert "RuntimeError" in host.output()  # the traceback is in the host's log


def test_every_request_is_logged_on_one_line(host: HostProcess) -> None:
    httpx.get(f"{host.base_url}/api/v1/open-log-probe")
    assert any("GET /api/v1/open-log-probe -> 404" in line for line in host.output().splitlines())


def test_the_host_says_it_is_a_development_tool(host: HostProcess) -> None:
    assert "development tool" in host.output().splitlines()[0]


def test_timer_runs_on_its_schedule(host: HostProcess, out_dir: Path) -> None:
    deadline = time.monotonic() + 10
    while len(records(out_dir, "timer")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(records(out_dir, "timer")) >= 2, host.output()


def test_admin_endpoint_invokes_a_timer(host: HostProcess, out_dir: Path) -> None:
    before = len(records(out_dir, "timer"))
    response = httpx.post(
        f"{host.base_url}/admin/functions/sample_timer", json={}, headers={"x-functions-key": KEY}
    )
    assert response.status_code == 202
    assert len(records(out_dir, "timer")) > before


def test_admin_endpoint_needs_the_key_when_one_is_set(host: HostProcess) -> None:
    response = httpx.post(f"{host.base_url}/admin/functions/sample_timer", json={})
    assert response.status_code == 401


def test_admin_endpoint_builds_a_service_bus_message_from_json(host: HostProcess, out_dir: Path) -> None:
    message_id = uuid.uuid4().hex
    response = httpx.post(
        f"{host.base_url}/admin/functions/sample_bus",
        headers={"x-functions-key": KEY},
        json={
            "body": {"EventContent": {"EventTypeId": "InvoiceCreated", "EventJson": "{}"}},
            "messageId": message_id,
            "sessionId": "invoice-42",
            "correlationId": "corr-1",
            "applicationProperties": {"MessageType": "EventRequest", "RetryCount": 0},
            "enqueuedTimeUtc": "2026-11-30T12:00:00Z",
            "deliveryCount": 2,
        },
    )
    assert response.status_code == 202
    received = next(r for r in records(out_dir, "bus") if r["messageId"] == message_id)
    assert json.loads(received["body"]) == {
        "EventContent": {"EventTypeId": "InvoiceCreated", "EventJson": "{}"}
    }
    assert received["sessionId"] == "invoice-42"
    assert received["correlationId"] == "corr-1"
    assert received["applicationProperties"] == {"MessageType": "EventRequest", "RetryCount": 0}
    assert received["deliveryCount"] == 2
    assert received["enqueuedTimeUtc"].startswith("2026-11-30T12:00:00")


def test_admin_endpoint_takes_the_hosts_input_shape(host: HostProcess, out_dir: Path) -> None:
    response = httpx.post(
        f"{host.base_url}/admin/functions/sample_bus",
        headers={"x-functions-key": KEY},
        json={"input": "plain text body"},
    )
    assert response.status_code == 202
    assert any(r["body"] == "plain text body" and r["deliveryCount"] == 1 for r in records(out_dir, "bus"))


def test_admin_endpoint_reports_the_functions_exception(host: HostProcess) -> None:
    response = httpx.post(
        f"{host.base_url}/admin/functions/sample_bus",
        headers={"x-functions-key": KEY},
        json={"body": "x", "applicationProperties": {"Fail": "yes"}},
    )
    assert response.status_code == 500
    assert response.json()["detail"] == "ValueError: poison message"


def test_admin_endpoint_rejects_unknown_functions_and_fields(host: HostProcess) -> None:
    headers = {"x-functions-key": KEY}
    missing = httpx.post(f"{host.base_url}/admin/functions/nope", json={}, headers=headers)
    assert missing.status_code == 404
    bad = httpx.post(f"{host.base_url}/admin/functions/sample_bus", json={"sesionId": "x"}, headers=headers)
    assert bad.status_code == 400
    assert bad.json()["field"] == "sesionId"


def test_a_chunked_body_is_dropped_as_the_deployed_host_drops_it(host: HostProcess) -> None:
    # Azure's host forwards a body only with a Content-Length over 0: the function sees none, and the
    # connection still serves the next request.
    def parts() -> Any:
        yield b'{"part": '
        yield b'"one and two"}'

    with httpx.Client() as client:
        response = client.post(f"{host.base_url}/api/v1/open/1", content=parts())
        assert response.status_code == 200
        assert response.json()["body"] == ""
        again = client.post(f"{host.base_url}/api/v1/open/2", content=b'{"whole": true}')
        assert again.json()["body"] == '{"whole": true}'


def test_a_burst_of_64_connections_at_once_is_served_without_a_reset(host: HostProcess) -> None:
    # Given 64 clients that connect at the same instant (agents starting together, a load test)
    import socket
    import threading
    from urllib.parse import urlsplit

    where = urlsplit(host.base_url)
    address = (where.hostname or "127.0.0.1", where.port or 80)
    barrier = threading.Barrier(64)
    answers: list[str] = []
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            with socket.create_connection(address, timeout=30) as sock:
                request = (
                    f"POST /api/v1/open/{n} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n"
                )
                sock.sendall(request.encode())
                received = b""
                while chunk := sock.recv(65536):
                    received += chunk
            answers.append(received.split(b"\r\n", 1)[0].decode())
        except BaseException as exc:  # a reset, a refusal, a timeout: each is a failure here
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # Then every one is answered, and none is reset or refused
    assert errors == []
    assert answers == ["HTTP/1.1 200 OK"] * 64
    # And the listening socket holds such a burst itself: Linux drops a SYN beyond the backlog and the
    # client retries a second later (elsewhere the connection is reset), so the backlog is read from the
    # kernel (``ss``: Send-Q of a listening socket is its backlog).
    import subprocess

    listing = subprocess.run(["ss", "-ltnH", f"sport = :{address[1]}"], capture_output=True, text=True)
    [line] = listing.stdout.strip().splitlines()
    assert int(line.split()[2]) >= 64, line


def raw_get(host: HostProcess, target: str) -> tuple[int, Any]:
    """GET ``target`` exactly as written on the request line (no client normalising the escapes)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(host.base_url)
    connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=30)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        body = response.read()
        kind = response.getheader("Content-Type") or ""
        return response.status, json.loads(body) if "json" in kind else body
    finally:
        connection.close()


@pytest.mark.parametrize("escaped", ["JOB%2F2026", "JOB%2f2026%2F17", "a/b"])
def test_an_id_with_a_slash_is_a_404_as_the_deployed_host_routes_it(host: HostProcess, escaped: str) -> None:
    # Azure decodes %2F before it matches routes: the id spans two segments and no route matches.
    status, body = raw_get(host, f"/api/v1/jobs/ep/{escaped}")
    assert status == 404
    assert body["status"] == 404


@pytest.mark.parametrize(
    ("escaped", "value"),
    [
        ("100%25", "100%"),
        ("100%2525", "100%25"),  # decoded once: the function sees the escape the caller meant
        ("a+b", "a+b"),
        ("a%2Bb", "a+b"),
        ("why%3F", "why?"),
        ("hash%23tag", "hash#tag"),
        ("two%20words", "two words"),
        ("%C3%A9t%C3%A9-%E2%82%AC", "été-€"),
    ],
)
def test_reserved_characters_in_an_id_reach_the_function_decoded_once(
    host: HostProcess, escaped: str, value: str
) -> None:
    status, echo = raw_get(host, f"/api/v1/jobs/ep%20one/{escaped}?q=a%2Fb+c&q=%25")
    assert status == 200, echo
    assert echo["routeParams"] == {"endpointId": "ep one", "jobId": value}
    assert echo["params"] == {"q": "a/b c,%"}  # the query string parses as usual
    assert echo["url"].endswith(f"/api/v1/jobs/ep%20one/{escaped}?q=a%2Fb+c&q=%25")


def test_functions_are_invoked_through_the_pinned_runtime_as_in_azure(host: HostProcess) -> None:
    # The runtime (azure_functions_runtime) built the context and the request from the host's messages
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    seen = httpx.get(f"{host.base_url}/api/v1/context", headers={"traceparent": caller}).json()
    assert seen["context"].startswith("azure_functions_runtime.")
    assert seen["request"] == "azure.functions.http.HttpRequest"
    # ... with the host's own invocation span in the caller's trace
    assert seen["traceparent"].split("-")[1] == caller.split("-")[1]
    assert seen["traceparent"].split("-")[2] != caller.split("-")[2]
    assert seen["invocationId"]
