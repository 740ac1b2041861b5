"""``AsyncSettleClient``: the same surface with ``await``, end to end against the development host."""

from __future__ import annotations

import asyncio
import signal
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from settle_client import (
    AlreadyProcessed,
    AsyncSettleClient,
    LockHeld,
    LockLost,
    PayloadMismatch,
    ResultNotStored,
    SettleClient,
)

from tests.client.conftest import park, some, wait_until
from tests.client.worker import start_worker


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_async_processing_three_exits_and_refusals(host, key):
    skipped = {**key, "itemKey": key["itemKey"] + "-s"}
    failed = {**key, "itemKey": key["itemKey"] + "-f"}

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:
            async with client.processing(key) as item:
                item.data = {"posted": True}
            assert some(await client.get(key)).data == {"posted": True}
            assert await client.exists(key)
            with pytest.raises(AlreadyProcessed):
                async with client.processing(key):
                    pytest.fail("ran twice")

            async with client.processing(skipped) as item:
                item.skip("not ours")
            with pytest.raises(ValueError, match="bad row"):
                async with client.processing(failed):
                    raise ValueError("bad row")
            assert some(await client.get(skipped)).status == "Skipped"
            record = some(await client.get(failed))
            assert (record.status, record.error) == ("Failed", "ValueError: bad row")

            versions = [r.status async for r in client.history(key, page_size=1)]
            assert versions == ["Processed", "Superseded"]
            found = [r.item_key async for r in client.query(1, item_entity_key="invoice", page_size=2)]
            assert key["itemKey"] in found

    run(scenario())


def test_async_lock_held_by_another_caller(host, key):
    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as a, AsyncSettleClient(host.base_url) as b:
            held = a.processing(key)
            await held.__aenter__()
            with pytest.raises(LockHeld):
                async with b.processing(key):
                    pytest.fail("two holders")
            await held.__aexit__(None, None, None)

    run(scenario())


