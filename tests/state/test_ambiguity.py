"""Storage answers that leave a write ambiguous, and clocks that are not what they seem: a retried write whose
first attempt was applied gets back what it wrote; a lock whose answer was lost is the caller's own; one call
writes one version; every expiry judgement allows for the clock estimate's uncertainty."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests
from azure.core.pipeline import PipelineResponse
from azure.core.pipeline.policies import HTTPPolicy
from azure.core.pipeline.transport import RequestsTransportResponse

from common import runtime
from common.clock import SERVER_CLOCK, utcnow
from state import service
from tests.state.conftest import State, new_key
from tests.support.state_calls import state_writes, versions


class ApplyThenLose(HTTPPolicy):  # type: ignore[type-arg]
    """Lets a matching request reach storage (it is applied), then loses its answer: the caller sees a
    500 as if the connection had dropped after the write. ``arm(n, match)``: the next n matching ones."""

    def __init__(self) -> None:
        super().__init__()
        self.apply = True  # False: the request never reaches storage (lost on the way there)
        self.left = 0
        self.match: Callable[[Any], bool] = lambda request: False
        self.lost = 0
        self.writes = 0

    def arm(self, times: int, match: Callable[[Any], bool]) -> None:
        self.left, self.match = times, match

    def send(self, request: Any) -> Any:
        http = request.http_request
        hit = self.left > 0 and self.match(http)
        if hit and not self.apply:
            response = None
        else:
            response = self.next.send(request)
            if http.method in ("POST", "PUT", "PATCH", "MERGE", "DELETE"):
                self.writes += 1
        if not hit:
            return response
        self.left -= 1
        self.lost += 1
        raw = requests.Response()
        raw.status_code = 500
        raw.reason = "InternalError"
        raw.headers["Content-Type"] = "application/json;odata=minimalmetadata"
        raw.headers["x-ms-error-code"] = "InternalError"
        body = {
            "odata.error": {"code": "InternalError", "message": {"lang": "en-US", "value": "lost (test)"}}
        }
        raw._content = json.dumps(body).encode()
        raw.url = http.url
        return PipelineResponse(http, RequestsTransportResponse(http, raw), request.context)


@pytest.fixture
def lose() -> Iterator[ApplyThenLose]:
    policy = ApplyThenLose()
    runtime.reset(policies=[policy])  # the SDK's own retries stay on, as in production
    yield policy
    runtime.reset()


# --- a lock whose answer was lost is the caller's own -------------------------------------------------------


def test_a_lock_whose_answer_storage_lost_is_acquired_not_someone_elses(call, lose) -> None:
    state = State(call)
    key = new_key()
    state.exists(key)  # the signing key and the clock are ready; only the lock's own write is hit
    lose.arm(1, state_writes)
    answer = state.lock(key, lockSeconds=60)
    assert lose.lost == 1
    assert answer.status == 200, answer.body
    assert answer.json["acquired"] is True, answer.json
    token = answer.json["lockToken"]
    assert state.set(key, status="Processed", lockToken=token).status == 200
    assert versions(state, key) == [2, 1]


@pytest.mark.parametrize("operation", ["extend", "set-unfenced", "set-fenced", "relock-failed"])
def test_one_call_writes_one_version_when_its_answer_is_lost(call, lose, operation: str) -> None:
    state = State(call)
    key = new_key()
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    if operation == "relock-failed":
        assert state.release(key, lockToken=token, error="boom").status == 200
    before = versions(state, key)
    lose.arm(1, state_writes)
    if operation == "extend":
        answer = state.extend(key, lockToken=token, lockSeconds=120)
    elif operation == "set-unfenced":
        answer = state.set(key, status="Processed")
    elif operation == "set-fenced":
        answer = state.set(key, status="Processed", lockToken=token)
    else:
        answer = state.lock(key, lockSeconds=60)
        assert answer.json["acquired"] is True, answer.json
    assert lose.lost == 1
    assert answer.status == 200, answer.body
    # An extension rewrites the lock in place: it adds no version; every other write adds one.
    added = [] if operation == "extend" else [before[0] + 1]
    assert versions(state, key) == [*added, *before]


@pytest.mark.parametrize("operation", ["extend", "set-unfenced", "set-fenced", "relock-failed"])
def test_a_write_lost_before_it_reached_storage_is_sent_once_more(call, lose, operation: str) -> None:
    """The read-back finds the head as it was (same ETag): nothing was written, so the write goes out
    once more, also for an extension, whose rewrite keeps the head's Version."""
    state = State(call)
    key = new_key()
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    if operation == "relock-failed":
        assert state.release(key, lockToken=token, error="boom").status == 200
    before = versions(state, key)
    lose.apply = False
    lose.arm(1, state_writes)
    if operation == "extend":
        answer = state.extend(key, lockSeconds=120, lockToken=token)
    elif operation == "set-unfenced":
        answer = state.set(key, status="Processed")
    elif operation == "set-fenced":
        answer = state.set(key, status="Processed", lockToken=token)
    else:
        answer = state.lock(key, lockSeconds=60)
    assert lose.lost == 1
    assert answer.status == 200, answer.body
    if operation == "relock-failed":
        assert answer.json["acquired"] is True, answer.json
    added = [] if operation == "extend" else [before[0] + 1]
    assert versions(state, key) == [*added, *before]


# --- a retried fenced write whose first attempt was applied returns the record it wrote ---------------------


