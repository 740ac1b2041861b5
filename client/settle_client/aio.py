"""The asyncio client: the surface of :class:`~settle_client.SettleClient` with ``await``."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, Unpack

import httpx

from settle_client import _idempotent
from settle_client._calls import Call
from settle_client._core import ClientCore, ClientSettings, Retry
from settle_client.errors import AlreadyProcessed, LockHeld, SettleError
from settle_client.handoffs import AsyncEvents, AsyncHandoffs
from settle_client.models import Key, KeyLike, LockResult, MetadataLike
from settle_client.operator import AsyncOperator
from settle_client.processing import Block, Item, Keeping, Release, refusal, release_call

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class AsyncSettleClient(ClientCore):
    """The asyncio twin of :class:`~settle_client.SettleClient` (same arguments; ``transport`` is an
    ``httpx.AsyncBaseTransport``; ``credential`` may be azure-core's async ``TokenCredential``).
    Close it with :meth:`aclose` or ``async with``."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **settings: Unpack[ClientSettings],
    ) -> None:
        super().__init__(base_url, **settings)
        self._http = httpx.AsyncClient(transport=transport)
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self.handoffs = AsyncHandoffs(self)
        self.events = AsyncEvents(self)
        self.operator = AsyncOperator(self)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSettleClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def send(self, call: Call[T]) -> T:
        """Send ``call``, retrying as far as its safety allows; its result or a typed error."""
        exchange = self.exchange(call)
        while True:
            request = exchange.request(await self.auth.aheaders())
            try:
                response = await self._http.send(request)
            except httpx.TransportError as exc:
                outcome: T | Retry = exchange.failed(exc)
            else:
                outcome = exchange.answered(response)
            if not isinstance(outcome, Retry):
                return outcome
            await self._sleep(outcome.delay)

    # -- the pattern ------------------------------------------------------------------------------
    def processing(
        self,
        key: KeyLike,
        *,
        lock_seconds: int | None = None,
        metadata: MetadataLike | None = None,
    ) -> AsyncProcessing:
        """``async with client.processing(key) as item:`` (see :meth:`SettleClient.processing`); the
        lock is extended by a task while the block runs."""
        return AsyncProcessing(
            self, Key.of(key), lock_seconds=self.lock_seconds_for(lock_seconds), metadata=metadata
        )

    def idempotent(
        self,
        key: Callable[..., KeyLike],
        *,
        lock_seconds: int | None = None,
        wait_seconds: float = 0.0,
        payload: Callable[..., Any] | None = None,
        pass_previous: bool = False,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
        """:meth:`SettleClient.idempotent` for ``async def`` functions."""

        def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError("AsyncSettleClient.idempotent decorates async functions")
            returns = _idempotent.declared(fn)
            if pass_previous:
                _idempotent.check_takes_previous(fn)

            @functools.wraps(fn)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                parsed = Key.of(key(*args, **kwargs))
                digest = _idempotent.payload_hash(payload, args, kwargs)
                waiting = _idempotent.Waiting(wait_seconds)
                while True:
                    try:
                        async with self.processing(parsed, lock_seconds=lock_seconds) as item:
                            arguments = _idempotent.arguments(kwargs, item, pass_previous=pass_previous)
                            result = await fn(*args, **arguments)
                            _idempotent.remember(item, result, digest)
                        return result
                    except AlreadyProcessed as refused:
                        stored = await self.get(parsed)
                        return _idempotent.replayed(stored, refused, parsed, digest, returns)  # type: ignore[no-any-return]
                    except LockHeld:
                        pause = waiting.pause()
                        if pause is None:
                            raise
                    await self._sleep(pause)

            return wrapper

        return decorate


class AsyncProcessing(Block["AsyncSettleClient", "_AsyncKeeper"]):
    """The async context manager of :meth:`AsyncSettleClient.processing`."""

    async def __aenter__(self) -> Item:
        if self._item is not None:
            raise RuntimeError("a processing block can be entered once")
        started = time.monotonic()
        asking = asyncio.ensure_future(self._client.lock(self._key, lock_seconds=self._lock_seconds))
        try:
            # Shielded: cancelled while the lock is asked for (SIGTERM cancelling the task), the server
            # may already have granted it; the answer is awaited and a granted lock handed back.
            lock = await asyncio.shield(asking)
        except asyncio.CancelledError as cancelled:
            await self._hand_back(asking, cancelled, started)
            raise
        if not lock.acquired:
            raise refusal(lock)
        self._item = Item(self._key, lock, metadata=self._metadata, expires_at=started + self._lock_seconds)
        if lock.lock_token is not None:
            self._keeper = _AsyncKeeper(self._client, self._item, self._lock_seconds, started)
        return self._item

    async def _hand_back(
        self, asking: asyncio.Future[LockResult], cancelled: BaseException, started: float
    ) -> None:
        """The task was cancelled while entering: release the lock if the server granted it (as a block
        that raised does), so the item is not left Processing until the lock expires."""
        try:
            lock = await asyncio.shield(asking)
            if not lock.acquired or lock.lock_token is None:
                return
            item = Item(self._key, lock, metadata=self._metadata, expires_at=started + self._lock_seconds)
            await asyncio.shield(self._client.send(release_call(self._client.requests, item, cancelled)))
        except asyncio.CancelledError:  # cancelled again: stop waiting (the lock expires as after a crash)
            cancelled.add_note("settle-client: cancelled again while handing back the lock; not released.")
        except Exception as error:  # the cancellation goes on either way
            cancelled.add_note(f"settle-client: handing back the lock after cancellation failed: {error}")

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        item = self._item
        assert item is not None
        if self._keeper is not None:
            await self._keeper.stop()
        client = self._client
        steps = self._leaving(item, exc)
        while (step := steps.next()) is not None:
            if isinstance(step, float):
                await client._sleep(step)
                continue
            sending: Awaitable[Any] = client.send(step.call if isinstance(step, Release) else step)
            if isinstance(step, Release):  # a cancelled task still releases its lock, then is cancelled
                sending = asyncio.shield(sending)
            try:
                steps.answered(await sending)
            except SettleError as error:
                steps.failed(error)


class _AsyncKeeper:
    """Extends the lock in a task until stopped or the lock is lost."""

    def __init__(self, client: AsyncSettleClient, item: Item, lock_seconds: int, sent_at: float) -> None:
        self._client = client
        self._keeping = Keeping(client.requests, item, lock_seconds, sent_at)
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="settle-lock-keeper")

    async def stop(self) -> None:
        """Stop extending; an extension in flight is cancelled (safe: see ``client._Keeper.stop``)."""
        self._stopping.set()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _sleep_until_due(self) -> bool:
        """Wait until the next extension is due; True when stopped first."""
        timeout = max(0.0, self._keeping.due - time.monotonic())
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=timeout)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        keeping = self._keeping
        while not await self._sleep_until_due():
            try:
                result = await self._client.send(keeping.call())
            except Exception as error:  # unavailable after retries, or the lock lost
                if self._stopping.is_set() or keeping.failed(error):
                    return
                continue
            keeping.answered(result)
