"""The synchronous client (httpx); :mod:`settle_client.aio` has the same surface for asyncio."""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, Unpack

import httpx

from settle_client import _idempotent, shutdown
from settle_client._calls import Call
from settle_client._core import ClientCore, ClientSettings, Retry
from settle_client.errors import AlreadyProcessed, LockHeld, SettleError
from settle_client.handoffs import Events, Handoffs
from settle_client.models import Key, KeyLike, MetadataLike
from settle_client.operator import Operator
from settle_client.processing import Block, Item, Keeping, Release, refusal, release_call

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class SettleClient(ClientCore):
    """A Settle client. Create one per process and reuse it (it keeps a connection pool); close it
    with :meth:`close` or use it as a context manager.

    ``base_url``: the function app (default :func:`~settle_client.default_url`: ``SETTLE_URL``, else
    ``http://127.0.0.1:7071``, what ``make run`` serves). Auth: ``function_key`` (sent as
    ``x-functions-key``) or ``credential`` + ``token_scope`` (a bearer token). ``handler``: the handler
    of every state call (``"built-in"``, ``"null"`` or ``{"key": ..., "options": {...}}``). ``timeout``:
    seconds per request (a long poll adds its wait). ``retry``: see :class:`RetryPolicy`. ``agent_id``:
    sent as ``x-agent-id``, the default ``settledBy`` of settlements. ``transport``: an httpx transport
    (proxies, tests). ``handle_sigterm``: release open processing blocks on SIGTERM, then stop (see
    :mod:`settle_client.shutdown`; only where nothing else handles SIGTERM).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        handle_sigterm: bool = True,
        **settings: Unpack[ClientSettings],
    ) -> None:
        super().__init__(base_url, **settings)
        self._http = httpx.Client(transport=transport)
        self._sleep: Callable[[float], None] = time.sleep
        self.handle_sigterm = handle_sigterm
        if handle_sigterm:
            shutdown.install()  # from the main thread (where clients are usually made): see shutdown.py
        self.handoffs = Handoffs(self)
        self.events = Events(self)
        self.operator = Operator(self)

    # -- lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SettleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sending ----------------------------------------------------------------------------------
    def send(self, call: Call[T]) -> T:
        """Send ``call``, retrying as far as its safety allows; its result or a typed error."""
        exchange = self.exchange(call)
        while True:
            request = exchange.request(self.auth.headers())
            try:
                response = self._http.send(request)
            except httpx.TransportError as exc:
                outcome: T | Retry = exchange.failed(exc)
            else:
                outcome = exchange.answered(response)
            if not isinstance(outcome, Retry):
                return outcome
            self._sleep(outcome.delay)

    # -- the pattern ------------------------------------------------------------------------------
    def processing(
        self,
        key: KeyLike,
        *,
        lock_seconds: int | None = None,
        metadata: MetadataLike | None = None,
    ) -> Processing:
        """``with client.processing(key) as item:`` lock → act → record (see :mod:`settle_client.processing`).

        Raises :class:`AlreadyProcessed` or :class:`LockHeld` on entry when the lock is refused. The lock
        lasts ``lock_seconds`` (default: the client's handler option ``lockSeconds``, else 60) and is
        extended in the background while the block runs.
        """
        return Processing(
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
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Run the decorated function once per key; later calls return the stored result.

        ``key`` gets the call's arguments and returns the key (computed before the function runs, so
        the function mutating its arguments cannot change it). The result is stored as JSON (pydantic's
        dump: models, ``datetime``, ``Decimal``...) and a later call returns it as the function's declared
        return type. A later call with the same key but another payload (all the arguments, or what
        ``payload`` returns from them) raises :class:`PayloadMismatch`. A result that cannot be stored
        never re-runs the function: the key is recorded Processed without it and later calls raise
        :class:`ResultNotStored`. An exception releases the lock as Failed and propagates; the next call
        runs the function again. A call that finds another caller running it raises :class:`LockHeld` at
        once, or with ``wait_seconds`` polls that long for the other caller's result. A Skipped record
        raises :class:`AlreadyProcessed`. ``pass_previous=True`` hands the function ``previous=``, the
        attempt before this lock as ``item.previous`` has it in a ``with`` block (``None`` for a new key;
        ``previous.lock_expired``: that attempt crashed or stopped mid-way, its side effect may be half
        done). See :mod:`settle_client._idempotent`.
        """

        def decorate(fn: Callable[P, R]) -> Callable[P, R]:
            returns = _idempotent.declared(fn)
            if pass_previous:
                _idempotent.check_takes_previous(fn)

            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                parsed = Key.of(key(*args, **kwargs))
                digest = _idempotent.payload_hash(payload, args, kwargs)
                waiting = _idempotent.Waiting(wait_seconds)
                while True:
                    try:
                        with self.processing(parsed, lock_seconds=lock_seconds) as item:
                            arguments = _idempotent.arguments(kwargs, item, pass_previous=pass_previous)
                            result = fn(*args, **arguments)
                            _idempotent.remember(item, result, digest)
                        return result
                    except AlreadyProcessed as refused:
                        stored = self.get(parsed)
                        return _idempotent.replayed(stored, refused, parsed, digest, returns)  # type: ignore[no-any-return]
                    except LockHeld:
                        pause = waiting.pause()
                        if pause is None:
                            raise
                    self._sleep(pause)

            return wrapper

        return decorate


class Processing(Block["SettleClient", "_Keeper"]):
    """The context manager of :meth:`SettleClient.processing`."""

    _lost_note = "settle-client: the lock had been lost or released on shutdown; not released again."

    def __enter__(self) -> Item:
        if self._item is not None:
            raise RuntimeError("a processing block can be entered once")
        started = time.monotonic()
        if self._client.handle_sigterm:
            shutdown.install()
        request_id = uuid.uuid4().hex
        try:
            lock = self._client.lock(self._key, lock_seconds=self._lock_seconds, request_id=request_id)
        except BaseException as stopped:
            if not isinstance(stopped, Exception):  # SIGTERM's Terminated, Ctrl-C: it may have been granted
                self._hand_back(request_id, stopped)
            raise
        if not lock.acquired:
            raise refusal(lock)
        self._item = Item(self._key, lock, metadata=self._metadata, expires_at=started + self._lock_seconds)
        if lock.lock_token is not None:  # the null handler holds no lock to extend
            shutdown.opened(self._client, self._item)
            self._keeper = _Keeper(self._client, self._item, self._lock_seconds, started)
            self._keeper.start()
        return self._item

    def _hand_back(self, request_id: str, stopped: BaseException) -> None:
        """Stopped (SIGTERM, Ctrl-C) while the lock was being asked for: storage may have granted it, and no
        block is open yet for the SIGTERM handler to release. Ask again with the same request id (a granted
        lock is replayed with its token; one never applied is taken now) and release it like a block that
        raised, so the item is not left Processing until the lock expires."""
        try:
            again = self._client.lock(self._key, lock_seconds=self._lock_seconds, request_id=request_id)
            if again.acquired and again.lock_token is not None:
                item = Item(self._key, again, metadata=self._metadata, expires_at=time.monotonic())
                self._client.send(release_call(self._client.requests, item, stopped))
        except Exception as error:  # the stop goes on either way; the lock then expires as after a crash
            stopped.add_note(f"settle-client: handing back the lock after {stopped!s} failed: {error}")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        item = self._item
        assert item is not None
        if self._keeper is not None:
            self._keeper.stop()
        try:
            self._leave(item, exc)
        finally:
            shutdown.closed(item)

    def _leave(self, item: Item, exc: BaseException | None) -> None:
        client = self._client
        steps = self._leaving(item, exc)
        while (step := steps.next()) is not None:
            if isinstance(step, float):
                client._sleep(step)
                continue
            try:
                steps.answered(client.send(step.call if isinstance(step, Release) else step))
            except SettleError as error:
                steps.failed(error)


class _Keeper:
    """Extends the lock in a background thread until stopped or the lock is lost."""

    def __init__(self, client: SettleClient, item: Item, lock_seconds: int, sent_at: float) -> None:
        self._client = client
        self._keeping = Keeping(client.requests, item, lock_seconds, sent_at)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="settle-lock-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop extending. Not waiting for an extension in flight is safe: its lock id is the one the
        outcome is fenced with, so whichever the server applies first, the other still holds or is
        refused (and its answer is ignored)."""
        self._stopping.set()

    def _run(self) -> None:
        keeping = self._keeping
        while not self._stopping.wait(max(0.0, keeping.due - time.monotonic())):
            try:
                result = self._client.send(keeping.call())
            except Exception as error:  # unavailable after retries, or the lock lost
                if self._stopping.is_set() or keeping.failed(error):
                    return
                continue
            if self._stopping.is_set():
                return
            keeping.answered(result)
