"""Throttled writes: storage's 503 ``ServerBusy`` says the request
was refused before it was received ("The server is currently unable to receive requests. Please retry your
request.", Azure Storage common REST API error codes; such requests are not even billed, Storage Analytics
"ThrottlingError ... 503 ... Billable: No"), so a write refused that way is sent again without reading the
head back. An answer that leaves the outcome open (500 ``OperationTimedOut``: "could not be completed
within the permitted time", billable; a 503 without storage's ``ServerBusy`` code, from something in
between) is still settled by one read of the head."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from azure.core.pipeline import PipelineResponse
from azure.core.pipeline.policies import HTTPPolicy
from azure.core.pipeline.transport import RequestsTransportResponse

from common import runtime
from tests.state.conftest import State, new_key
from tests.support.state_calls import state_writes, versions


class Answer(HTTPPolicy):  # type: ignore[type-arg]
    """Answers the next matching request with ``status`` / ``code``, after letting it reach storage
    (``apply=True``: the write is applied, its answer is not the real one) or without (``apply=False``:
    refused before storage saw it, as Azure's throttling does). Counts what reached storage after that."""

    def __init__(self) -> None:
        super().__init__()
        self.left = 0
        self.match: Callable[[Any], bool] = lambda request: False
        self.status, self.apply = 503, False
        self.code: str | None = "ServerBusy"
        self.answered = 0
        self.after: list[str] = []  # "GET" / "POST" ... of every request after the first answered one

    def arm(
        self, status: int, code: str | None, *, apply: bool, match: Callable[[Any], bool], times: int = 1
    ) -> None:
        self.status, self.code, self.apply, self.match, self.left = status, code, apply, match, times

    def send(self, request: Any) -> Any:
        http = request.http_request
        hit = self.left > 0 and self.match(http)
        if self.answered:
            self.after.append(http.method)
        response = None if hit and not self.apply else self.next.send(request)
        if not hit:
            return response
        self.left -= 1
        self.answered += 1
        raw = requests.Response()
        raw.status_code = self.status
        raw.reason = "Server Busy" if self.status == 503 else "Operation Timeout"
        raw.headers["Content-Type"] = "application/json;odata=minimalmetadata"
        body: dict[str, Any] = {}
        if self.code is not None:
            raw.headers["x-ms-error-code"] = self.code
            body = {"odata.error": {"code": self.code, "message": {"lang": "en-US", "value": "(test)"}}}
        raw._content = json.dumps(body).encode()
        raw.url = http.url
        return PipelineResponse(http, RequestsTransportResponse(http, raw), request.context)


@pytest.fixture
def answer() -> Iterator[Answer]:
    policy = Answer()
    runtime.reset(policies=[policy])  # the SDK's own retries stay on, as in production
    yield policy
    runtime.reset()


def _run(state: State, key: dict[str, Any], operation: str, token: str) -> Any:
    if operation == "lock":
        return state.lock(key, lockSeconds=60)
    if operation == "set-fenced":
        return state.set(key, status="Processed", lockToken=token)
    return state.extend(key, lockToken=token, lockSeconds=120)


def _prepared(state: State, operation: str) -> tuple[dict[str, Any], str, list[int]]:
    key = new_key()
    if operation == "lock":
        state.exists(key)  # the signing key and the clock are ready; only the lock's own write is hit
        return key, "", []
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    return key, token, versions(state, key)


@pytest.mark.parametrize("times", [1, 3])
@pytest.mark.parametrize("operation", ["lock", "set-fenced", "extend"])
def test_a_throttled_write_storage_never_received_is_sent_again_without_a_read(
    call, answer, operation: str, times: int
) -> None:
    state = State(call)
    key, token, before = _prepared(state, operation)
    answer.arm(503, "ServerBusy", apply=False, match=state_writes, times=times)
    result = _run(state, key, operation, token)
    assert answer.answered == times
    assert result.status == 200, result.body
    # Sent again (after a back-off) until admitted, and nothing read: ServerBusy means not received.
    assert answer.after == ["POST"] * times, answer.after
    added = [] if operation == "extend" else [(before[0] if before else 0) + 1]
    assert versions(state, key) == [*added, *before]


@pytest.mark.parametrize(
    ("status", "code"), [(500, "OperationTimedOut"), (503, None)], ids=["OperationTimedOut", "503-no-code"]
)
@pytest.mark.parametrize("operation", ["lock", "set-fenced", "extend"])
def test_an_answer_that_leaves_the_outcome_open_is_settled_by_the_read_back(
    call, answer, operation: str, status: int, code: str | None
) -> None:
    """The write WAS applied; its answer says only that it did not finish in time (or comes from something
    other than storage's throttling). One read of the head finds this call's own version: success, and
    no second write (a second write would conflict with, or duplicate, the first)."""
    state = State(call)
    key, token, before = _prepared(state, operation)
    answer.arm(status, code, apply=True, match=state_writes)
    result = _run(state, key, operation, token)
    assert answer.answered == 1
    assert result.status == 200, result.body
    if operation == "lock":
        assert result.json["acquired"] is True, result.json
    assert answer.after == ["GET"], answer.after  # the read-back, and nothing written again
    added = [] if operation == "extend" else [(before[0] if before else 0) + 1]
    assert versions(state, key) == [*added, *before]