def test_a_retried_release_after_someone_relocked_returns_the_record_it_wrote(state, key) -> None:
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    first = state.release(key, lockToken=token, error="ERP down")  # applied; say its answer was lost
    assert first.status == 200
    assert state.lock(key, lockSeconds=60).json["acquired"] is True  # another worker takes the Failed record
    retried = state.release(key, lockToken=token, error="ERP down")
    assert retried.status == 200, retried.body
    assert (retried.json["version"], retried.json["error"]) == (first.json["version"], "ERP down")
    # a different request with the same token is still refused, and nothing was written by either
    other = state.release(key, lockToken=token, error="something else")
    assert other.status == 409
    assert versions(state, key)[0] == first.json["version"] + 1


def test_a_retried_set_after_the_record_expired_and_was_relocked_returns_the_record_it_wrote(
    state, key
) -> None:
    handler = {"options": {"retentionSeconds": 1}}
    token = state.lock(key, lockSeconds=60, handler=handler).json["lockToken"]
    first = state.set(key, status="Processed", lockToken=token, handler=handler)
    assert first.status == 200
    service.catchup().run(now=utcnow() + timedelta(seconds=120))  # retention over: Expired
    assert state.lock(key, lockSeconds=60, handler=handler).json["acquired"] is True
    retried = state.set(key, status="Processed", lockToken=token, handler=handler)
    assert retried.status == 200, retried.body
    assert retried.json["version"] == first.json["version"]


@pytest.mark.parametrize("write", ["set", "release"])
def test_a_retried_fenced_write_after_catch_up_expired_its_record_returns_the_record_it_wrote(
    state, key, write: str
) -> None:
    """The retried write after catch-up's Expired, on its own: the token's write was applied (its answer
    lost), then catch-up concluded the record Expired (retention over) and nobody re-locked it. The retry is
    answered with the record it wrote, not "lock lost"; it writes nothing, and another request with the token
    is still refused."""
    handler = {"options": {"retentionSeconds": 1}}
    token = state.lock(key, lockSeconds=60, handler=handler).json["lockToken"]

    def send(**changes: Any) -> Any:
        if write == "set":
            return state.set(key, lockToken=token, handler=handler, **{"status": "Processed", **changes})
        return state.release(key, lockToken=token, handler=handler, **{"error": "ERP down", **changes})

    first = send()  # applied; say its answer was lost
    assert first.status == 200, first.body
    service.catchup().run(now=utcnow() + timedelta(seconds=120))  # retention over: catch-up writes Expired
    head = state.get(key).json
    assert (head["status"], head["substatus"]) == ("Expired", "RetentionExpired")
    assert head["version"] == first.json["version"] + 1
    retried = send()
    assert retried.status == 200, retried.body
    assert retried.json["version"] == first.json["version"]
    assert retried.json["status"] == first.json["status"] == ("Processed" if write == "set" else "Failed")
    # nothing was written by the retry: the head is still catch-up's Expired version
    assert versions(state, key)[0] == first.json["version"] + 1
    assert state.get(key).json["status"] == "Expired"
    other = send(**({"status": "Skipped"} if write == "set" else {"error": "something else"}))
    assert other.status == 409, other.body
    assert other.json["type"] == "urn:settle:problem:lock-lost"
    assert versions(state, key)[0] == first.json["version"] + 1


# --- every expiry judgement allows for the clock estimate's uncertainty -------------------------------------


@pytest.fixture
def skewed(monkeypatch) -> Callable[[float, float], None]:
    """``skew(error_s, width_s)``: this instance's estimate of storage time is off by ``error_s`` and knows
    it only within ``width_s`` (a cold instance: one ``Date`` header, whole seconds)."""
    true_offset = SERVER_CLOCK.offset_s

    def skew(error_s: float, width_s: float) -> None:
        monkeypatch.setattr(SERVER_CLOCK, "observe", lambda *a, **k: None)
        monkeypatch.setattr(SERVER_CLOCK, "_offset_s", true_offset + error_s)
        monkeypatch.setattr(SERVER_CLOCK, "width_s", width_s)
        monkeypatch.setattr(SERVER_CLOCK, "_lo", true_offset + error_s - width_s / 2)
        monkeypatch.setattr(SERVER_CLOCK, "_hi", true_offset + error_s + width_s / 2)
        monkeypatch.setattr(SERVER_CLOCK, "_last_reading", float("-inf"))  # as after a restart

    return skew


def test_a_cold_instance_does_not_take_over_a_lock_its_clock_only_thinks_expired(state, key, skewed) -> None:
    assert state.lock(key, lockSeconds=10).json["acquired"] is True
    skewed(15.0, 40.0)  # it believes it is 15 s later than it is; it could be 20 s either way
    taker = state.lock(key, lockSeconds=10)
    assert taker.json["acquired"] is False, taker.json


def test_a_cold_catch_up_does_not_fail_a_lock_its_clock_only_thinks_expired(state, key, skewed) -> None:
    assert state.lock(key, lockSeconds=10).json["acquired"] is True
    skewed(15.0, 40.0)
    service.catchup().run()
    assert state.get(key).json["status"] == "Processing"


def test_a_cold_holder_s_fenced_write_is_refused_once_its_lock_may_have_expired(state, key, skewed) -> None:
    skewed(-20.0, 40.0)  # it believes it is 20 s earlier than it is: its 10 s lock is already over
    token = state.lock(key, lockSeconds=10).json["lockToken"]
    answer = state.set(key, status="Processed", lockToken=token)
    assert answer.status == 409, answer.body
    assert answer.json["type"] == "urn:settle:problem:lock-lost"


def test_a_confident_clock_still_takes_over_an_expired_lock(state, key, skewed) -> None:
    assert state.lock(key, lockSeconds=10).json["acquired"] is True
    skewed(15.0, 0.02)  # 15 s on, and sure of it (the lock expired 5 s ago by this clock)
    assert state.lock(key, lockSeconds=10).json["takeover"] is True
