"""``watch()`` with leased receive: agents split the work, renew while the handler runs,
release on exception. End to end against the development host (loopback transport: settlements project).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from settle_client import AsyncSettleClient, LeaseLost, SettleClient

from tests.client.conftest import FAST_RETRY, park, some, wait_until


@pytest.fixture
def endpoint() -> str:
    return f"Billing{uuid.uuid4().hex[:8]}"


class Recording(httpx.BaseTransport):
    """Real HTTP; remembers the paths it sent."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_three_watching_agents_work_each_handoff_once(host, endpoint):
    parked = {park(host, endpoint) for _ in range(9)}
    worked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def agent(name: str) -> None:
        with SettleClient(host.base_url, retry=FAST_RETRY) as client:
            for handoff in client.handoffs.watch(endpoint, wait_seconds=1, stop=stop):
                with lock:
                    worked.append(handoff.coordinates.event_id)
                handoff.complete(result={"by": name}, settled_by=name)
                with lock:
                    if len(worked) >= len(parked):
                        stop.set()

    threads = [threading.Thread(target=agent, args=(f"agent-{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(worked) == sorted(parked)  # no hand-off worked twice, none left


def test_the_lease_is_renewed_while_the_handler_runs_and_no_one_else_gets_it(host, endpoint):
    event_id = park(host, endpoint)
    recording = Recording()
    with (
        SettleClient(host.base_url, transport=recording, retry=FAST_RETRY) as client,
        SettleClient(host.base_url, retry=FAST_RETRY) as other,
    ):
        for handoff in client.handoffs.watch(endpoint, wait_seconds=1, lease_seconds=10):
            assert handoff.lease is not None and handoff.lease.lease_seconds == 10
            first_expiry = handoff.lease.expires_at
            wait_until(lambda: any(p.endswith("/leases/renew") for p in recording.paths), what="a renewal")
            assert other.handoffs.receive(endpoint) is None  # held by this agent
            assert other.handoffs.next(endpoint) is None  # next skips leased hand-offs too
            handoff.complete(result={"ok": True})
            break
        assert some(handoff.lease).expires_at > first_expiry
        event = some(client.events.get(endpoint, event_id))
        assert (event.resolution_status, event.pending_sub_status) == ("Pending", None)


def test_a_handler_that_raises_releases_the_handoff_at_once(host, endpoint):
    event_id = park(host, endpoint)
    with SettleClient(host.base_url, retry=FAST_RETRY) as client:
        with pytest.raises(RuntimeError):
            for _handoff in client.handoffs.watch(endpoint, wait_seconds=1):
                raise RuntimeError("the ERP call failed")
        again = client.handoffs.receive(endpoint)  # no waiting for the lease to run out
        assert again is not None and again.coordinates.event_id == event_id
        again.fail("ERP unavailable")


def test_a_settlement_with_a_lease_another_agent_took_over_is_lease_lost(host, endpoint):
    park(host, endpoint)
    with (
        SettleClient(host.base_url, retry=FAST_RETRY) as a,
        SettleClient(host.base_url, retry=FAST_RETRY) as b,
    ):
        mine = some(a.handoffs.receive(endpoint, lease_seconds=10))
        mine.release()
        theirs = some(b.handoffs.receive(endpoint))
        with pytest.raises(LeaseLost):
            mine.complete(result={"late": True})
        theirs.complete(result={"ok": True})


def test_the_async_client_watches_leased_and_releases_on_exception(host, endpoint):
    event_id = park(host, endpoint)

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:
            with pytest.raises(RuntimeError):
                async for handoff in client.handoffs.watch(endpoint, wait_seconds=1):
                    assert handoff.lease is not None
                    raise RuntimeError("boom")
            async for handoff in client.handoffs.watch(endpoint, wait_seconds=1):
                assert handoff.coordinates.event_id == event_id
                await handoff.complete(result={"ok": True}, settled_by="async-agent")
                break
            event: Any = some(await client.events.get(endpoint, event_id))
            assert [a.auditor_name for a in event.audits] == ["async-agent"]

    asyncio.run(scenario())


class AsyncRecording(httpx.AsyncBaseTransport):
    """Real HTTP for the async client; remembers the paths it sent."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_the_async_client_renews_the_lease_while_a_handler_outlives_it(host, endpoint):
    """A handler that runs longer than its lease (10 s, the shortest): the async watch renews it, so no
    other agent receives the hand-off meanwhile, and the settlement made with the token is accepted."""
    event_id = park(host, endpoint)
    recording = AsyncRecording()

    async def scenario() -> None:
        async with (
            AsyncSettleClient(host.base_url, transport=recording, retry=FAST_RETRY) as client,
            AsyncSettleClient(host.base_url, retry=FAST_RETRY) as other,
        ):
            async for handoff in client.handoffs.watch(endpoint, wait_seconds=1, lease_seconds=10):
                lease = some(handoff.lease)
                assert lease.lease_seconds == 10
                first_expiry = lease.expires_at
                # the handler's work outlives the lease; another agent keeps asking meanwhile
                while datetime.now(UTC) < first_expiry + timedelta(seconds=2):
                    assert await other.handoffs.receive(endpoint) is None, "another agent got it"
                    await asyncio.sleep(0.5)
                accepted = await handoff.complete(result={"ok": True}, settled_by="slow-async-agent")
                assert accepted.control_message_id
                break
            renewals = [p for p in recording.paths if p.endswith("/leases/renew")]
            assert len(renewals) >= 2, recording.paths  # every third of the lease
            assert some(handoff.lease).expires_at > first_expiry + timedelta(seconds=2)
            event: Any = some(await client.events.get(endpoint, event_id))
            assert [a.auditor_name for a in event.audits] == ["slow-async-agent"]

    asyncio.run(scenario())
