"""Leased receive: agents that share an endpoint split its parked hand-offs.

A receive claims the oldest parked hand-off no one holds for a lease and answers it with a lease token;
hand-offs under a live lease are skipped (one unfinished hand-off never blocks the rest); a settlement
made with the token is fenced by it; one made without keeps today's rules; ``next`` stays non-claiming.
The transport projects (the broker model forwards at once); the clock is the test's.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from azure.core.pipeline import PipelineResponse
from azure.core.pipeline.policies import HTTPPolicy
from azure.core.pipeline.transport import RequestsTransportResponse

from common import runtime
from handoff import service
from tests.support.handoff_flows import Flow, lease_call, park, receive, settle_leased

from .broker import Broker, BrokerTransport


@pytest.fixture
def broker() -> Iterator[Broker]:
    broker = Broker(forward=True)
    service.use_transport(BrokerTransport(broker))
    yield broker
    service.reset()


@pytest.fixture
def clock() -> Iterator[list[datetime]]:
    now = [datetime.now(UTC)]
    receive = service.receive_service()
    receive.clock = lambda: now[0]
    yield now
    service.reset()


def parked_many(resolve: Any, endpoint: str, n: int) -> list[Flow]:
    base = datetime.now(UTC) - timedelta(hours=1)
    return [park(resolve, endpoint, f"ev-{i:03d}", at=base + timedelta(seconds=i)) for i in range(n)]


def test_agents_on_threads_split_the_parked_hand_offs_and_none_is_received_twice(call, resolve, broker):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    flows = {f.event_id: f for f in parked_many(resolve, endpoint, 12)}
    got: list[tuple[str, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def agent(name: str) -> None:
        barrier.wait(10)
        while True:
            answer = receive(call, endpoint, name)
            if answer.status == 204:
                return
            assert answer.status == 200, answer.body
            event_id = answer.json["coordinates"]["eventId"]
            with lock:
                got.append((name, event_id))
            settled = settle_leased(call, flows[event_id], answer.json["lease"]["token"], name)
            assert settled.status == 202, settled.body

    threads = [threading.Thread(target=agent, args=(f"agent-{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    received = [e for _, e in got]
    assert sorted(received) == sorted(flows)  # every hand-off received exactly once
    assert len(broker.delivered) == 12


def test_an_unfinished_hand_off_never_blocks_the_ones_behind_it(call, resolve, broker, clock):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    parked_many(resolve, endpoint, 3)
    first = receive(call, endpoint, "slow-agent")
    assert first.json["coordinates"]["eventId"] == "ev-000"
    assert receive(call, endpoint, "agent-2").json["coordinates"]["eventId"] == "ev-001"
    assert receive(call, endpoint, "agent-3").json["coordinates"]["eventId"] == "ev-002"
    assert receive(call, endpoint, "agent-4").status == 204
    # next (NimBus-compatible) still does not claim; it skips hand-offs under a live lease
    assert call("handoff_next", method="GET", route_params={"endpointId": endpoint}).status == 204


def test_an_expired_lease_is_taken_over_and_fences_the_old_holder(call, resolve, broker, clock):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    [flow] = parked_many(resolve, endpoint, 1)
    old = receive(call, endpoint, "agent-a", leaseSeconds="30")
    assert old.status == 200 and old.json["lease"]["leaseSeconds"] == 30
    clock[0] += timedelta(seconds=31)
    new = receive(call, endpoint, "agent-b")
    assert new.status == 200 and new.json["lease"]["token"] != old.json["lease"]["token"]
    # The old holder cannot settle over the new one; the new holder can
    refused = settle_leased(call, flow, old.json["lease"]["token"], "agent-a")
    assert refused.status == 409 and refused.json["type"] == "urn:settle:problem:lease-lost"
    assert broker.delivered == []
    assert settle_leased(call, flow, new.json["lease"]["token"], "agent-b").status == 202
    assert len(broker.delivered) == 1


def test_an_expired_lease_no_one_took_still_settles(call, resolve, broker, clock):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    [flow] = parked_many(resolve, endpoint, 1)
    lease = receive(call, endpoint, "agent-a", leaseSeconds="30").json["lease"]
    clock[0] += timedelta(minutes=5)
    assert settle_leased(call, flow, lease["token"], "agent-a").status == 202


def test_a_renewed_lease_is_not_taken_and_a_released_one_is_received_at_once(call, resolve, broker, clock):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    parked_many(resolve, endpoint, 1)
    lease = receive(call, endpoint, "agent-a", leaseSeconds="30").json["lease"]
    clock[0] += timedelta(seconds=20)
    renewed = lease_call(call, "renew", endpoint, "ev-000", lease["token"], leaseSeconds=30)
    assert renewed.status == 200, renewed.body
    clock[0] += timedelta(seconds=20)  # 40 s after the receive: alive only thanks to the renewal
    assert receive(call, endpoint, "agent-b").status == 204
    released = lease_call(call, "release", endpoint, "ev-000", lease["token"])
    assert released.status == 200, released.body
    again = receive(call, endpoint, "agent-b")
    assert again.status == 200 and again.json["coordinates"]["eventId"] == "ev-000"
    # The first holder's token is dead now
    assert lease_call(call, "renew", endpoint, "ev-000", lease["token"]).status == 409


def test_a_settlement_without_a_lease_keeps_todays_rules(call, resolve, broker, clock):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    [flow] = parked_many(resolve, endpoint, 1)
    receive(call, endpoint, "agent-a")
    assert settle_leased(call, flow, None, "operator-script").status == 202


def test_a_lease_ends_with_the_settlement_renewal_and_release_cannot_free_it(call, resolve, clock):
    # A resolver that lags: the hand-off is claimed (settlement in flight) but still parked
    bus = BrokerTransport(Broker())
    service.use_transport(bus)
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    [flow] = parked_many(resolve, endpoint, 1)
    lease = receive(call, endpoint, "agent-a").json["lease"]
    assert settle_leased(call, flow, lease["token"], "agent-a").status == 202
    assert lease_call(call, "renew", endpoint, "ev-000", lease["token"]).status == 409
    lease_call(call, "release", endpoint, "ev-000", lease["token"])
    clock[0] += timedelta(hours=2)
    assert receive(call, endpoint, "agent-b").status == 204
    # the retry of the leased settlement is answered from its claim
    again = settle_leased(call, flow, lease["token"], "agent-a")
    assert again.status == 202 and again.json["replayed"] is True


def test_a_renewal_between_the_settlements_read_and_its_claim_does_not_lose_the_lease(
    call, resolve, broker, clock, monkeypatch
):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    [flow] = parked_many(resolve, endpoint, 1)
    lease = receive(call, endpoint, "agent-a").json["lease"]
    store = service.store()
    original = store.get_queue_row
    renewed: list[int] = []
    busy: list[bool] = []

    def read_then_renew(*args: Any, **kw: Any) -> Any:
        found = original(*args, **kw)
        if not busy:  # the first read is the settlement's; the renewal reads too
            busy.append(True)
            renewed.append(lease_call(call, "renew", endpoint, "ev-000", lease["token"]).status)
        return found

    monkeypatch.setattr(store, "get_queue_row", read_then_renew)
    answer = settle_leased(call, flow, lease["token"], "agent-a")
    assert renewed == [200]
    assert answer.status == 202, answer.body


@pytest.mark.parametrize("value", ["0", "abc", "100000"])
def test_a_lease_length_out_of_bounds_is_400_naming_it(call, resolve, broker, value):
    answer = receive(call, "Billing-x", leaseSeconds=value)
    assert answer.status == 400 and answer.json["field"] == "leaseSeconds"


def test_long_polls_beyond_the_instances_permits_are_429_with_retry_after(call, broker):
    from handoff.receive.receiver import LONG_POLL_PERMITS, long_polls

    assert LONG_POLL_PERMITS == 20  # NimBus's nimbus-agent-receive limiter
    held = [long_polls.acquire(blocking=False) for _ in range(LONG_POLL_PERMITS)]
    try:
        assert all(held)
        for name in ("handoff_receive", "handoff_next"):
            answer = call(
                name,
                None,
                method="POST" if name == "handoff_receive" else "GET",
                route_params={"endpointId": "Billing-busy"},
                params={"waitSeconds": "5"},
            )
            assert answer.status == 429, answer.body
            assert int(answer.headers["retry-after"]) >= 1
        # A call that does not wait takes no permit
        assert receive(call, "Billing-busy").status == 204
    finally:
        for _ in held:
            long_polls.release()
    assert long_polls.acquire(blocking=False)  # every permit came back
    long_polls.release()


def test_many_agents_racing_never_get_204_while_a_hand_off_is_still_free(call, resolve, broker):
    """204 means "none was free when I looked": never while a hand-off stays unleased throughout the call.

    Many agents on threads race ``receive`` (``waitSeconds=0``) on one backlog and hold every lease (no
    settlement, no expiry: a leased hand-off stays leased). An agent that gets 204 notes when its call ended
    and keeps going until the backlog is gone. A hand-off whose receiving call *started* after a 204 *ended*
    was free during the whole 204 call (its lease write came later), so that 204 was a lie.
    """
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    backlog, agents = 120, 24
    parked_many(resolve, endpoint, backlog)
    started: dict[str, float] = {}  # event id -> when the call that leased it started
    empties: list[tuple[str, float]] = []  # (agent, when its 204 call ended)
    lock = threading.Lock()
    barrier = threading.Barrier(agents)
    deadline = time.monotonic() + 240

    def agent(name: str) -> None:
        barrier.wait(30)
        while time.monotonic() < deadline:
            with lock:
                if len(started) == backlog:
                    return
            began = time.monotonic()
            answer = receive(call, endpoint, name, waitSeconds="0")
            ended = time.monotonic()
            with lock:
                if answer.status == 204:
                    empties.append((name, ended))
                    continue
                assert answer.status == 200, answer.body
                event_id = answer.json["coordinates"]["eventId"]
                assert event_id not in started, f"{event_id} leased twice"
                started[event_id] = began

    threads = [threading.Thread(target=agent, args=(f"agent-{i:02d}",)) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(started) == backlog  # every hand-off leased once
    lies = [(who, sum(1 for began in started.values() if began > ended)) for who, ended in empties]
    lies = [(who, free) for who, free in lies if free]
    assert lies == [], f"204 answered while hand-offs were free (agent, how many): {lies[:5]} of {len(lies)}"


def test_a_receive_that_keeps_losing_to_faster_agents_reads_on_instead_of_answering_204(
    call, resolve, broker, monkeypatch
):
    """The adversary is always faster: right after each of the first eight index reads, other agents lease
    every candidate on the page. A receive that gave up after a fixed number of lost rounds answered 204
    while hand-offs were still free; it must read again (the taken ones are skipped) and lease one."""
    from handoff.receive import receiver as receive_module

    monkeypatch.setattr(receive_module, "_LEASE_CANDIDATES", 3)
    monkeypatch.setattr(receive_module, "_LEASE_CANDIDATES_MAX", 3, raising=False)
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    parked_many(resolve, endpoint, 26)
    leases = service.receive_service()
    store = service.store()
    original = store.queued
    stolen: list[str] = []
    reads: list[int] = []

    def read_then_lose_the_page(*args: Any, **kw: Any) -> Any:
        page = original(*args, **kw)
        reads.append(len(page))
        if len(reads) <= 8:
            now = datetime.now(UTC)
            for entry in page:  # a faster agent leases each candidate before our write
                assert leases._write_lease(endpoint, entry, "thief", now + timedelta(minutes=5), "thief", now)
                stolen.append(entry.event_id)
        return page

    monkeypatch.setattr(store, "queued", read_then_lose_the_page)
    answer = receive(call, endpoint, "slow-agent", waitSeconds="0")
    assert answer.status == 200, answer.body  # two hand-offs were still free
    assert len(stolen) == 24 and len(set(stolen)) == 24
    assert answer.json["coordinates"]["eventId"] not in stolen
    assert reads == [3] * 8 + [2]  # one page per read, never a scan


def test_a_page_of_index_rows_whose_events_moved_on_is_204_not_an_endless_loop(
    call, resolve, broker, monkeypatch
):
    """Reading again is only worth it when faster agents took the candidates. Index rows whose events no
    longer wait for an agent (an orphan left by a bug or a hand edit) stay put: a receive that re-read them
    would never answer. It answers 204 after one read."""
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    parked_many(resolve, endpoint, 3)
    store = service.store()
    reads: list[int] = []
    original = store.queued

    def counted(*args: Any, **kw: Any) -> Any:
        reads.append(1)
        assert len(reads) < 20, "receive kept re-reading the same stale index rows"
        return original(*args, **kw)

    monkeypatch.setattr(store, "queued", counted)
    monkeypatch.setattr(store, "get_event", lambda *a, **k: None)  # every event has moved on
    answer = receive(call, endpoint, "agent-1", waitSeconds="0")
    assert answer.status == 204, answer.body
    assert len(reads) == 1


class ShortFirstPages(HTTPPolicy):  # type: ignore[type-arg]
    """Answers a filtered query's first page as Azure may: empty, with a continuation token that points at
    the rows it held (a filter that passed over many rows, or a query that hit its time limit). The next
    page, asked for with that token, is storage's own answer."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker
        self.shortened = 0

    def send(self, request: Any) -> Any:
        response = self.next.send(request)
        http = request.http_request
        url = urllib.parse.unquote(http.url)
        if http.method != "GET" or self.marker not in url or "NextRowKey" in url:
            return response
        body = json.loads(response.http_response.text() or "{}")
        rows = body.get("value") or []
        if not rows:
            return response
        self.shortened += 1
        raw = requests.Response()
        raw.status_code = 200
        raw.headers.update(
            {k: v for k, v in response.http_response.headers.items() if k.lower() != "content-length"}
        )
        # a keys-only query may not select PartitionKey: it is the one its filter names
        partition = rows[0].get("PartitionKey") or url.split("PartitionKey eq '", 1)[1].split("'", 1)[0]
        raw.headers["x-ms-continuation-NextPartitionKey"] = partition
        raw.headers["x-ms-continuation-NextRowKey"] = rows[0]["RowKey"]
        raw._content = json.dumps({**body, "value": []}).encode()
        raw.url = http.url
        return PipelineResponse(http, RequestsTransportResponse(http, raw), request.context)


