"""The client's sans-I/O core: the requests it builds and what it decides after each attempt.

No server and no network: requests are built by the core (or caught by ``httpx.MockTransport``) and
read here. Ids travel in the query string of the twin routes, because the deployed Functions host
decodes ``%2F`` in a path before it matches routes (an id holding ``/`` in a path segment is a 404 there).
"""

from __future__ import annotations

import ast
import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from settle_client import AsyncSettleClient, RetryPolicy, SettleClient, TransportFailure, Unavailable
from settle_client import _calls as calls_module
from settle_client._calls import Call
from settle_client._core import ClientCore, Retry
from settle_client.handoffs import Handoff
from settle_client.operator import OperatorCalls
from settle_client.retry import Safety

PACKAGE = Path(__file__).resolve().parents[2] / "client" / "settle_client"
KEY = {"tenantId": 1, "scopeId": 4, "entityId": 1, "itemEntityKey": "invoice", "itemKey": "INV-1"}
COORDINATES = {"eventId": "e-1", "sessionId": "s-1", "messageId": "m-1"}

# Each reserved character alone, then all of them together: none may change the route or the query.
IDS = ["a/b", "50%", "50%2F", "c+d", "what?", "#7", "with space", "Zürich-€", "JOB/2026 17?x=1&y=%2B#f"]

core = ClientCore("http://settle.test")
requests = core.requests
ops = OperatorCalls(requests)


# (route under the api prefix, method, the ids in the query in order, the call for those ids)
ROUTES: list[tuple[str, str, tuple[str, ...], Callable[[list[str]], Call[Any]]]] = [
    ("v1/events", "GET", ("endpointId", "eventId"), lambda i: requests.event(i[0], i[1])),
    ("v1/handoffs/jobs", "GET", ("endpointId", "externalJobId"), lambda i: requests.job(i[0], i[1], Handoff)),
    (
        "v1/handoffs/next",
        "GET",
        ("endpointId",),
        lambda i: requests.next_handoff(i[0], Handoff, event_types=["A"], wait_seconds=5),
    ),
    (
        "v1/handoffs/receive",
        "POST",
        ("endpointId",),
        lambda i: requests.receive_handoff(i[0], Handoff, event_types=None, wait_seconds=0, lease_seconds=30),
    ),
    (
        "v1/handoffs/leases/renew",
        "POST",
        ("endpointId",),
        lambda i: requests.lease(i[0], "renew", "e", "t", 30),
    ),
    (
        "v1/handoffs/leases/release",
        "POST",
        ("endpointId",),
        lambda i: requests.lease(i[0], "release", "e", "t"),
    ),
    ("v1/endpoints/event", "GET", ("endpointId", "eventId"), lambda i: ops.event(i[0], i[1])),
    ("v1/endpoints/unconfirmed", "GET", ("endpointId",), lambda i: ops.unconfirmed(i[0]).page(None)),
    ("v1/endpoints/overdue", "GET", ("endpointId",), lambda i: ops.overdue(i[0]).page(None)),
    (
        "v1/endpoints/bulk",
        "POST",
        ("endpointId",),
        lambda i: ops.bulk("skip", i[0], ["e-1", "e-2"], reason="dup").page(None),
    ),
    *[
        (
            f"v1/events/{action}",
            "POST",
            ("endpointId", "eventId"),
            (lambda a: lambda i: ops.act(a, i[0], i[1], message_id="m", error_text="x"))(action),
        )
        for action in ("resubmit", "skip", "complete", "fail")
    ],
    (
        "v1/events/settlement/resolve",
        "POST",
        ("endpointId", "eventId"),
        lambda i: ops.resolve(i[0], i[1], message_id="m", resolution="released", reason="checked"),
    ),
    ("v1/poison/replay", "POST", ("day", "id"), lambda i: ops.replay(i[0], i[1], by="ops")),
    ("v1/poison/dismiss", "POST", ("day", "id"), lambda i: ops.dismiss(i[0], i[1], "no fix")),
]


@pytest.mark.parametrize("value", IDS)
@pytest.mark.parametrize(
    ("route", "method", "names", "build"), ROUTES, ids=[f"{r[1]} {r[0]}" for r in ROUTES]
)
def test_every_id_taking_call_sends_its_ids_in_the_query_of_the_twin_route(
    route: str, method: str, names: tuple[str, ...], build: Callable[[list[str]], Call[Any]], value: str
) -> None:
    ids = [f"{value}-{n}" for n in range(len(names))]
    request = core.request(build(ids), {})
    assert request.method == method
    assert request.url.path == f"/api/{route}"  # no id in the path: nothing for the host to decode
    sent = request.url.params.multi_items()
    assert sent[: len(names)] == list(zip(names, ids, strict=True))
    raw_query = request.url.query.decode("ascii")
    assert raw_query.startswith("&".join(f"{n}={quote(v, safe='')}" for n, v in zip(names, ids, strict=True)))
    assert "+" not in raw_query.split("&")[0], "a + in an id must travel as %2B"


def test_the_twin_form_is_the_default_and_the_path_form_encodes_each_id_as_one_segment(monkeypatch) -> None:
    assert calls_module.IDS_IN_QUERY is True
    monkeypatch.setattr(calls_module, "IDS_IN_QUERY", False)
    request = core.request(requests.job("Bill/ing", "JOB/2026 17", Handoff), {})
    assert request.url.raw_path == b"/api/v1/handoffs/Bill%2Fing/jobs/JOB%2F2026%2017"