def test_async_long_work_is_extended_and_a_lost_lock_raises(host, key):
    lost_key = {**key, "itemKey": key["itemKey"] + "-lost"}

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:
            async with client.processing(key, lock_seconds=4) as item:
                first_until = some(item.locked_until)
                while datetime.now(UTC) <= first_until + timedelta(seconds=1):
                    await asyncio.sleep(0.05)
                assert some(item.locked_until) > first_until and not item.lost
            assert some(await client.get(key)).status == "Processed"

        # A holder whose extensions never reach the server loses the lock to a rival.
        blocked = asyncio.Event()

        async def hold_extensions(request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/lock/extend"):
                await blocked.wait()
            return await inner.handle_async_request(request)

        inner = httpx.AsyncHTTPTransport()
        gate = _AsyncHandler(hold_extensions)
        async with AsyncSettleClient(host.base_url, transport=gate) as holder:
            with SettleClient(host.base_url) as rival:
                with pytest.raises(LockLost):
                    async with holder.processing(lost_key, lock_seconds=1):
                        deadline = asyncio.get_running_loop().time() + 30
                        while not (lock := await asyncio.to_thread(rival.lock, lost_key)).acquired:
                            assert asyncio.get_running_loop().time() < deadline
                            await asyncio.sleep(0.05)
                assert some(rival.get(lost_key)).status == "Processing"
                rival.release(lost_key, "test over", lock_token=lock.lock_token)
        blocked.set()
        await inner.aclose()

    run(scenario())


class _AsyncHandler(httpx.AsyncBaseTransport):
    def __init__(self, handler: Any) -> None:
        self.handler = handler

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = await self.handler(request)
        return response


def test_async_idempotent_runs_once(host, key):
    calls: list[int] = []

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:

            @client.idempotent(key=lambda invoice: {**key, "itemKey": invoice})
            async def post(invoice: str) -> dict[str, Any]:
                calls.append(1)
                return {"posted": invoice}

            assert await post(key["itemKey"]) == {"posted": key["itemKey"]}
            assert await post(key["itemKey"]) == {"posted": key["itemKey"]}

            with pytest.raises(TypeError):
                client.idempotent(key=lambda: key)(lambda: None)  # type: ignore[arg-type,return-value]

    run(scenario())
    assert calls == [1]


def test_async_idempotent_pass_previous_hands_the_function_the_previous_attempt(host, key):
    seen: list[Any] = []

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:

            @client.idempotent(key=lambda invoice: {**key, "itemKey": invoice}, pass_previous=True)
            async def post(invoice: str, previous: Any = None) -> dict[str, Any]:
                seen.append(previous)
                if len(seen) == 1:
                    raise RuntimeError("ERP down")
                return {"posted": invoice}

            with pytest.raises(RuntimeError):
                await post(key["itemKey"])
            assert await post(key["itemKey"]) == {"posted": key["itemKey"]}

    run(scenario())
    assert seen[0] is None
    assert seen[1].error == "RuntimeError: ERP down" and seen[1].lock_expired is False


class Posted(BaseModel):
    ledger_entry: int
    at: datetime
    amount: Decimal


def test_async_idempotent_replays_the_declared_return_type(host, key):
    """As the sync client (tests/client/test_idempotent.py): a model, a Decimal and a datetime are stored as
    pydantic's JSON and a replay returns the declared type, not the stored dict or string."""
    posted = Posted(
        ledger_entry=5, at=datetime(2026, 5, 1, 9, 30, 4, 585000, tzinfo=UTC), amount=Decimal("12.50")
    )
    charges: list[str] = []

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:

            @client.idempotent(key=lambda invoice: {**key, "itemKey": invoice})
            async def post(invoice: str) -> Posted:
                charges.append("post")
                return posted

            @client.idempotent(key=lambda invoice: {**key, "itemKey": invoice + "-d"})
            async def charge(invoice: str) -> Decimal:
                charges.append("charge")
                return Decimal("12.50")

            @client.idempotent(key=lambda invoice: {**key, "itemKey": invoice + "-j"})
            async def stamp(invoice: str) -> dict[str, Any]:
                charges.append("stamp")
                return {"at": datetime(2026, 5, 1, tzinfo=UTC), "amount": Decimal("1.10")}

            invoice = key["itemKey"]
            assert await post(invoice) is posted  # the first call returns the function's own result
            again = await post(invoice)
            assert isinstance(again, Posted) and again == posted
            assert some(await client.get(key)).data["amount"] == "12.50"

            assert await charge(invoice) == Decimal("12.50")
            replayed = await charge(invoice)
            assert isinstance(replayed, Decimal) and replayed == Decimal("12.50")

            assert (await stamp(invoice))["amount"] == Decimal("1.10")
            assert await stamp(invoice) == {"at": "2026-05-01T00:00:00Z", "amount": "1.10"}  # declared: JSON

    run(scenario())
    assert charges == ["post", "charge", "stamp"], "a side effect ran again"


def test_async_idempotent_the_same_key_with_another_payload_raises_payload_mismatch(host, key):
    calls: list[int] = []

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:

            @client.idempotent(key=lambda invoice: {**key, "itemKey": invoice["id"]})
            async def post(invoice: dict[str, Any]) -> dict[str, Any]:
                calls.append(invoice["amount"])
                return {"posted": invoice["amount"]}

            invoice = {"id": key["itemKey"], "amount": 120}
            assert await post(invoice) == {"posted": 120}
            assert await post(dict(invoice)) == {"posted": 120}  # the same payload replays
            with pytest.raises(PayloadMismatch) as mismatch:
                await post({**invoice, "amount": 999})
            assert mismatch.value.stored_hash != mismatch.value.payload_hash
            assert isinstance(mismatch.value, ValueError)

            # payload= picks what must match (here: the amount only)
            @client.idempotent(
                key=lambda invoice: {**key, "itemKey": invoice["id"] + "-p"},
                payload=lambda invoice: invoice["amount"],
            )
            async def by_amount(invoice: dict[str, Any]) -> dict[str, Any]:
                calls.append(invoice["amount"])
                return {"posted": invoice["amount"]}

            assert await by_amount(invoice) == {"posted": 120}
            assert await by_amount({**invoice, "note": "ignored"}) == {"posted": 120}
            with pytest.raises(PayloadMismatch):
                await by_amount({**invoice, "amount": 1})

    run(scenario())
    assert calls == [120, 120], "a mismatched payload ran the function"


@pytest.mark.parametrize("result", [object(), "x" * (600 * 1024)], ids=["not-json", "over-512-KiB"])
def test_async_idempotent_a_result_that_cannot_be_stored_never_reruns_the_side_effect(host, key, result):
    charges: list[int] = []

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:

            @client.idempotent(key=lambda invoice: {**key, "itemKey": invoice})
            async def charge(invoice: str) -> Any:
                charges.append(1)
                return result

            assert await charge(key["itemKey"]) is result  # the first call has its result
            with pytest.raises(ResultNotStored) as replayed:
                await charge(key["itemKey"])
            assert isinstance(replayed.value, AlreadyProcessed)
            record = some(await client.get(key))
            assert record.status == "Processed" and "resultNotStored" in record.data

    run(scenario())
    assert charges == [1], "the side effect ran again"


def test_async_idempotent_a_result_settle_refuses_after_the_side_effect_never_reruns_it(host, key):
    """As tests/client/test_idempotent.py: Settle refuses the result (413) after the side effect; the key
    is recorded Processed without it and the next call raises ResultNotStored."""
    from tests.support.client_results import refuses_the_result, result_refused

    charges: list[int] = []
    inner = httpx.AsyncHTTPTransport()

    async def refuse(request: httpx.Request) -> httpx.Response:
        if refuses_the_result(request):
            return result_refused()
        return await inner.handle_async_request(request)

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url, transport=_AsyncHandler(refuse)) as client:

            @client.idempotent(key=lambda invoice: {**key, "itemKey": invoice})
            async def charge(invoice: str) -> dict[str, Any]:
                charges.append(1)
                return {"charged": 1}

            assert await charge(key["itemKey"]) == {"charged": 1}
            with pytest.raises(ResultNotStored, match="refused"):
                await charge(key["itemKey"])
            record = some(await client.get(key))
            assert record.status == "Processed" and "refused" in record.data["resultNotStored"]
        await inner.aclose()

    run(scenario())
    assert charges == [1], "the side effect ran again"