def test_an_empty_first_page_with_a_continuation_token_is_not_read_as_no_hand_off(call, resolve, broker):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    parked_many(resolve, endpoint, 3)
    short = ShortFirstPages(marker="ClaimedUntil lt")
    runtime.reset(policies=[short])
    try:
        answer = receive(call, endpoint, "agent-1", waitSeconds="0")
        assert short.shortened >= 1  # the receive did meet a short page
        assert answer.status == 200, answer.body
        assert answer.json["coordinates"]["eventId"] == "ev-000"  # still the oldest
        listed = call("handoff_next", method="GET", route_params={"endpointId": endpoint})
        assert listed.status == 200, listed.body  # next reads the same index the same way
    finally:
        runtime.reset()


def test_the_oldest_pending_age_survives_an_empty_first_page_with_a_continuation_token(call, resolve, broker):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    parked_many(resolve, endpoint, 3)
    expected = service.overview().open_events(endpoint)
    assert expected.oldest_pending_at is not None and expected.totals["PendingHandoff"] == 3
    short = ShortFirstPages(marker="RowKey ge 'sd|Pending|'")
    runtime.reset(policies=[short])
    try:
        assert service.overview().open_events(endpoint) == expected
        assert short.shortened >= 1
    finally:
        runtime.reset()
