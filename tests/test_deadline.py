"""The invocation deadline (common/invocation.py) without storage: the table clients' retry policy spends no
more than what is left of it, the write watch tells a write storage may have applied from one it refused,
and the HTTP layer answers a spent deadline 503 with Retry-After, saying when a write's outcome is unknown.
The same against a paused Azurite: tests/devhost/test_deadline_host.py."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import pytest
import requests
from azure.core.exceptions import ServiceResponseError, ServiceResponseTimeoutError
from azure.core.pipeline import Pipeline
from azure.core.pipeline.transport import HttpRequest, RequestsTransportResponse

from common import invocation
from common.http import DEADLINE_RETRY_AFTER_S, guard
from common.table_retry import SettleRetryPolicy
from common.tables import WRITE_WATCH
from tests.support.scripted_storage import Scripted

URL = "http://127.0.0.1:1/devstoreaccount1/settlestate"


class _Config:
    timeout = 10.0
    read_timeout = 30.0


class Clock:
    """The deadlines' clock (``invocation.clock``), moved only by what the test's storage spends."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """One clock for the deadline and for the SDK's retry loops (which count their timeout by
    ``time.time()``), so no figure depends on how busy the machine is."""
    from azure.core.pipeline.policies import _retry
    from azure.data.tables import _policies

    fake = Clock()
    monkeypatch.setattr(invocation, "clock", fake)
    for module in (_retry, _policies):  # the tables client's retry loop is its own copy of azure-core's
        monkeypatch.setattr(module, "time", SimpleNamespace(time=fake, sleep=lambda seconds: None))
    return fake


class Slow(Scripted):
    """A scripted storage that takes ``delay`` seconds of ``clock`` to fail each attempt (and its back-off
    sleeps take theirs), and records the timeouts it was given (``connection_config`` as the requests
    transport has one)."""

    connection_config = _Config()

    def __init__(self, script: Any, delay: float = 0.0, clock: Clock | None = None) -> None:
        super().__init__(script)
        self.delay = delay
        self.clock = clock or Clock()
        self.timeouts: list[tuple[float, float]] = []

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.timeouts.append((kwargs.get("connection_timeout", 10.0), kwargs.get("read_timeout", 30.0)))
        self.clock.now += self.delay
        return super().send(request, **kwargs)

    def sleep(self, duration: float) -> None:
        super().sleep(duration)
        self.clock.now += duration


def run(transport: Scripted, method: str = "GET", url: str = URL) -> Any:
    pipeline = Pipeline(transport, policies=[SettleRetryPolicy(), WRITE_WATCH])
    return pipeline.run(HttpRequest(method, url))


def test_outside_an_invocation_nothing_changes() -> None:
    transport = Slow([ServiceResponseError("lost (test)"), (200, None)])
    run(transport)
    assert transport.timeouts == [(10.0, 30.0), (10.0, 30.0)]
    assert invocation.remaining() is None


@pytest.mark.parametrize("wrapped", [False, True], ids=["transport", "table-client-transport"])
def test_each_attempt_waits_no_longer_than_what_is_left_of_the_deadline(wrapped: bool) -> None:
    # A table client's transport is azure-data-tables' wrapper around the service client's: the timeouts
    # are found on the transport it wraps (missing it left a paused storage 30 s per attempt).
    from azure.data.tables._base_client import TransportWrapper

    transport = Slow([ServiceResponseError("lost (test)"), (200, None)])
    pipeline = Pipeline(TransportWrapper(transport) if wrapped else transport, policies=[SettleRetryPolicy()])
    with invocation.within(2.0):
        pipeline.run(HttpRequest("GET", URL))
    assert all(connect <= 2.0 and read <= 2.0 for connect, read in transport.timeouts), transport.timeouts


def test_once_the_deadline_is_spent_nothing_more_is_sent(clock: Clock) -> None:
    # Storage that never answers: each attempt fails after 0.2 s; the SDK would try 4 times (and back off).
    transport = Slow([ServiceResponseError("no answer (test)")] * 10, delay=0.2, clock=clock)
    started = clock.now
    with invocation.within(0.5), pytest.raises(ServiceResponseError):
        run(transport)
    took = clock.now - started
    assert took <= 0.5 + 0.2 + 1e-9, took  # one attempt's overrun at most (here its scripted delay)
    assert transport.sent <= 3


def test_a_back_off_never_sleeps_past_the_deadline(clock: Clock) -> None:
    # 503 with Retry-After: 100 (a throttled storage): the policy would sleep 100 s; the deadline says 0.3.
    class Throttled(Slow):
        def send(self, request: Any, **kwargs: Any) -> Any:
            response = super().send(request, **kwargs)
            response.internal_response.headers["Retry-After"] = "100"
            response.headers["Retry-After"] = "100"
            return response

    transport = Throttled([(503, None)] * 5, clock=clock)
    started = clock.now
    with invocation.within(0.3), pytest.raises(ServiceResponseTimeoutError):
        run(transport)
    assert clock.now - started <= 0.3 + 1e-9  # slept no further than the deadline, in all
    assert max(transport.slept) <= 0.3


def _answered(script: Any, method: str = "POST", url: str = URL, batch_status: int | None = None) -> bool:
    """Whether the watch counts a write storage may have applied after ``script``."""

    class Batch(Slow):
        def send(self, request: Any, **kwargs: Any) -> Any:
            if batch_status is None:
                return super().send(request, **kwargs)
            raw = requests.Response()
            raw.status_code = 202
            raw._content = f"--batch\r\nHTTP/1.1 {batch_status} X\r\n".encode()
            raw.url = request.url
            self.sent += 1
            return RequestsTransportResponse(request, raw)

    with invocation.within(5.0) as budget:
        try:
            pipeline = Pipeline(Batch(script), policies=[SettleRetryPolicy(retry_total=0), WRITE_WATCH])
            pipeline.run(HttpRequest(method, url))
        except ServiceResponseError:
            pass
        return budget.maybe_written


def test_the_write_watch_tells_a_write_storage_may_have_applied_from_one_it_refused() -> None:
    assert _answered([(204, None)]) is True  # applied
    assert _answered([ServiceResponseError("no answer (test)")]) is True  # unknown
    assert _answered([(500, "OperationTimedOut")]) is True  # unknown
    assert _answered([(412, "UpdateConditionNotSatisfied")]) is False
    assert _answered([(503, "ServerBusy")]) is False  # storage's own "not received"
    assert _answered([], url=URL + "/$batch", batch_status=412) is False  # a refused transaction
    assert _answered([], url=URL + "/$batch", batch_status=201) is True
    assert _answered([ServiceResponseError("no answer (test)")], method="GET") is False  # a read
    assert _answered([ServiceResponseError("no answer (test)")], url="http://h/acct/Tables") is False


def _guarded(handler: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    response = guard(handler)(func.HttpRequest("POST", "http://h/api/v1/state/lock", body=b"{}"))
    return response.status_code, dict(response.headers), json.loads(response.get_body())


def test_a_spent_deadline_is_a_503_with_retry_after_and_a_write_says_its_outcome_is_unknown(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    monkeypatch.setenv(invocation.HTTP_DEADLINE_SETTING, "0.2")

    def lock(req: func.HttpRequest) -> None:
        budget = invocation.current()
        assert budget is not None and budget.seconds == pytest.approx(0.2)
        budget.sent_write()  # the lock's write went out; no answer came back
        clock.now += budget.remaining()
        raise ServiceResponseTimeoutError("Response timeout")

    status, headers, problem = _guarded(lock)
    assert status == 503 and problem["type"] == "urn:settle:problem:unavailable"
    assert headers["Retry-After"] == str(DEADLINE_RETRY_AFTER_S) == str(problem["retryAfter"])
    assert "0.2 s deadline" in problem["detail"]
    assert problem["outcome"] == "unknown" and "outcome is unknown" in problem["detail"]


def test_a_read_past_the_deadline_claims_nothing_about_writes(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    monkeypatch.setenv(invocation.HTTP_DEADLINE_SETTING, "0.1")

    def exists(req: func.HttpRequest) -> None:
        clock.now += 0.15
        raise ServiceResponseTimeoutError("Response timeout")

    status, headers, problem = _guarded(exists)
    assert status == 503 and "Retry-After" in headers
    assert "outcome" not in problem and "deadline" in problem["detail"]


def test_the_http_deadline_is_20_seconds_unless_the_setting_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(invocation.HTTP_DEADLINE_SETTING, raising=False)
    assert invocation.http_deadline() == invocation.HTTP_DEADLINE_S == 20.0
    for bad in ("", "x", "0", "-3"):
        monkeypatch.setenv(invocation.HTTP_DEADLINE_SETTING, bad)
        assert invocation.http_deadline() == 20.0
    monkeypatch.setenv(invocation.HTTP_DEADLINE_SETTING, "3")
    assert invocation.http_deadline() == 3.0


def test_a_nested_invocation_ends_no_later_than_the_one_around_it() -> None:
    with invocation.within(1.0), invocation.within(100.0) as inner:
        assert inner.remaining() <= 1.0


def test_a_long_poll_has_its_wait_on_top_of_the_deadline() -> None:
    # ``next?waitSeconds=20`` polls for 20 s: its last read must not find the 20 s deadline spent.
    from handoff.receive.receiver import long_poll

    with invocation.within(20.0) as budget:
        with long_poll(15.0):
            assert budget.remaining() > 34.0
        with long_poll(0):
            assert budget.remaining() <= 35.0