# -- cancelling the task (the client README's SIGTERM advice) releases the block ---------------------------
# client/README.md, "Signals": "With AsyncSettleClient, cancel the task on SIGTERM
# (loop.add_signal_handler(signal.SIGTERM, task.cancel)): a cancelled block releases its lock", as an
# exception does: Failed with the exception's text, the item free at once (not after lock_seconds), and the
# next item.previous has that error with lock_expired false.


def assert_released_by_cancellation(settle: SettleClient, key: dict[str, Any]) -> None:
    record = some(settle.get(key))
    assert (record.status, record.error) == ("Failed", "CancelledError"), record
    assert [r.status for r in settle.history(key)] == ["Failed", "Superseded"]
    # free now, although the cancelled block's 60 s lock has most of its time left
    with settle.processing(key) as item:
        assert item.takeover is False
        assert item.previous is not None
        assert (item.previous.status, item.previous.error) == ("Failed", "CancelledError")
        assert item.previous.lock_expired is False and item.previous_expired is False


def test_async_a_cancelled_processing_block_releases_its_lock_at_once(host, settle, key):
    async def scenario() -> None:
        inside = asyncio.Event()

        async def work() -> None:
            async with AsyncSettleClient(host.base_url) as client:
                async with client.processing(key, lock_seconds=60):
                    inside.set()
                    await asyncio.Event().wait()  # long work, never done
                pytest.fail("the block ended without the cancellation")

        task = asyncio.create_task(work())
        await asyncio.wait_for(inside.wait(), timeout=30)
        assert some(await asyncio.to_thread(settle.get, key)).status == "Processing"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=30)
        assert task.cancelled()  # the cancellation goes on after the release

    run(scenario())
    assert_released_by_cancellation(settle, key)


def test_async_a_task_cancelled_while_its_lock_is_granted_hands_the_lock_back(host, settle, key):
    """SIGTERM can come at any moment, also while the block is being entered: the server has granted the
    lock and its answer is on the way. The cancelled task waits for that answer and releases the lock, so
    the item is not left Processing for the lock's 60 s."""
    granted, answer_may_go = asyncio.Event(), asyncio.Event()

    async def hold_the_lock_answer(request: httpx.Request) -> httpx.Response:
        response = await inner.handle_async_request(request)
        if request.url.path.endswith("/state/lock"):
            await response.aread()  # applied on the server; the answer waits here
            granted.set()
            await answer_may_go.wait()
        return response

    inner = httpx.AsyncHTTPTransport()

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url, transport=_AsyncHandler(hold_the_lock_answer)) as client:

            async def work() -> None:
                async with client.processing(key, lock_seconds=60):
                    pytest.fail("the block ran although its task was cancelled while entering")

            task = asyncio.create_task(work())
            await asyncio.wait_for(granted.wait(), timeout=30)
            assert some(await asyncio.to_thread(settle.get, key)).status == "Processing"
            task.cancel()  # cancels what the task awaits now: the held answer
            answer_may_go.set()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=30)
        await inner.aclose()

    run(scenario())
    assert_released_by_cancellation(settle, key)


def test_async_sigterm_that_cancels_the_task_releases_the_block(host, settle, key, tmp_path):
    """A real process and signal: the worker installs loop.add_signal_handler(SIGTERM, task.cancel)."""
    state = tmp_path / "state"
    worker = start_worker(host.base_url, key, 60, state, use_async=True)
    try:
        wait_until(lambda: state.exists() and state.read_text().startswith("inside"), what="worker inside")
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert (worker.returncode, out.strip()) == (0, "cancelled"), out + err
    assert_released_by_cancellation(settle, key)


def test_async_agent_loop_settles_and_stops_when_cancelled(host):
    endpoint = f"Billing{uuid.uuid4().hex[:8]}"
    event_id = park(host, endpoint)

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url) as client:
            async for handoff in client.handoffs.watch(endpoint, wait_seconds=2):
                await handoff.complete(result={"ok": True}, settled_by="async-agent")
                break
            event = some(await client.events.get(endpoint, event_id))
            assert [a.auditor_name for a in event.audits] == ["async-agent"]

            # Nothing parked any more: an agent blocked in its long poll stops at once when cancelled.
            async def agent() -> None:
                async for _ in client.handoffs.watch(endpoint, wait_seconds=20):
                    pytest.fail("nothing is parked")

            task = asyncio.create_task(agent())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=10)

    run(scenario())