def test_the_other_parameters_follow_the_ids() -> None:
    request = core.request(requests.next_handoff("a/b", Handoff, event_types=["X", "Y"], wait_seconds=5), {})
    assert request.url.params.multi_items() == [
        ("endpointId", "a/b"),
        ("eventTypeId", "X"),
        ("eventTypeId", "Y"),
        ("waitSeconds", "5"),
    ]


@pytest.mark.parametrize("empty", ["", None])
def test_an_empty_id_is_refused_before_sending(empty: str | None) -> None:
    with pytest.raises(ValueError, match="eventId must not be empty"):
        requests.event("Billing", empty)  # type: ignore[arg-type]


# -- Content-Length ------------------------------------------------------------------------------------
def test_every_request_with_a_body_or_a_post_sends_content_length_never_chunked() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith(("/receive", "/state/set", "/v1/events")):
            return httpx.Response(204)  # nothing to read: the test is about what was sent
        if request.url.path.endswith("/leases/renew"):
            return httpx.Response(200, json={"expiresAt": "2026-12-05T00:00:00Z"})
        if request.url.path.endswith("/handoffs/complete"):
            accepted = {"endpointId": "Billing", "eventId": "e-1", "messageType": "HandoffCompletedRequest"}
            return httpx.Response(202, json={**accepted, "controlMessageId": "c", "replayed": False})
        return httpx.Response(200, json={"exists": True})

    with SettleClient(
        "http://settle.test", transport=httpx.MockTransport(answer), handle_sigterm=False
    ) as client:
        client.exists(KEY)
        client.set(KEY, "Processed", data={"city": "Zürich", "big": "x" * 70_000}, lock_token="v1.t")
        client.handoffs.receive("Billing")
        client.send(client.requests.lease("Billing", "renew", "e-1", "t", 30))
        client.handoffs.complete("Billing", COORDINATES, result={"ok": True})
        client.events.get("Billing", "e-1")
    posts = [r for r in seen if r.method == "POST"]
    assert len(posts) == 5
    for request in posts:
        assert "transfer-encoding" not in request.headers
        assert int(request.headers["content-length"]) == len(request.content)
    assert [r.headers["content-length"] for r in posts if not r.content] == ["0"]  # the body-less receive
    for request in seen:
        assert "transfer-encoding" not in request.headers


# -- the retry decision, once for both clients ---------------------------------------------------------
def _exchange(safety: Safety, *, attempts: int = 4) -> Any:
    policy = RetryPolicy(attempts=attempts, backoff=0.5, jitter=False)
    core = ClientCore("http://settle.test", retry=policy)
    call: Call[bool] = Call("POST", "/api/x", lambda r: True, safety, body={"a": 1})
    exchange = core.exchange(call)
    exchange.request({})
    return exchange


def _unavailable(retry_after: int) -> httpx.Response:
    return httpx.Response(503, headers={"Retry-After": str(retry_after)}, json={"status": 503})


def test_an_idempotent_call_waits_at_least_retry_after_then_gives_up_with_the_error() -> None:
    exchange = _exchange(Safety.IDEMPOTENT, attempts=2)
    assert exchange.answered(_unavailable(2)) == Retry(2.0)
    exchange.request({})
    with pytest.raises(Unavailable):
        exchange.answered(_unavailable(2))


def test_an_unsafe_call_is_not_sent_again_after_a_503_or_a_lost_answer() -> None:
    with pytest.raises(Unavailable):
        _exchange(Safety.UNSAFE).answered(_unavailable(1))
    with pytest.raises(TransportFailure) as lost:
        _exchange(Safety.UNSAFE).failed(httpx.ReadTimeout("slow"))
    assert lost.value.maybe_applied


def test_an_unsafe_call_that_never_left_is_sent_again() -> None:
    assert _exchange(Safety.UNSAFE).failed(httpx.ConnectError("refused")) == Retry(0.5)


def test_both_clients_retry_and_log_alike(caplog) -> None:
    def script() -> Callable[[httpx.Request], httpx.Response]:
        answers = [_unavailable(1), httpx.Response(200, json={"exists": True})]
        return lambda request: answers.pop(0)

    caplog.set_level(logging.INFO, logger="settle_client")
    sync = SettleClient(
        "http://settle.test", transport=httpx.MockTransport(script()), retry=RetryPolicy(jitter=False)
    )
    sync_sleeps: list[float] = []
    sync._sleep = sync_sleeps.append
    assert sync.exists(KEY)
    sync_log = [r.getMessage() for r in caplog.records]
    caplog.clear()

    async_sleeps: list[float] = []

    async def record(seconds: float) -> None:
        async_sleeps.append(seconds)

    async def scenario() -> bool:
        async with AsyncSettleClient(
            "http://settle.test", transport=httpx.MockTransport(script()), retry=RetryPolicy(jitter=False)
        ) as client:
            client._sleep = record
            return await client.exists(KEY)

    assert asyncio.run(scenario())
    assert sync_sleeps == async_sleeps == [1.0]
    assert (
        [r.getMessage() for r in caplog.records]
        == sync_log
        == ["POST /api/v1/state/exists: 503; retrying in 1.00s"]
    )


# -- the package's shape ---------------------------------------------------------------------------------
def _imports(path: Path) -> set[str]:
    """The settle_client modules ``path`` imports, type-only and function-local imports included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("settle_client"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if (PACKAGE / f"{a.name}.py").exists())
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("settle_client."))
    return {name for name in found if name != "settle_client"}


def test_no_module_of_the_client_imports_one_that_imports_it_back() -> None:
    graph = {f"settle_client.{p.stem}": _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    circles = sorted(m for m in graph if reaches(m, m, {m}))
    assert circles == [], f"import circles through {circles}"
