"""The client's end-to-end fixtures: a development host (real HTTP, test Azurite) and helpers.

``host`` starts ``python -m devtools.host`` once per test module through ``tests/devhost``'s
``start_host`` fixture; ``settle`` is a client of it; ``key`` is a fresh item key for each test.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest
from settle_client import RetryPolicy, SettleClient

from tests.support.children import HostProcess

# Fast retries: the tests lose answers on purpose and should not wait seconds for each retry.
FAST_RETRY = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05)
WAIT_S = 30.0  # generous: the machine is shared
T = TypeVar("T")


def some[T](value: T | None) -> T:
    """``value``, which the test expects to be there."""
    assert value is not None
    return value


@pytest.fixture(scope="module")
def host(start_host: Callable[..., HostProcess]) -> HostProcess:
    return start_host()


@pytest.fixture
def settle(host: HostProcess) -> Iterator[SettleClient]:
    with SettleClient(host.base_url, retry=FAST_RETRY) as client:
        yield client


@pytest.fixture
def key() -> dict[str, Any]:
    return {
        "tenantId": 1,
        "scopeId": 4,
        "entityId": 100,
        "itemEntityKey": "invoice",
        "itemKey": f"INV-{uuid.uuid4().hex[:10]}",
    }


def wait_until(condition: Callable[[], Any], *, timeout: float = WAIT_S, what: str = "condition") -> Any:
    """Poll ``condition`` until it is truthy; its value. Fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.05)


class Gate(httpx.BaseTransport):
    """Real HTTP, except that requests to a path ending in ``suffix`` wait until the gate opens."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.inner = httpx.HTTPTransport()
        self.waiting = threading.Event()
        self.opened = threading.Event()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path.endswith(self.suffix):
            self.waiting.set()
            self.opened.wait(WAIT_S * 2)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.opened.set()
        self.inner.close()


class LoseAnswers(httpx.BaseTransport):
    """Real HTTP, except that the first ``count`` answers to ``suffix`` are lost after the server
    applied the request (the connection breaks while the answer is read)."""

    def __init__(self, suffix: str, count: int = 1) -> None:
        self.suffix = suffix
        self.remaining = count
        self.inner = httpx.HTTPTransport()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path.endswith(self.suffix):
            self.sent.append(request)
            if self.remaining > 0:
                self.remaining -= 1
                response.read()
                response.close()
                raise httpx.ReadError("the connection broke while the answer was read", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def park(
    host: HostProcess,
    endpoint: str,
    *,
    event_type: str = "InvoiceCreated",
    body: Any = None,
    session_id: str | None = None,
) -> str:
    """Park a hand-off on ``endpoint`` through the resolver admin endpoint (as the walkthrough does):
    an EventRequest, then the endpoint's PendingHandoffResponse. Returns the event id."""
    run = uuid.uuid4().hex[:10]
    event_id, request_id = f"evt-{run}", f"{event_type}-{run}"
    content = {"EventContent": {"EventTypeId": event_type, "EventJson": _json(body or {"run": run})}}
    common = {
        "EventId": event_id,
        "EventTypeId": event_type,
        "RetryCount": 0,
    }
    messages = [
        {
            "messageId": request_id,
            "sessionId": session_id or f"session-{run}",
            "correlationId": f"corr-{run}",
            "applicationProperties": {
                **common,
                "MessageType": "EventRequest",
                "To": endpoint,
                "From": "Erp",
                "OriginatingMessageId": "self",
                "ParentMessageId": "self",
                "OriginatingFrom": "self",
            },
            "body": content,
        },
        {
            "messageId": f"handoff-{run}",
            "sessionId": session_id or f"session-{run}",
            "correlationId": request_id,
            "applicationProperties": {
                **common,
                "MessageType": "PendingHandoffResponse",
                "To": "Resolver",
                "From": endpoint,
                "OriginatingMessageId": request_id,
                "ParentMessageId": request_id,
                "OriginatingFrom": "Erp",
                "HandoffReason": "Posting in the ledger",
                "ExternalJobId": f"job-{run}",
                "ExpectedBy": "2030-01-01T00:00:00.0000000Z",
            },
            "body": content,
        },
    ]
    for message in messages:
        answer = httpx.post(f"{host.base_url}/admin/functions/resolver", json=message, timeout=WAIT_S)
        assert answer.status_code == 202, answer.text
    return event_id


def _json(value: Any) -> str:
    import json

    return json.dumps(value)
