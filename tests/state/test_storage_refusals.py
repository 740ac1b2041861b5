"""What storage answers on the wire, through the real SDK pipeline and store, reaches the caller mapped.

``tests/test_http_errors.py`` maps exceptions built by hand; here Table Storage itself answers (a policy
at the transport end replaces the answer of every request with the status the service sends when it
throttles or fails), so the path through ``azure-data-tables``' own error handling, the store's
transaction handling and the HTTP layer is the one production takes. Every state operation must answer
503 problem+json with ``Retry-After``, never a 500.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from azure.core.pipeline import PipelineResponse
from azure.core.pipeline.policies import HTTPPolicy
from azure.core.pipeline.transport import RequestsTransportResponse

from common import runtime
from tests.state.conftest import State, new_key

# (status, Table error code, Retry-After): throttling and server errors as Table Storage reports them.
ANSWERS = [
    (429, "TooManyRequests", "7"),
    (503, "ServerBusy", None),
    (500, "InternalError", None),
]


class StorageAnswers(HTTPPolicy):  # type: ignore[type-arg]
    """Once armed, answers every Table request itself with ``status`` (nothing reaches storage)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: tuple[int, str, str | None] | None = None
        self.answered = 0

    def send(self, request: Any) -> Any:
        if self.answer is None:
            return self.next.send(request)
        status, code, retry_after = self.answer
        self.answered += 1
        raw = requests.Response()
        raw.status_code = status
        raw.reason = code
        raw.headers["Content-Type"] = "application/json;odata=minimalmetadata"
        raw.headers["x-ms-error-code"] = code
        if retry_after is not None:
            raw.headers["Retry-After"] = retry_after
        body = {"odata.error": {"code": code, "message": {"lang": "en-US", "value": f"{code} (test)"}}}
        raw._content = json.dumps(body).encode()
        raw.url = request.http_request.url
        response = RequestsTransportResponse(request.http_request, raw)
        return PipelineResponse(request.http_request, response, request.context)


@pytest.fixture
def storage() -> Any:
    policy = StorageAnswers()
    runtime.reset(policies=[policy], client_options={"retry_total": 0})
    yield policy
    runtime.reset()


OPERATIONS = ["exists", "get", "lock", "set", "upsert", "release", "extend", "history", "query"]


@pytest.mark.parametrize("answer", ANSWERS, ids=lambda a: str(a[0]))
@pytest.mark.parametrize("operation", OPERATIONS)
def test_storage_throttling_or_failing_is_503_with_retry_after_for_every_operation(
    storage, call, operation, answer
):
    # Given a record locked before storage starts to refuse (the signing key is loaded, a token held)
    state = State(call)
    key = new_key()
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    bodies: dict[str, dict[str, Any]] = {
        "exists": {"key": key},
        "get": {"key": key},
        "lock": {"key": new_key()},
        "set": {"key": key, "status": "Processed", "lockToken": token},
        "upsert": {"key": key, "data": {"n": 1}},
        "release": {"key": key, "error": "gave up", "lockToken": token},
        "extend": {"key": key, "lockToken": token, "lockSeconds": 60},
        "history": {"key": key},
        "query": {"tenantId": 1},
    }
    # When every storage request is answered with the throttling/failure status
    storage.answer = answer
    name = "state_lock_extend" if operation == "extend" else f"state_{operation}"
    result = call(name, bodies[operation])
    # Then the caller gets 503 problem+json with Retry-After (storage's own when it sent one), never a 500
    assert storage.answered >= 1
    assert result.status == 503, (result.status, result.body[:300])
    assert result.content_type.startswith("application/problem+json")
    expected = int(answer[2]) if answer[2] is not None else None
    retry_after = int(result.headers["retry-after"])
    assert retry_after >= 1 and (expected is None or retry_after == expected)
    assert result.json["type"] == "urn:settle:problem:unavailable"
    # and once storage answers again the record is as it was: locked by the same token
    storage.answer = None
    assert state.set(key, status="Processed", lockToken=token).status == 200
