"""Retry timing and safety, with ``httpx.MockTransport`` (no server: only the client's own decisions).

Sleeps are recorded, not slept. What the server answers is scripted per test.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from settle_client import (
    AsyncSettleClient,
    Conflict,
    InvalidInput,
    LockLost,
    NotFound,
    RetryPolicy,
    ServerError,
    SettleClient,
    TransportFailure,
    Unauthorized,
    Unavailable,
)
from settle_client.errors import retry_after_of

from tests.client.conftest import some

KEY = {"tenantId": 1, "scopeId": 4, "entityId": 1, "itemEntityKey": "invoice", "itemKey": "INV-1"}
NO_JITTER = RetryPolicy(attempts=4, backoff=0.5, max_backoff=8.0, jitter=False)
RECORD = {
    "tenantId": 1,
    "scopeId": 4,
    "scope": "Element",
    "entityId": 1,
    "itemKey": "INV-1",
    "itemEntityKey": "invoice",
    "status": "Processed",
    "statusCode": 1,
    "version": 2,
    "data": {"metadata": {}, "idempotencyInfo": {}, "data": {"posted": True}},
    "someFieldFromTheFuture": 1,
}


def problem(
    status: int, slug: str, *, field: str | None = None, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {"type": f"urn:settle:problem:{slug}", "title": slug, "status": status, "detail": f"{slug}!"}
    if field:
        body["field"] = field
    body.update(extra)
    return httpx.Response(
        status, json=body, headers={"content-type": "application/problem+json", **(headers or {})}
    )


def unavailable(retry_after: int = 1) -> httpx.Response:
    return problem(503, "unavailable", headers={"Retry-After": str(retry_after)}, retryAfter=retry_after)


class Script:
    """Answers requests from a list: an ``httpx.Response`` or an exception to raise."""

    def __init__(self, *answers: httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer) and not isinstance(answer, httpx.Response):
            return answer(request)
        return answer


def client_for(
    script: Script, retry: RetryPolicy = NO_JITTER, **kwargs: Any
) -> tuple[SettleClient, list[float]]:
    client = SettleClient("http://settle.test", transport=httpx.MockTransport(script), retry=retry, **kwargs)
    sleeps: list[float] = []
    client._sleep = sleeps.append
    return client, sleeps


def ok_exists(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"exists": True, "status": "Processed"})


# -- timing --------------------------------------------------------------------------------------------
def test_backoff_doubles_up_to_the_cap_then_the_error_is_raised_with_retry_after():
    script = Script(*(problem(503, "unavailable") for _ in range(4)))
    client, sleeps = client_for(script)
    with pytest.raises(Unavailable) as error:
        client.exists(KEY)
    assert sleeps == [0.5, 1.0, 2.0] and len(script.requests) == 4
    assert error.value.status == 503 and error.value.retry_after is None

    capped = RetryPolicy(attempts=6, backoff=1, max_backoff=3, jitter=False)
    assert [capped.delay(n) for n in range(1, 7)] == [1, 2, 3, 3, 3, None]


def test_retry_after_is_honoured_never_shortened():
    script = Script(
        unavailable(retry_after=3), problem(429, "throttled", headers={"Retry-After": "0"}), ok_exists
    )
    client, sleeps = client_for(script)
    assert client.exists(KEY) is True
    assert sleeps == [3.0, 1.0]  # Retry-After 3 beats backoff 0.5; backoff 1.0 beats Retry-After 0


def test_retry_after_from_the_body_and_as_an_http_date():
    body_only = httpx.Response(503, json={"type": "urn:settle:problem:unavailable", "retryAfter": 7})
    assert retry_after_of(body_only) == 7
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 20 < some(retry_after_of(httpx.Response(503, headers={"Retry-After": later}))) <= 30
    assert retry_after_of(httpx.Response(503, headers={"Retry-After": "soon"})) is None


def test_a_retry_after_beyond_the_limit_is_not_waited_out():
    script = Script(unavailable(retry_after=600))
    client, sleeps = client_for(script)
    with pytest.raises(Unavailable) as error:
        client.exists(KEY)
    assert sleeps == [] and error.value.retry_after == 600


def test_jitter_stays_in_the_upper_half_of_the_backoff():
    policy = RetryPolicy(backoff=1, max_backoff=8)
    rng = random.Random(7)
    for retry, ceiling in [(1, 1), (2, 2), (3, 4), (4, 8), (9, 8)]:
        for _ in range(50):
            assert ceiling / 2 <= policy.backoff_for(retry, rng) <= ceiling


def test_one_attempt_means_no_retry():
    script = Script(unavailable())
    client, sleeps = client_for(script, retry=RetryPolicy(attempts=1))
    with pytest.raises(Unavailable):
        client.exists(KEY)
    assert sleeps == []


# -- safety -------------------------------------------------------------------------------------------
def test_an_unfenced_write_is_not_retried_after_a_503():
    script = Script(unavailable())
    client, sleeps = client_for(script)
    with pytest.raises(Unavailable):
        client.set(KEY, "Processed", data={"posted": True})
    assert len(script.requests) == 1 and sleeps == []


def test_an_unfenced_write_is_retried_when_the_connection_never_opened():
    script = Script(httpx.ConnectError("refused"), httpx.Response(200, json=RECORD))
    client, sleeps = client_for(script)
    record = client.set(KEY, "Processed", data={"posted": True})
    assert record is not None and record.data == {"posted": True}
    assert len(script.requests) == 2 and sleeps == [0.5]


def test_an_unfenced_write_whose_answer_was_lost_is_not_retried():
    script = Script(httpx.ReadTimeout("slow"))
    client, _ = client_for(script)
    with pytest.raises(TransportFailure) as error:
        client.release(KEY, "boom")
    assert error.value.maybe_applied is True and len(script.requests) == 1


def test_fenced_writes_extend_and_reads_are_retried_after_a_lost_answer():
    script = Script(
        httpx.ReadError("reset"),
        httpx.Response(200, json=RECORD),
        httpx.RemoteProtocolError("eof"),
        httpx.Response(200, json={"lockToken": "v2.opaque", "lockedUntil": "2030-01-01T00:00:00Z"}),
    )
    client, sleeps = client_for(script)
    assert some(client.set(KEY, "Processed", lock_token="v1.opaque")).status == "Processed"
    assert client.extend(KEY, "v1.opaque").lock_token == "v2.opaque"
    assert sleeps == [0.5, 0.5]


def test_a_lock_is_retried_with_the_same_request_id():
    script = Script(
        httpx.ReadError("reset"),
        unavailable(),
        httpx.Response(
            200, json={"acquired": True, "lockToken": "t", "status": "Processing", "replayed": True}
        ),
    )
    client, _ = client_for(script)
    lock = client.lock(KEY, lock_seconds=60)
    assert lock.acquired and lock.replayed
    ids = {json.loads(r.content)["requestId"] for r in script.requests}
    assert len(ids) == 1 and len(script.requests) == 3


def test_a_settlement_is_retried_after_a_503_and_after_a_lost_answer():
    accepted = {
        "endpointId": "Billing",
        "eventId": "e",
        "messageType": "HandoffCompletedRequest",
        "controlMessageId": "c",
        "confirmed": True,
    }
    coordinates = {"eventId": "e", "sessionId": "s", "messageId": "m"}
    script = Script(unavailable(), httpx.Response(202, json=accepted))
    client, sleeps = client_for(script)
    assert client.handoffs.complete("Billing", coordinates).control_message_id == "c"
    assert sleeps == [1.0]

    replayed = {**accepted, "replayed": True}
    lost = Script(httpx.ReadTimeout("slow"), httpx.Response(202, json=replayed))
    client, _ = client_for(lost)
    assert client.handoffs.fail("Billing", coordinates, "rejected").replayed
    assert len(lost.requests) == 2
    assert lost.requests[0].content == lost.requests[1].content  # the very same settlement


def test_async_client_retries_the_same_way():
    script = Script(unavailable(retry_after=2), ok_exists)
    client = AsyncSettleClient("http://settle.test", transport=httpx.MockTransport(script), retry=NO_JITTER)
    sleeps: list[float] = []

    async def record_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    client._sleep = record_sleep

    async def scenario() -> bool:
        async with client:
            return await client.exists(KEY)

    assert asyncio.run(scenario()) is True
    assert sleeps == [2.0]


# -- answers become typed errors -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "error", "slug"),
    [
        (problem(409, "lock-lost", field="lockToken"), LockLost, "lock-lost"),
        (problem(409, "settlement-in-flight"), Conflict, "settlement-in-flight"),
        (problem(400, "invalid-input", field="key.itemKey"), InvalidInput, "invalid-input"),
        (problem(404, "route-not-found"), NotFound, "route-not-found"),
        (httpx.Response(401), Unauthorized, None),
        (problem(500, "internal-error"), ServerError, "internal-error"),
    ],
)
def test_problem_answers_become_typed_errors(answer, error, slug):
    client, _ = client_for(Script(answer))
    with pytest.raises(error) as raised:
        client.set(KEY, "Processed", lock_token="v1.t")
    assert raised.value.status == answer.status_code
    assert raised.value.type == (f"urn:settle:problem:{slug}" if slug else None)
    if answer.status_code in (400, 409) and slug != "settlement-in-flight":
        assert raised.value.field in {"lockToken", "key.itemKey"}


def test_a_settle_not_found_is_none_and_an_unreadable_body_is_a_server_error():
    client, _ = client_for(Script(problem(404, "not-found"), httpx.Response(200, text="<html>")))
    assert client.get(KEY) is None
    with pytest.raises(ServerError):
        client.get(KEY)


# -- settings ----------------------------------------------------------------------------------------
def test_function_key_and_bearer_token_headers():
    script = Script(ok_exists, ok_exists, ok_exists)
    client, _ = client_for(script, function_key="k1", agent_id="agent-7")
    client.exists(KEY)
    assert script.requests[0].headers["x-functions-key"] == "k1"
    assert script.requests[0].headers["x-agent-id"] == "agent-7"

    class Credential:
        def __init__(self) -> None:
            self.scopes: list[tuple[str, ...]] = []

        def get_token(self, *scopes: str, **kwargs: Any) -> Any:
            self.scopes.append(scopes)
            return type(
                "Token", (), {"token": "jwt-1", "expires_on": int(datetime.now(UTC).timestamp()) + 3600}
            )

    credential = Credential()
    client, _ = client_for(script, credential=credential, token_scope="api://settle/.default")
    client.exists(KEY)
    client.exists(KEY)
    assert [r.headers["authorization"] for r in script.requests[1:]] == ["Bearer jwt-1"] * 2
    assert credential.scopes == [("api://settle/.default",)]  # cached until shortly before expiry

    with pytest.raises(ValueError, match="token_scope"):
        SettleClient("http://settle.test", credential=credential)


def test_a_long_poll_extends_the_read_timeout_by_its_wait():
    seen: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        assert request.url.params.get_list("eventTypeId") == ["A", "B"]
        assert request.url.params["waitSeconds"] == "15"
        return httpx.Response(204)

    client, _ = client_for(Script(answer), timeout=5.0)
    assert client.handoffs.next("Billing", event_types=["A", "B"], wait_seconds=15) is None
    assert seen[0]["read"] == 20.0 and seen[0]["connect"] == 5.0
